"""NoisyThreshold: noise each key's user count, release it only above a noisy threshold.

Gaussian variant: the Gaussian sparse histogram mechanism (GSHM), paper 004 (Karrer,
Kifer, Wilkins, Zhang), Algorithm 1: drop keys with count c < tau (``pre_threshold``),
add noise v, release c + v when c + v >= tau* (``threshold``). thresher draws integer
(discrete Gaussian) noise and accounts for exactly that distribution
(``accounting.gshm`` with ``noise="discrete_gaussian"``).

Laplace variant: paper 002 (Liu et al.) Algorithm 3 and its l0/l_inf analogue
(``accounting.laplace_threshold``), with discrete Laplace noise.

The kernel :func:`noisy_threshold` works on numpy arrays; :class:`NoisyThreshold`
applies it to batches of aggregated keys (``pyarrow.Table`` with key columns and an
int64 ``count``) in a Beam pipeline.
"""
import numpy as np
import pyarrow as pa

from thresher.transforms import samplers
from thresher.transforms.release_fn import KernelRelease

NOISES = ("gaussian", "laplace")


def noisy_threshold(counts, *, noise, scale, pre_threshold, threshold, rng):
    """Release rule of GSHM (paper 004, Alg. 1) / Laplace thresholding (paper 002, Alg. 3).

    Args:
      counts: int64 array, user counts per key (l_inf = 1, l0 <= C after bounding), or
        record counts per key in the l1 model.
      noise: "gaussian" (discrete Gaussian, sigma = ``scale``) or "laplace" (discrete
        Laplace, P[x] proportional to exp(-|x|/scale)).
      scale: sigma or the Laplace scale b, in users.
      pre_threshold: tau; keys with count < tau are never released (and get no noise).
      threshold: tau*; a key is released when count + noise >= tau*.
      rng: per-key keyed streams (``transforms.keyed_random``; pipelines) or a seeded
        ``numpy.random.Generator`` (tests).

    Returns:
      (keep, values): boolean mask of released keys and the int64 noisy counts
      (meaningful where ``keep``; zero elsewhere so no true count leaks by accident).
    """
    counts = np.asarray(counts, dtype=np.int64)
    if noise not in NOISES:
        raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    eligible = counts >= pre_threshold
    n = int(eligible.sum())
    rows = samplers.take(rng, eligible)     # per-key streams: the eligible keys' own
    if noise == "gaussian":
        draws = samplers.discrete_gaussian(rows, scale, n)
    else:
        draws = samplers.discrete_laplace(rows, scale, n)
    values = np.zeros(len(counts), dtype=np.int64)
    values[eligible] = counts[eligible] + draws
    keep = np.zeros(len(counts), dtype=bool)
    keep[eligible] = values[eligible] >= threshold
    values[~keep] = 0
    return keep, values


_NOISE_NAMES = {"gaussian": "gaussian", "discrete_gaussian": "gaussian",
                "laplace": "laplace", "discrete_laplace": "laplace"}


def kernel_arguments(params):
    """Kernel arguments from a mechanism's parameters: ``noise`` ("gaussian",
    "discrete_gaussian", "laplace" or "discrete_laplace"), ``sigma`` or ``scale``,
    ``pre_threshold``, ``threshold`` (the report's mechanism section has this form)."""
    noise = _NOISE_NAMES[params["noise"]]
    scale = params["sigma"] if noise == "gaussian" else params["scale"]
    return {"noise": noise, "scale": float(scale),
            "pre_threshold": params["pre_threshold"], "threshold": params["threshold"]}


def release_table(table, params, rng):
    """Apply the kernel to one batch of keys: returns the released rows, with ``count``
    replaced by the noisy count."""
    counts = table.column("count").to_numpy(zero_copy_only=False)
    keep, values = noisy_threshold(counts, rng=rng, **kernel_arguments(params))
    released = table.filter(pa.array(keep))
    idx = released.schema.get_field_index("count")
    return released.set_column(idx, "count", pa.array(values[keep], type=pa.int64()))


class NoisyThreshold(KernelRelease):
    """Noise and threshold batches of per-key counts.

    Input: PCollection[pyarrow.Table] with the key columns and an int64 ``count``; keys
    unique across the collection. Output: PCollection[pyarrow.Table] of released keys with
    ``count`` the noisy count. ``params`` is a dict as :func:`kernel_arguments` reads it
    (e.g. a release report's ``mechanism`` section), or a side input
    (``beam.pvalue.AsSingleton``) carrying one. ``rng_factory`` is for tests only.
    """

    stage_label = "NoiseAndThreshold"
    release_table = staticmethod(release_table)
