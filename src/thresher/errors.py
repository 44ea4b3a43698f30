"""Errors a user can act on. The CLI prints them as one line and exits with code 2."""


class ThresherError(Exception):
    """Base class: an error whose message is complete without a traceback."""

    exit_code = 2


class SpecError(ThresherError):
    """The release spec (or its input) is not valid; ``field`` names where."""

    def __init__(self, field, message):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class CalibrationError(ThresherError):
    """No mechanism parameters meet the privacy budget; the message says what would."""


class InputError(ThresherError):
    """The input data cannot be released as asked (missing column, unreadable file...)."""
