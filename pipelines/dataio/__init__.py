"""Input and publishing: reading records, formats, paths, public key domains, staging, the published file and the exclusive output claim."""
