"""Plumbing: how Arrow batches travel through Beam.

The Arrow IPC coder of ``pyarrow.Table`` elements (``arrow_coder``), the file-backed
shuffle of the in-process runner (``spill``), the column names every batch of records
carries and the Arrow helpers of the shuffles (``tables``), and the key-hash shuffle that
merges partial counts into one row per key (``aggregate.SumCountsPerKey``).

The bottom layer: imports nothing else of ``thresher.transforms`` (numpy, pyarrow, Beam,
``thresher.errors`` only). Draws no randomness.
"""
