"""The name of the construction that draws a release's keyed randomness.

``transforms.randomness.keyed_random`` derives every random word of a release from the release
secret by this construction (its module docstring; docs/privacy_testing.md, "Keyed
randomness"). The release report names it (``randomness.construction``), so an audit can
tell which construction drew a release; a change of the construction that changes any
drawn word takes a new name. No imports: ``thresher plan`` and ``report`` read it
without loading the pipeline's modules.
"""

CONSTRUCTION = "aes256-cbcmac-v1"

DESCRIPTION = ("per-stage keys SHAKE256(secret, stage); per stream group and message "
               "shape an AES-256 key; stream block b of a row = fixed-length CBC-MAC of "
               "its 128-bit identity (user, key text MACed prefix-free, or both) and b")
