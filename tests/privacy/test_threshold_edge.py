"""The threshold's edge (issue 38, part 3): a noisy count EQUAL to the threshold is released,
and every accounting counts that outcome as released.

A peer library under-reported delta because its release rule and its delta formula
disagreed about equality. For every thresholded kind, on a tiny instance (one key, the
user adding one to it, discrete noise), this file computes exactly -- by running the
kind's own kernel once for every value the noise can take and summing the noise's pmf over
the values it releases -- the probability that the key is released, and compares it with
the accounting's term for that event. The kernel's noise sampler is replaced by the list of
all values (so the kernel decides, not a copy of its rule), and the sum runs over the
noise's whole support (the mass left out is < 1e-300). Flipping ``>=`` to ``>`` in a
release rule or in a delta formula breaks the equality (docs/privacy_testing.md,
"Exact-computation mutation tests", records each mutation run). No randomness."""
import json
import math

import numpy as np
import pytest

from thresher.accounting import correlated_gshm, discrete_gaussian as dg, gshm
from thresher.accounting import laplace_threshold, weighted_gaussian as wg
from thresher.accounting import adaptive as ad
from thresher.accounting.sample_threshold import core, pld
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.specs import spec as spec_mod
from thresher.transforms.randomness import samplers

EPS = 1.0


def _plan(kind_mech, bound=1, delta=1e-6, keys=("word",), extra=None):
    data = {"name": "edge", "input": {"path": "unused.parquet", "user": "user",
                                      "keys": list(keys)},
            "privacy": {"epsilon": EPS, "delta": delta},
            "bounding": {"max_keys_per_user": bound}, "mechanism": kind_mech,
            "output": {"path": "unused"}}
    for dotted, value in (extra or {}).items():
        node = data
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    plan = make_plan(spec_mod.parse(json.loads(json.dumps(data))))
    return plan.params_by_bound[bound], plan


class _Fixed:
    """A stand-in for one sampler: its first call returns ``values`` (one per element
    asked for), later calls zeros (a kernel's second draw, e.g. a count's own noise)."""

    def __init__(self, values):
        self.values = np.asarray(values, dtype=np.int64)
        self.calls = 0

    def __call__(self, rng, *args):
        self.calls += 1
        size = args[-1] if not isinstance(args[-1], float) else None
        if self.calls == 1:
            return self.values.copy()
        n = int(np.size(args[0])) if size is None else int(size)
        return np.zeros(n, dtype=np.int64)


def _gaussian_support(sd):
    k = int(math.ceil(38.6 * sd)) + 2
    x = np.arange(-k, k + 1)
    return x, dg.pmf(x, sd)


def _laplace_support(scale):
    k = int(math.ceil(700 * scale)) + 2       # q^k < 1e-300
    x = np.arange(-k, k + 1)
    q = math.exp(-1.0 / scale)
    p = np.exp(-np.abs(x) / scale) * (1 - q) / (1 + q)
    return x, p


# ---------------------------------------------------------------------------------------
# noisy_threshold: gaussian, laplace, correlated.


def _noisy_threshold_release(monkeypatch, noise, scale, tau, threshold, x, p, shared=None):
    from thresher.transforms.selection.noisy_threshold import noisy_threshold
    name = "discrete_laplace" if noise == "laplace" else "discrete_gaussian"
    monkeypatch.setattr(samplers, name, _Fixed(x))
    keep, values = noisy_threshold(np.full(x.size, tau), noise=noise, scale=scale,
                                   pre_threshold=tau, threshold=threshold, rng=None,
                                   shared=shared)
    assert (values[keep] >= threshold).all()
    return float(np.dot(p, keep))


def test_gaussian_edge(monkeypatch):
    params, _ = _plan({"kind": "gaussian"})
    sigma, tau, threshold = params["sigma"], params["pre_threshold"], params["threshold"]
    x, p = _gaussian_support(sigma)
    released = _noisy_threshold_release(monkeypatch, "gaussian", sigma, tau, threshold, x, p)
    term = -math.expm1(gshm.log_beta(sigma, threshold - tau, "discrete_gaussian"))
    assert released == pytest.approx(term, rel=1e-9, abs=0)
    assert params["delta_achieved"] >= released


