"""Errors a user can act on (``thresher.errors``), under the name pipelines' modules have
always imported them by. They live in ``thresher.errors`` because transforms raise them
too (an existing sample listing a key twice), and transforms never import pipelines."""
from thresher.errors import CalibrationError, InputError, SpecError, ThresherError

__all__ = ["CalibrationError", "InputError", "SpecError", "ThresherError"]
