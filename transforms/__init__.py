"""Composite Beam PTransforms of thresher, each beside its pure numpy kernel, grouped by
concern into six subpackages. From the bottom layer up; a module imports modules of its
own subpackage or of a lower layer, never a higher one (tests/transforms/test_import_graph.py):

1. ``plumbing`` -- the Arrow coder, the file-backed shuffle, the batch columns, the key shuffle;
2. ``randomness`` -- samplers, keyed streams, hashes, user identities, secret commitments;
3. ``bounding`` -- the user-sharded shuffle and per-user contribution bounding;
4. ``selection`` -- which keys are released, with what noise (thresholds, public domains);
5. ``values`` (sums and means beside the count) and ``trees`` (heavy hitters, quantiles),
   side by side: neither imports the other.

Nothing here imports ``thresher.pipelines``; every subpackage's ``__init__`` says what lives
there and what it may import.
"""