def test_laplace_edge(monkeypatch):
    params, _ = _plan({"kind": "laplace"})
    scale, tau, threshold = params["scale"], params["pre_threshold"], params["threshold"]
    x, p = _laplace_support(scale)
    released = _noisy_threshold_release(monkeypatch, "laplace", scale, tau, threshold, x, p)
    term = -math.expm1(float(laplace_threshold.log_suppress(scale, threshold - tau)))
    assert released == pytest.approx(term, rel=1e-9, abs=0)
    assert params["delta_achieved"] >= released


def test_correlated_edge(monkeypatch):
    """The shared draw z at every value of its support, the key's own draw at every value
    of its: the release probability of the user's one key (its pair's delta)."""
    params, _ = _plan({"kind": "gaussian", "noise": "correlated"})
    sigma, shared = params["sigma"], params["shared_sigma"]
    tau, threshold = params["pre_threshold"], params["threshold"]
    x, p = _gaussian_support(sigma)
    z, pz = _gaussian_support(shared)
    released = sum(pz_i * _noisy_threshold_release(monkeypatch, "correlated", sigma, tau,
                                                   threshold, x, p, shared=int(z_i))
                   for z_i, pz_i in zip(z, pz) if pz_i > 1e-300)
    term = correlated_gshm.new_keys_release_probability(sigma, shared, threshold - tau, 1)
    assert released == pytest.approx(term, rel=1e-9, abs=0)
    assert params["delta_achieved"] >= released


# ---------------------------------------------------------------------------------------
# weighted_gaussian and adaptive: grid weights, a user with one key has weight q_1 = S.


def test_weighted_gaussian_edge(monkeypatch):
    from thresher.transforms.selection import weighted_threshold as wt
    params, _ = _plan({"kind": "weighted_gaussian"})
    args = wt.kernel_arguments(params)
    sd, threshold = args["sigma_grid"], args["threshold_grid"]
    q1 = wg.grid_weight(1, int(params["scale"]))
    x, p = _gaussian_support(sd)
    monkeypatch.setattr(samplers, "discrete_gaussian", _Fixed(x))
    keep, _ = wt.weighted_threshold(np.ones(x.size, dtype=np.int64), np.full(x.size, q1),
                                    rng=None, **args)
    released = float(np.dot(p, keep))
    term = -math.expm1(float(wg.log_beta_lower(threshold, q1, sd)))
    # the accounting's tail is an upper bound by FLOAT_SLACK (1e-14) at most
    assert released <= term <= released * (1 + 1e-9) + 2 * wg.FLOAT_SLACK


def test_adaptive_edge(monkeypatch):
    _adaptive_round_edge(monkeypatch, _plan({"kind": "adaptive"})[0])


def _adaptive_round_edge(monkeypatch, params):
    from thresher.transforms.selection import adaptive_rounds as ar
    first = params["rounds"][0]
    sd = float(first["sigma"]) * int(params["scale"])
    threshold = int(first["threshold_grid"])
    q1 = wg.grid_weight(1, int(params["scale"]))
    x, p = _gaussian_support(sd)
    monkeypatch.setattr(samplers, "discrete_gaussian", _Fixed(x))
    keep = ar.select_keys(np.full(x.size, q1), sigma_grid=sd, threshold_grid=threshold, rng=None)
    released = float(np.dot(p, keep))
    leak = ad.round_leak(threshold, first["sigma"], 1, int(params["scale"]))
    term = leak / (1 + leak)          # round_leak = p / (1 - p), p = 1 - beta_1
    assert released <= term <= released * (1 + 1e-9) + 2 * wg.FLOAT_SLACK


# ---------------------------------------------------------------------------------------
# Sample-and-threshold kernels: one key whose tau-th user is the one added (k = tau
# against tau - 1: one user alone reaches no threshold above 1). Released exactly when
# all tau are sampled: p^tau, which is that pair's delta (the smaller side never releases).


