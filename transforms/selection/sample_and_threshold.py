"""SampleAndThreshold: Poisson-sample every contribution, release sampled counts >= tau.

Papers 000/003 (Bharadwaj & Cormode), Sec. 3.1 of 003: each contribution is kept with
probability p (``sampling_rate``) independently -- Poisson sampling, never a fixed sample
size (003 Sec. 3.2: a known sample size leaks the suppressed mass) -- and a key whose
sampled count v reaches tau (``threshold``) is released with v. No noise is added.
Privacy is accounted by :mod:`accounting.sample_threshold`.

With l_inf = 1 a key's count c is its number of (user, key) contributions, so sampling each
contribution independently gives the key v ~ Bin(c, p), independently across keys. The
kernel draws exactly that from the aggregated count (``transforms.randomness.samplers.binomial``:
exact geometric jumps between sampled contributions, no float arithmetic on the sampling
path), so the pipeline never has to carry users to this stage. Keys with c < tau cannot reach tau and are
dropped without drawing anything.

Output rows: the key columns, ``count`` (int64, the sampled count v actually released,
>= tau) and ``estimate`` (float64, v / p: an unbiased estimate of the population count
for keys well above tau / p; biased up near the release point because keys are only kept
when v >= tau). True counts never leave the transform.
"""
import numpy as np
import pyarrow as pa

from thresher.transforms.randomness import samplers
from thresher.transforms.selection.release_fn import KernelRelease

OUTPUT_COLUMNS = {"count": pa.int64(), "estimate": pa.float64()}


def sample_and_threshold(counts, *, sampling_rate, threshold, rng):
    """The release rule of sample-and-threshold (paper 003, Sec. 3.1).

    Args:
      counts: int array of per-key contribution counts (users per key, l_inf = 1).
      sampling_rate: p in (0, 1], each contribution's inclusion probability.
      threshold: tau >= 1; keys with sampled count >= tau are released.
      rng: per-key keyed streams (``transforms.randomness.keyed_random``; pipelines) or a seeded numpy
        Generator (tests).

    Returns:
      (keep, sampled_counts): boolean mask over ``counts`` of released keys, and int64
      sampled counts aligned with ``counts`` (meaningful where ``keep``; zero elsewhere,
      so no sub-threshold draw leaks by accident).
    """
    counts = np.asarray(counts)
    if counts.dtype.kind not in "iu":
        raise ValueError(f"counts must be integers, got dtype {counts.dtype}")
    counts = counts.astype(np.int64)
    if (counts < 0).any():
        raise ValueError("counts must be >= 0")
    if not 0 < sampling_rate <= 1:
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
    if isinstance(threshold, bool) or int(threshold) != threshold or threshold < 1:
        raise ValueError(f"threshold must be an integer >= 1, got {threshold}")
    keep = np.zeros(counts.shape, dtype=bool)
    eligible = np.flatnonzero(counts >= threshold)  # c < tau can never reach tau
    sampled = samplers.binomial(samplers.take(rng, eligible), counts[eligible], sampling_rate)
    passed = sampled >= threshold
    keep[eligible[passed]] = True
    values = np.zeros(counts.shape, dtype=np.int64)
    values[eligible[passed]] = sampled[passed]
    return keep, values


def _param(params, name):
    value = params[name] if isinstance(params, dict) else getattr(params, name)
    return value


def release_table(table, params, rng):
    """Apply the kernel to one batch of keys (a pyarrow.Table with key columns and
    ``count``): the released rows, ``count`` replaced by the sampled count and
    ``estimate`` = count / p appended."""
    p = float(_param(params, "sampling_rate"))
    tau = int(_param(params, "threshold"))
    counts = table.column("count").to_numpy(zero_copy_only=False)
    keep, values = sample_and_threshold(counts, sampling_rate=p, threshold=tau, rng=rng)
    sampled = values[keep]
    released = table.filter(pa.array(keep))
    idx = released.schema.get_field_index("count")
    released = released.set_column(idx, "count", pa.array(sampled, type=pa.int64()))
    return released.append_column("estimate", pa.array(sampled / p, type=pa.float64()))


class SampleAndThreshold(KernelRelease):
    """Sample-and-threshold release of batches of per-key counts.

    Input: PCollection[pyarrow.Table] with the key columns and an int64 ``count`` (keys
    unique across the collection, l_inf = 1). Output: PCollection[pyarrow.Table] of the
    released keys with ``count`` the sampled count and ``estimate`` = count / p; empty
    batches are dropped. ``params`` has ``sampling_rate`` and ``threshold`` -- a dict, an
    ``accounting.sample_threshold.SampleThresholdParams``, or a side input
    (``beam.pvalue.AsSingleton``) carrying one.
    ``rng_factory``: its draws (``keyed_random.KeyedDraws``, ``source.child(label)``).
    """

    stage_label = "SampleAndThreshold"
    release_table = staticmethod(release_table)
