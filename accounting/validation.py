"""Range checks shared by the calibrated-parameter dataclasses of the thresholding
mechanisms (accounting.gshm.GshmParameters, accounting.laplace_threshold
.LaplaceThresholdParameters). Errors name the field and the allowed range."""
import math


def check_threshold_parameters(*, pre_threshold, threshold, delta, epsilon):
    """pre_threshold an integer >= 1, pre_threshold <= threshold < inf, delta in [0, 1],
    epsilon finite and > 0; raises ValueError otherwise."""
    if int(pre_threshold) != pre_threshold or pre_threshold < 1:
        raise ValueError(f"pre_threshold must be an integer >= 1, got {pre_threshold}")
    if not (math.isfinite(threshold) and threshold >= pre_threshold):
        raise ValueError(f"threshold must be >= pre_threshold ({pre_threshold}), got {threshold}")
    if not (0 <= delta <= 1):
        raise ValueError(f"delta must be in [0, 1], got {delta}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be > 0, got {epsilon}")


def check_calibration_arguments(*, epsilon, delta_target, max_keys_per_user, pre_threshold):
    """The arguments of a thresholded Gaussian calibration (accounting.gshm.calibrate,
    accounting.correlated_gshm.calibrate): epsilon finite and > 0, delta_target in (0, 1),
    max_keys_per_user and pre_threshold integers >= 1; raises ValueError otherwise."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if not (0 < delta_target < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta_target}")
    if int(max_keys_per_user) != max_keys_per_user or max_keys_per_user < 1:
        raise ValueError(f"max_keys_per_user must be an integer >= 1, got {max_keys_per_user}")
    if int(pre_threshold) != pre_threshold or pre_threshold < 1:
        raise ValueError(f"pre_threshold must be an integer >= 1, got {pre_threshold}")
