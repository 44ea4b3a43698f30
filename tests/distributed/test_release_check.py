"""The release check used by the runner tests accepts a release simulated from the
mechanism's definition and rejects releases that are wrong in the ways a broken runner
path would make them wrong (unbounded counts, lost keys, invented keys, duplicates,
stray files). No pipeline runs here."""
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thresher.transforms.randomness import samplers

from .conftest import ROOT
from .release_check import check_release, expected_counts

DATA = os.path.join(ROOT, "configs", "examples", "data", "quickstart.parquet")
C, SIGMA, TAU_STAR = 8, 14.0, 88


@pytest.fixture(scope="module")
def expected():
    return expected_counts(DATA, "user_id", "word", C)


def _plan_report():
    return {"name": "t", "mechanism": {"kind": "gaussian", "pre_threshold": 1, "sigma": SIGMA,
                                       "threshold": TAU_STAR, "noise": "discrete_gaussian"},
            "bounding": {"max_keys_per_user": C, "model": "l0", "chosen_by": "spec"},
            "intervals": {"confidence": 0.95}}


def _simulate(seed):
    """GSHM by its definition, in numpy: a uniform random C-subset of each user's distinct
    keys, distinct users per key, discrete Gaussian noise, keep counts >= tau*."""
    rng = np.random.default_rng(seed)
    pairs = pq.read_table(DATA, columns=["user_id", "word"]).group_by(["user_id", "word"]).aggregate([])
    users = np.array(pairs.column("user_id").to_pylist(), dtype=object)
    words = np.array(pairs.column("word").to_pylist(), dtype=object)
    order = np.lexsort((rng.random(len(users)), users.astype(str)))
    users, words = users[order], words[order]
    first = np.r_[True, users[1:] != users[:-1]]
    rank = np.arange(len(users)) - np.maximum.accumulate(np.where(first, np.arange(len(users)), 0))
    kept_words, counts = np.unique(words[rank < C].astype(str), return_counts=True)
    noisy = counts + samplers.discrete_gaussian(rng, SIGMA, len(counts))
    keep = noisy >= TAU_STAR
    return dict(zip(kept_words[keep].tolist(), noisy[keep].tolist()))


def _publish(folder, released, extra_files=()):
    os.makedirs(folder, exist_ok=True)
    words = sorted(released)                          # the canonical order: by key
    counts = np.array([released[w] for w in words], dtype=np.int64)
    plan_report = _plan_report()
    # the launcher's post-processing (issue 27): the interval of each released count
    from thresher.pipelines.dataio.intervals import count_interval
    low, high = count_interval(counts, plan_report["mechanism"],
                               1.0 - plan_report["intervals"]["confidence"])
    table = pa.table({"word": pa.array(words, pa.string()), "count": pa.array(counts),
                      "count_low": pa.array(low, pa.int64()),
                      "count_high": pa.array(high, pa.int64())})
    pq.write_table(table, os.path.join(folder, "released.parquet"))
    report = dict(plan_report, released_keys=table.num_rows, outputs=["released.parquet"])
    with open(os.path.join(folder, "release_report.json"), "w", encoding="utf-8") as handle:
        json.dump(report, handle)
    for name in extra_files:
        os.makedirs(os.path.join(folder, name))
    return folder


def test_accepts_simulated_releases(tmp_path, expected):
    # Three seeds; each fails with probability < 5e-6 (release_check docstring).
    for seed in (1, 2, 3):
        released = _simulate(seed)
        got = check_release(_publish(str(tmp_path / str(seed)), released), _plan_report(),
                            DATA, expected=expected)
        assert got == released


def test_rejects_unbounded_counts(tmp_path, expected):
    pairs = pq.read_table(DATA, columns=["user_id", "word"]).group_by(["user_id", "word"]).aggregate([])
    words, n = np.unique(np.array(pairs.column("word").to_pylist(), dtype=str), return_counts=True)
    released = {w: int(c) for w, c in zip(words, n) if c >= TAU_STAR}
    with pytest.raises(AssertionError):
        check_release(_publish(str(tmp_path), released), _plan_report(), DATA, expected=expected)


@pytest.mark.parametrize("damage", ["drop_top_key", "invent_key", "below_threshold",
                                    "stray_folder", "other_report"])
def test_rejects_damaged_release(tmp_path, expected, damage):
    released = _simulate(4)
    extra, report = (), _plan_report()
    if damage == "drop_top_key":
        del released[max(released, key=released.get)]
    elif damage == "invent_key":
        released["no-such-word-in-the-input"] = 500
    elif damage == "below_threshold":
        released[min(released, key=released.get)] = TAU_STAR - 1
    elif damage == "stray_folder":
        extra = ("beam-temp-released-0",)
    folder = _publish(str(tmp_path), released, extra)
    if damage == "other_report":
        report["mechanism"] = dict(report["mechanism"], sigma=SIGMA + 1)
    with pytest.raises(AssertionError):
        check_release(folder, report, DATA, expected=expected)
