"""Field checks shared by the mechanism kinds."""
from thresher.pipelines.common import declare
from thresher.pipelines.errors import CalibrationError, SpecError
from thresher.pipelines.common.fields import integer, number

# tau of gaussian and laplace (declared for the schema; read by pre_threshold()).
PRE_THRESHOLD_LIMIT = 10**9


def pre_threshold_field(text):
    return declare.integer(low=1, high=PRE_THRESHOLD_LIMIT, description=text, default=1)


def optional_number(section, name, **bounds):
    """A number field of a kind that declares it by description only (checked here)."""
    if section.get(name) is None:
        return None
    return number(section[name], f"mechanism.{name}", **bounds)


def pre_threshold(section):
    """mechanism.pre_threshold (default 1); declared by pre_threshold_field, and checked
    here too for a kind that declares it by description only."""
    return integer(section.get("pre_threshold", 1), "mechanism.pre_threshold", low=1,
                   high=PRE_THRESHOLD_LIMIT)


def calibration(call, what):
    """Run an accounting calibration; its ValueError becomes a CalibrationError that says
    which release could not meet its budget and why."""
    try:
        return call()
    except ValueError as exc:
        if isinstance(exc, SpecError):
            raise
        raise CalibrationError(f"{what}: {exc}") from None


def public_domain_calibration(mech, *, kind, noise, epsilon, delta, max_keys_per_user, model):
    """calibrate() of gaussian / laplace with input.public_keys: every public key is released
    with noise and no threshold (paper 002 Sec. 4, Alg. 1); ``accounting.known_domain``.
    ``kind``: the kind's name (the report's); ``noise``: its PUBLIC_DOMAIN_NOISE."""
    from thresher.accounting import known_domain  # heavy: numpy
    params = calibration(
        lambda: known_domain.calibrate(noise, epsilon, delta, max_keys_per_user, model,
                                       sigma=mech.get("sigma"), scale=mech.get("scale")),
        f"{kind} release over public keys at epsilon={epsilon:g}, delta={delta:g}, "
        f"max_keys_per_user={max_keys_per_user}, model={model}")
    out = {"kind": kind, "public_keys": True}
    if noise == "gaussian":
        out.update(sigma=params.sigma, noise="discrete_gaussian",
                   accounting="public key domain, every key released with noise, no threshold "
                              "(paper 002 Sec. 4, Alg. 1): exact discrete Gaussian accounting of "
                              f"{max_keys_per_user} keys shifted by 1 (composed_shift_delta)",
                   delta_achieved=params.delta_achieved)
    else:
        out.update(scale=params.scale, noise="discrete_laplace", model=model,
                   accounting="public key domain, every key released with noise, no threshold "
                              f"(paper 002 Sec. 4, Alg. 1): discrete Laplace, l1 sensitivity "
                              f"{max_keys_per_user}, pure epsilon-DP (delta 0)",
                   delta_achieved=0.0)
    if mech.get("clamp_negative"):
        out["clamp_negative"] = True
    if mech.get("debias"):
        # Alg. 5's per-user clip on one key: C records (l1), or 1 user-key (l0).
        out["debias"] = {"method": mech["debias"], "num_users": int(mech["num_users"]),
                         "per_user_bound": int(max_keys_per_user) if model == "l1" else 1}
    return out
