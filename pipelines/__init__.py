"""Release specs, the thresher CLI, I/O and the wiring of a release pipeline."""

__version__ = "0.1.0"
