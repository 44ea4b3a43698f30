"""Composite Beam PTransforms of thresher, each beside its pure numpy kernel."""
