"""One module per release mechanism kind; see pipelines/kinds/README in docs/spec.md."""