def _sampled_release(monkeypatch, p_rate, tau):
    from thresher.transforms.selection.sample_and_threshold import sample_and_threshold
    from scipy import stats
    v = np.arange(0, tau + 1)
    monkeypatch.setattr(samplers, "binomial", _Fixed(v))
    keep, values = sample_and_threshold(np.full(v.size, tau), sampling_rate=p_rate,
                                        threshold=tau, rng=None)
    assert (values[keep] >= tau).all()
    return float(np.dot(stats.binom.pmf(v, tau, p_rate), keep))


def _sampled_edge(monkeypatch, p_rate, tau, reported_delta, per_cell_epsilon):
    released = _sampled_release(monkeypatch, p_rate, tau)
    assert released == pytest.approx(p_rate ** tau, rel=1e-12, abs=0)
    add, remove = core.divergences(per_cell_epsilon, p_rate, tau, np.array([tau]))
    assert add[0] == pytest.approx(released, rel=1e-9, abs=0) and remove[0] == 0.0
    assert reported_delta >= released * (1 - 1e-12)
    assert pld.user_delta(per_cell_epsilon, p_rate, tau, 1) >= released * (1 - 1e-12)


def test_sample_and_threshold_edge(monkeypatch):
    params, _ = _plan({"kind": "sample_and_threshold"})
    _sampled_edge(monkeypatch, params["sampling_rate"], params["threshold"],
                  params["delta_achieved"], EPS)


def test_heavy_hitters_trie_edge(monkeypatch):
    """One cell of one prefix level; the trie's reported delta covers it. The spec fixes
    (p, tau) at what the trie calibration returns at (1, 1e-6), C = 1 (0.2537, 14): the
    plan then only checks them (its full calibration takes ~50 s, issue 38 part 2)."""
    params, _ = _plan({"kind": "heavy_hitters", "top_k": 5, "method": "trie",
                       "sampling_rate": 0.2537359278158943, "threshold": 14})
    assert params["method"] == "trie"
    _sampled_edge(monkeypatch, params["sampling_rate"], params["threshold"],
                  params["delta_achieved"], EPS)


def test_heavy_hitters_adaptive_edge(monkeypatch):
    """method: adaptive (the default method's rounds): the first round's rule and leak."""
    _adaptive_round_edge(monkeypatch, _plan({"kind": "heavy_hitters", "top_k": 5,
                                             "method": "adaptive"})[0])


def test_quantiles_key_selection_edge(monkeypatch):
    params, plan = _plan({"kind": "quantiles", "column": "x", "ranks": [0.5],
                          "domain": [0, 100]})
    sel = params["key_selection"]
    stage = next(s for s in plan.budget.stages if s.name == sel["stage"])
    _sampled_edge(monkeypatch, sel["sampling_rate"], sel["threshold"], sel["delta_achieved"],
                  stage.epsilon)


# ---------------------------------------------------------------------------------------
# Public cells: every (key, bucket) cell is released with noise, whatever its count: the
# release probability is 1 with or without the user, so no delta term exists; the one
# comparison is the answer rule "estimated total >= floor" (post-processing), pinned at
# equality here.


def test_public_cells_edge():
    from thresher.transforms.trees import public_cells as pc
    branching, levels = 2, 2
    zero = [np.zeros(branching ** l) for l in range(1, levels + 1)]
    one = [np.array([1.0, 0.0]), np.array([1.0, 0.0, 0.0, 0.0])]
    for hist in (zero, one):                   # without / with the user: always answered
        total = float(pc.consistent_tree(hist, branching)[0].sum())
        values, _ = pc.key_quantiles(hist, [0.5], lo=0.0, hi=1.0, branching=branching,
                                     floor=total)
        assert values[0] is not None           # a total equal to the floor is answered
        values, _ = pc.key_quantiles(hist, [0.5], lo=0.0, hi=1.0, branching=branching,
                                     floor=math.nextafter(total, math.inf))
        assert values[0] is None
    # every cell of a public key exists (count 0) before any user is added: its release
    # does not depend on the user
    import pyarrow as pa
    tables = list(pc.zero_cells(pa.table({"word": ["k"]}), ["word"], branching, levels))
    assert sum(t.num_rows for t in tables) == branching + branching ** 2
