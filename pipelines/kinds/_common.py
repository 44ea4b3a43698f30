"""Field checks shared by the mechanism kinds."""
from pipelines.errors import CalibrationError, SpecError
from pipelines.spec import integer, number


def optional_number(section, name, **bounds):
    if section.get(name) is None:
        return None
    return number(section[name], f"mechanism.{name}", **bounds)


def pre_threshold(section):
    return integer(section.get("pre_threshold", 1), "mechanism.pre_threshold", low=1, high=10**9)


def calibration(call, what):
    """Run an accounting calibration; its ValueError becomes a CalibrationError that says
    which release could not meet its budget and why."""
    try:
        return call()
    except ValueError as exc:
        if isinstance(exc, SpecError):
            raise
        raise CalibrationError(f"{what}: {exc}") from None
