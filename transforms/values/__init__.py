"""Values per key: clamped sums and means beside the released count.

Per-user totals on a fixed-point grid and their noisy release (``aggregate_values``) and
the private choice of the clip bound of ``clip: auto`` (``choose_clip``).

May import every lower layer (plumbing, randomness, bounding, selection: the count beside
the sums is released by selection's kernels); never trees.
"""
