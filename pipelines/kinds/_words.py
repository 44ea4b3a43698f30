"""Shared helpers of the kinds' report and plan words (``Kind.noise_words`` and the other
word hooks of ``pipelines.kinds.base``): how a number is written in them."""


def number(x):
    """A parameter as the words show it: 4 significant digits for a float."""
    return f"{x:.4g}" if isinstance(x, float) else f"{x}"


def threshold_words(mech, key, unit, noise):
    """The sentence of a noisy count released above a threshold (gaussian, laplace):
    ``noise`` names the noise each count got."""
    if mech.get("noise") == "correlated":
        noise += (f" plus one shared discrete Gaussian draw (sigma "
                  f"{number(mech['shared_sigma'])}) common to every {key}: the errors are "
                  f"correlated")
    return (f"noise: each {key}'s count of {unit} gets {noise}; a {key} is released "
            f"when its count is at least {mech.get('pre_threshold', 1)} and its noisy "
            f"count at least {number(mech['threshold'])}")
