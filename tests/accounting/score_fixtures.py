"""Random bound-score parameters for each score kind, shared by the l1-score tests
(tests/accounting/test_contribution_bound.py) and the key-objective tests
(tests/transforms/bounding/test_keys_objective.py)."""
import numpy as np

from thresher.accounting import contribution_bound as cb

MAX_BOUND = 24
CANDIDATES = (1, 2, 3, 5, 8, 13, 24)


def score_params(kind, seed=0, sigma_low=1.0):
    """Per-candidate parameters for ``cb.make_score`` as each kind's calibration gives
    them (weighted_gaussian through params_by_bound, as the kind builds its score)."""
    rng = np.random.default_rng(seed)
    k = len(CANDIDATES)
    if kind == "laplace_l1":
        return {"epsilon": 1.0, "delta": 1e-5}
    if kind == "laplace_l0":
        return {"epsilon": 0.5, "delta": 1e-6}
    if kind == "gaussian":
        return {"thresholds": list(rng.uniform(2, 40, k)),
                "sigmas": list(rng.uniform(sigma_low, 9, k))}
    if kind == "weighted_sampling":
        return {"params_by_bound": {c: {"threshold": float(t)}
                                    for c, t in zip(CANDIDATES, rng.integers(2, 30, k))}}
    if kind == "weighted_gaussian":   # in user weights: threshold, selection sigma; count's sigma
        return {"params_by_bound": {
            c: {"threshold": float(t), "sigma": float(sel), "count_sigma": float(sd)}
            for c, t, sel, sd in zip(CANDIDATES, rng.uniform(10, 30, k), rng.uniform(0.3, 6, k),
                                     rng.uniform(5, 90, k))}}
    if kind == "sample_and_threshold":
        return {"thresholds": list(rng.integers(1, 15, k).astype(float)),
                "sampling_rates": list(rng.uniform(0.02, 1.0, k))}
    raise ValueError(f"no parameters for score {kind!r} (known: {sorted(cb.SCORE_MODELS)})")
