"""NoisyThreshold: noise each key's user count, release it only above a noisy threshold.

Gaussian variant: the Gaussian sparse histogram mechanism (GSHM), paper 004 (Karrer,
Kifer, Wilkins, Zhang), Algorithm 1: drop keys with count c < tau (``pre_threshold``),
add noise v, release c + v when c + v >= tau* (``threshold``). thresher draws integer
(discrete Gaussian) noise and accounts for exactly that distribution
(``accounting.gshm`` with ``noise="discrete_gaussian"``).

Laplace variant: paper 002 (Liu et al.) Algorithm 3 and its l0/l_inf analogue
(``accounting.laplace_threshold``), with discrete Laplace noise.

Correlated variant (Lebeda & Retschmeier, FORC 2025; ``accounting.correlated_gshm``): every
eligible key gets its own discrete Gaussian X plus the release's one shared component Z,
drawn once per release by :class:`NoisyThreshold` from the keyed stream whose identity is
the stage alone (the same on every worker and retry; never logged, reported or kept).

The kernel :func:`noisy_threshold` works on numpy arrays; :class:`NoisyThreshold`
applies it to batches of aggregated keys (``pyarrow.Table`` with key columns and an
int64 ``count``) in a Beam pipeline.
"""
import numpy as np
import pyarrow as pa

from thresher.transforms.randomness import samplers
from thresher.transforms.selection.release_fn import KernelRelease

NOISES = ("gaussian", "laplace", "correlated")


def noisy_threshold(counts, *, noise, scale, pre_threshold, threshold, rng, shared=None):
    """Release rule of GSHM (paper 004, Alg. 1) / Laplace thresholding (paper 002, Alg. 3).

    Args:
      counts: int64 array, user counts per key (l_inf = 1, l0 <= C after bounding), or
        record counts per key in the l1 model.
      noise: "gaussian" (discrete Gaussian, sigma = ``scale``), "laplace" (discrete
        Laplace, P[x] proportional to exp(-|x|/scale)) or "correlated" (discrete Gaussian
        plus ``shared``).
      scale: sigma or the Laplace scale b, in users.
      pre_threshold: tau; keys with count < tau are never released (and get no noise).
      threshold: tau*; a key is released when count + noise >= tau*.
      rng: per-key keyed streams (``transforms.randomness.keyed_random``; pipelines) or a seeded
        ``numpy.random.Generator`` (tests).
      shared: noise "correlated" only (required there): the release's shared component Z,
        an integer (or an int64 array, one per key: the audits' many trials at once).

    Returns:
      (keep, values): boolean mask of released keys and the int64 noisy counts
      (meaningful where ``keep``; zero elsewhere so no true count leaks by accident).
    """
    counts = np.asarray(counts, dtype=np.int64)
    if noise not in NOISES:
        raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    if (shared is None) == (noise == "correlated"):
        raise ValueError("shared (the release's shared component) is required with noise "
                         "'correlated' and applies to it only")
    eligible = counts >= pre_threshold
    n = int(eligible.sum())
    rows = samplers.take(rng, eligible)     # per-key streams: the eligible keys' own
    if noise == "laplace":
        draws = samplers.discrete_laplace(rows, scale, n)
    else:
        draws = samplers.discrete_gaussian(rows, scale, n)
    if noise == "correlated":
        offset = np.broadcast_to(np.asarray(shared, dtype=np.int64), counts.shape)
        draws = draws + offset[eligible]
    values = np.zeros(len(counts), dtype=np.int64)
    values[eligible] = counts[eligible] + draws
    keep = np.zeros(len(counts), dtype=bool)
    keep[eligible] = values[eligible] >= threshold
    values[~keep] = 0
    return keep, values


_NOISE_NAMES = {"gaussian": "gaussian", "discrete_gaussian": "gaussian",
                "laplace": "laplace", "discrete_laplace": "laplace",
                "correlated": "correlated"}


def kernel_arguments(params):
    """Kernel arguments from a mechanism's parameters: ``noise`` ("gaussian",
    "discrete_gaussian", "laplace", "discrete_laplace" or "correlated"), ``sigma`` or
    ``scale``, ``pre_threshold``, ``threshold`` (the report's mechanism section has this
    form). The correlated noise's shared component is not here: :func:`shared_component`."""
    noise = _NOISE_NAMES[params["noise"]]
    scale = params["scale"] if noise == "laplace" else params["sigma"]
    return {"noise": noise, "scale": float(scale),
            "pre_threshold": params["pre_threshold"], "threshold": params["threshold"]}


def shared_component(params, rng):
    """The release's shared component Z ~ N_Z(0, shared_sigma^2) for correlated noise (one
    exact draw from ``rng``, the stage's own keyed stream), or None for the other noises."""
    if _NOISE_NAMES[params["noise"]] != "correlated":
        return None
    return int(samplers.discrete_gaussian(rng, float(params["shared_sigma"]), 1)[0])


def release_table(table, params, rng, shared=None):
    """Apply the kernel to one batch of keys: returns the released rows, with ``count``
    replaced by the noisy count. ``shared``: the correlated noise's shared component."""
    counts = table.column("count").to_numpy(zero_copy_only=False)
    keep, values = noisy_threshold(counts, rng=rng, shared=shared, **kernel_arguments(params))
    released = table.filter(pa.array(keep))
    idx = released.schema.get_field_index("count")
    return released.set_column(idx, "count", pa.array(values[keep], type=pa.int64()))


class NoisyThreshold(KernelRelease):
    """Noise and threshold batches of per-key counts.

    Input: PCollection[pyarrow.Table] with the key columns and an int64 ``count``; keys
    unique across the collection. Output: PCollection[pyarrow.Table] of released keys with
    ``count`` the noisy count. ``params`` is a dict as :func:`kernel_arguments` reads it
    (e.g. a release report's ``mechanism`` section), or a side input
    (``beam.pvalue.AsSingleton``) carrying one.
    ``rng_factory``: its draws (``keyed_random.KeyedDraws``, ``source.child(label)``).
    """

    stage_label = "NoiseAndThreshold"
    release_table = staticmethod(release_table)
    shared_component = staticmethod(shared_component)
