"""Neighbouring datasets through the real CLI, with injected identical randomness.

The claim under test (issue 13): the bytes thresher publishes -- ``released.parquet`` and
``release_report.json`` -- are a function of the released (key, values) set, the spec and
the thresher version only. The harness runs ``thresher run`` (``pipelines.cli.main``, in
process, on Beam's FnApiRunner) on a dataset D and on D plus one user, with:

- the same spec text (relative paths; each run in its own working directory), so the
  report's config hash is the same;
- every CSPRNG replaced by a numpy Generator with the same seed (``secure_random`` is what
  every DoFn calls in ``setup``): randomness is identical *as a stream*; the extra user
  still shifts which draw lands where, so released values may differ -- that is allowed;
- data where every key that can be released is far above its threshold and every other
  key far below it (about 530 users per popular key against thresholds below 100, and
  sample-and-threshold's sampled count 65 +- 8 against its threshold 24: the released key
  set is the same except with probability below 1e-7 per key);
- optionally, shard, read-batch and shuffle-coalescing sizes shrunk so that D and D + one
  user fall on either side of every size boundary of the pipeline (shard count, read
  batches, coalesced shuffle pieces).

``assert_only_values_differ`` then checks that the second release's bytes are exactly the
first release's rows with the second's values, written canonically, and that each report
is exactly what the spec and the private outputs (released key count, chosen bound)
determine.
"""
import contextlib
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from tests.robustness.conftest import run_cli

POPULAR = [f"w{i}" for i in range(5)]   # about 2 * n_users / 5 users each


def dataset(n_users=1333, seed=0, id_prefix="u"):
    """Each user: 2 distinct popular words (hundreds of users each: always released) and one
    word of their own (one user: never released), string user ids."""
    rng = np.random.default_rng(seed)
    users, words = [], []
    for u in range(n_users):
        for w in rng.choice(len(POPULAR), size=2, replace=False):
            users.append(f"{id_prefix}{u}")
            words.append(POPULAR[w])
        users.append(f"{id_prefix}{u}")
        words.append(f"own{u}")
    amounts = rng.gamma(2.0, 10.0, size=len(users))        # a value column for aggregates
    return pa.table({"user_id": pa.array(users), "word": pa.array(words),
                     "amount": pa.array(amounts)})


def first_in_shard_zero_id(table, num_shards=4):
    """A new user id whose public hash sorts first in user shard 0 (before every user of
    ``table``): under the old first-appearance order its keys moved to the file's head."""
    from thresher.transforms.randomness.hashing import hash_array
    from thresher.transforms.bounding.user_shards import user_shard_of
    existing = hash_array(table.column("user_id"))
    low = int(existing[user_shard_of(existing, num_shards) == 0].min())
    for i in range(200000):
        candidate = f"zz{i}"
        h = hash_array(pa.array([candidate]))
        if user_shard_of(h, num_shards)[0] == 0 and int(h[0]) < low:
            return candidate
    raise AssertionError("no id found that sorts first")


def with_user(table, user_id, words):
    extra = pa.table({"user_id": pa.array([user_id] * len(words)), "word": pa.array(words),
                      "amount": pa.array([5.0] * len(words))})
    return pa.concat_tables([table, extra])


def spec_dict(kind="gaussian", bound=3, auto=False, public_keys=False, aggregates=None,
              **mechanism):
    spec = {
        "name": "neighbours",
        "input": {"path": "data.parquet", "user": "user_id", "keys": ["word"]},
        "privacy": {"epsilon": 1.0, "delta": 1e-8},
        "bounding": {"max_keys_per_user": "auto" if auto else bound},
        "mechanism": {"kind": kind, **mechanism},
        "output": {"path": "out"},
    }
    if auto:
        spec["bounding"]["auto"] = {"candidates": [2, 3, 4]}
    if public_keys:
        spec["input"]["public_keys"] = {"path": "domain.csv"}
    if aggregates:
        spec["aggregates"] = aggregates
    return spec


# A public domain in an order of its own (not sorted), with keys no user has.
DOMAIN = ["w2", "zeta", "w4", "w0", "alpha", "w1", "w3", "omega"]


