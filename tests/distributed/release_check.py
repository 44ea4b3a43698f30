"""An independent check that a published quickstart-style release is a valid one.

Used by every runner test of this folder: whatever runner produced a release, its report
must carry the parameters ``thresher plan`` computes from the spec alone, its folder must
hold exactly the report and the released Parquet, and its keys and counts must be what
the Gaussian sparse histogram mechanism (paper 004, Alg. 1) on l0-bounded data can
produce, up to tail bounds computed here from the raw input with pyarrow/numpy only
(no thresher code on the expected side).

Expected counts. With ``max_keys_per_user`` = C, user u with d_u distinct keys keeps each
of them with probability p_u = min(1, C / d_u) (a uniform random C-subset, paper 004
Sec. 2, paper 002 Sec. 3), so the bounded count B_k of key k is a sum of independent
Bernoulli(p_u) over the users of k: mean E_k = sum p_u, variance V_k = sum p_u (1 - p_u).
(Inclusions of one user in different keys are dependent, but each key's own sum is over
distinct users, which are independent.) The released value is B_k + Z with Z discrete
Gaussian(sigma), which is sigma-sub-Gaussian (Canonne, Kamath & Steinke 2020, Cor. 9).

Tail bounds, each holding with probability >= 1 - ALPHA per key:
- Bernstein (summands centred, |X - EX| <= 1): P(|B - E| >= t) <= 2 exp(-t^2 / (2 (V + t/3))),
  so t1 = L/3 + sqrt((L/3)^2 + 2 V L) with L = ln(2 / ALPHA);
- sub-Gaussian: P(|Z| >= t) <= 2 exp(-t^2 / (2 sigma^2)), so t2 = sigma sqrt(2 L).

Checks (m = t1 + t2): every released key occurs in the input; its count is >= tau* and
within m of E_k; every key with E_k - m >= tau* is released; no key with fewer than
``pre_threshold`` distinct users is released. With ALPHA = 1e-10 and at most 21,863
keys x 2 tails, a correct release fails this check with probability < 5e-6.
"""
import json
import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ALPHA = 1e-10

# Fields of the report that depend on the run (the data or where it was written); every
# other field must equal the plan's.
RUN_FIELDS = ("released_keys", "outputs")


def expected_counts(parquet_path, user, key, max_keys_per_user):
    """Per key: (distinct users, E_k, V_k) of the l0-bounded count, from the raw rows."""
    pairs = pq.read_table(parquet_path, columns=[user, key]).group_by([user, key]).aggregate([])
    users = pairs.column(user).to_numpy(zero_copy_only=False)
    keys = pairs.column(key).to_pylist()
    _, inverse, per_user = np.unique(users, return_inverse=True, return_counts=True)
    p = np.minimum(1.0, max_keys_per_user / per_user[inverse])
    key_ids, key_index = np.unique(np.array(keys, dtype=object), return_inverse=True)
    n = np.bincount(key_index)
    mean = np.bincount(key_index, weights=p)
    var = np.bincount(key_index, weights=p * (1.0 - p))
    return {k: (int(n[i]), float(mean[i]), float(var[i])) for i, k in enumerate(key_ids)}


def tail_margin(variance, sigma, alpha=ALPHA):
    """t1 + t2 of the module docstring: a deviation of B_k + Z from E_k exceeded with
    probability at most 2 * alpha."""
    log_term = math.log(2.0 / alpha)
    t1 = log_term / 3.0 + math.sqrt((log_term / 3.0) ** 2 + 2.0 * variance * log_term)
    t2 = sigma * math.sqrt(2.0 * log_term)
    return t1 + t2


def comparable(report):
    return {k: v for k, v in report.items() if k not in RUN_FIELDS}


def check_release(out_dir, plan_report, input_path, user="user_id", key="word", expected=None):
    """Assert that ``out_dir`` holds a valid Gaussian release of ``input_path``.

    ``plan_report`` is ``make_plan(spec).report()``: the report must equal it outside
    RUN_FIELDS. Returns the released {key: count}."""
    files = sorted(os.listdir(out_dir))
    assert files == ["release_report.json", "released.parquet"], files
    with open(os.path.join(out_dir, "release_report.json"), encoding="utf-8") as handle:
        report = json.load(handle)
    assert comparable(report) == json.loads(json.dumps(comparable(plan_report)))
    mech = report["mechanism"]
    assert mech["kind"] == "gaussian" and mech["noise"] == "discrete_gaussian"
    released = pq.read_table(os.path.join(out_dir, "released.parquet"))
    assert released.schema == pa.schema([(key, pa.string()), ("count", pa.int64()),
                                         ("count_low", pa.int64()), ("count_high", pa.int64())])
    # issue 27: the intervals are the launcher's post-processing of the released counts
    from thresher.pipelines.dataio.intervals import count_interval
    low, high = count_interval(released.column("count").to_numpy(), mech,
                               1.0 - report["intervals"]["confidence"])
    assert (released.column("count_low").to_numpy() == low).all()
    assert (released.column("count_high").to_numpy() == high).all()
    assert report["released_keys"] == released.num_rows
    assert report["outputs"] == ["released.parquet"]   # relative to the output folder
    words = released.column(key).to_pylist()
    assert words == sorted(words), "released rows are not in the canonical (key) order"
    return check_counts(released, report, input_path, user, key, expected)


def check_counts(released, report, input_path, user="user_id", key="word", expected=None):
    """Assert that the released table's keys and counts are what the report's Gaussian
    mechanism can produce from ``input_path`` (module docstring). Returns {key: count}."""
    mech = report["mechanism"]
    words = released.column(key).to_pylist()
    counts = released.column("count").to_pylist()
    assert len(set(words)) == len(words), "a key was released twice"
    got = dict(zip(words, counts))

    bound = report["bounding"]["max_keys_per_user"]
    if expected is None:
        expected = expected_counts(input_path, user, key, bound)
    sigma, tau_star, tau = mech["sigma"], mech["threshold"], mech["pre_threshold"]
    unknown = set(got) - set(expected)
    assert not unknown, f"released keys that are not in the input: {sorted(unknown)[:5]}"
    for word, count in got.items():
        n, mean, var = expected[word]
        assert n >= tau, (word, n, tau)
        assert count >= tau_star, (word, count, tau_star)
        assert abs(count - mean) <= tail_margin(var, sigma), (word, count, mean, var, sigma)
    sure = {w for w, (n, mean, var) in expected.items()
            if n >= tau and mean - tail_margin(var, sigma) >= tau_star}
    missing = sure - set(got)
    assert not missing, f"keys far above the threshold were not released: {sorted(missing)[:5]}"
    assert sure, "the check is vacuous: no key is surely above the threshold"
    return got
