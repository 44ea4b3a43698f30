"""Trees over a key's values or a key's prefixes: heavy hitters and quantiles.

Prefix-tree heavy hitters (``heavy_hitters``), the hierarchical histograms of quantiles
(``quantiles``) and their release (``quantile_release``), and quantiles over a public
cell domain (``public_cells``).

May import every lower layer (plumbing, randomness, bounding, selection); never values.
"""