@contextlib.contextmanager
def _cwd(path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def release(folder, table, spec, monkeypatch, *, seed=7, rows_per_shard=None,
            batch_rows=None, coalesce_rows=None, row_group_size=500):
    """Run ``thresher run spec.yaml`` in ``folder`` on ``table``; returns the output folder."""
    from thresher.pipelines.dataio import io as pio
    from thresher.transforms.randomness import samplers
    os.makedirs(folder, exist_ok=True)
    pq.write_table(table, os.path.join(folder, "data.parquet"), row_group_size=row_group_size)
    with open(os.path.join(folder, "domain.csv"), "w", encoding="utf-8") as handle:
        handle.write("word\n" + "\n".join(DOMAIN) + "\n")
    with open(os.path.join(folder, "spec.yaml"), "w", encoding="utf-8") as handle:
        yaml.safe_dump(spec, handle, sort_keys=True)
    monkeypatch.setattr(samplers, "secure_random", lambda: np.random.default_rng(seed))
    # The release secret (transforms.randomness.keyed_random) is drawn per run: both neighbours get
    # the same one, so what differs between their outputs is the data, not the noise.
    from thresher.transforms.randomness import keyed_random
    monkeypatch.setattr(keyed_random, "new_secret",
                        lambda: seed.to_bytes(4, "little") * (keyed_random.SECRET_BYTES // 4))
    if rows_per_shard is not None:
        monkeypatch.setattr(pio, "ROWS_PER_SHARD", rows_per_shard)
    if batch_rows is not None:
        monkeypatch.setattr(pio, "BATCH_ROWS", batch_rows)
    if coalesce_rows is not None:
        from thresher.transforms.bounding import user_shards
        monkeypatch.setattr(user_shards, "COALESCE_ROWS", coalesce_rows)
    with _cwd(folder):
        code, _, err = run_cli("run", "spec.yaml")
    assert code == 0, err
    return os.path.join(folder, "out")


def _read(output):
    with open(os.path.join(output, "released.parquet"), "rb") as handle:
        released = handle.read()
    with open(os.path.join(output, "release_report.json"), "rb") as handle:
        report = handle.read()
    return released, report


def expected_report(folder, published, released_rows):
    """The report the spec, the version and the private outputs determine; the released
    row count comes from the released file, not from the report under test."""
    from thresher.pipelines.dataio import io as pio
    from thresher.pipelines.specs import spec as spec_mod
    from thresher.pipelines.planning.plan import make_plan
    with _cwd(folder):
        plan = make_plan(spec_mod.load("spec.yaml"))
    chosen = (published["bounding"]["max_keys_per_user"]
              if published["bounding"]["chosen_by"] == "exponential_mechanism" else None)
    report = plan.report(chosen_bound=chosen)
    report["released_keys"] = int(released_rows)
    report["outputs"] = ["released.parquet"]
    path = os.path.join(folder, "expected_report.json")
    pio.write_json(path, report)
    with open(path, "rb") as handle:
        return handle.read()


def assert_only_values_differ(out_a, out_b, key_columns=("word",)):
    """The published bytes of two neighbouring releases differ only in released values."""
    from thresher.pipelines.dataio import released_file
    bytes_a, report_a = _read(out_a)
    bytes_b, report_b = _read(out_b)
    table_a = pq.read_table(pa.BufferReader(bytes_a))
    table_b = pq.read_table(pa.BufferReader(bytes_b))
    keys = list(key_columns)
    assert table_a.num_rows > 0, "nothing was released: the comparison would be vacuous"
    assert table_a.select(keys).equals(table_b.select(keys)), (
        "the released keys or their order differ between neighbours")
    values = [c for c in table_b.column_names if c not in keys]
    swapped = pa.table({**{k: table_a.column(k) for k in keys},
                        **{v: table_b.column(v) for v in values}}, schema=table_b.schema)
    assert released_file.serialise(swapped) == bytes_b, (
        "released.parquet is not the first release's rows with the second's values")
    for out, report, rows in ((out_a, report_a, table_a.num_rows),
                              (out_b, report_b, table_b.num_rows)):
        assert report == expected_report(os.path.dirname(out), json.loads(report), rows), (
            f"{out}/release_report.json is not a function of the spec and the private output")
    same_choice = (json.loads(report_a)["bounding"]["max_keys_per_user"]
                   == json.loads(report_b)["bounding"]["max_keys_per_user"])
    if same_choice:
        assert report_a == report_b
