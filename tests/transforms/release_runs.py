"""Whole releases under one fixed secret, shared by the tests of the steps before the user
shuffle (tests/transforms/bounding/test_prereduce*.py, test_rand_clip_copies.py) and of
the adaptive rounds that read the shuffle (tests/transforms/selection/
test_adaptive_rounds_sharded.py).

Each of those tests writes records as parquet, a spec around them, runs
``pipelines.running.release.run`` under ``keyed_random.KeyedSource(secret)`` and compares
the published bytes of two runs: with a step and with it removed (:func:`with_and_without`),
or under a whole-user row limit that only the step lets a heavy user pass
(:func:`bounded_not_refused`). Every comparison is exact (no statistics). The records two
files share are here too (:func:`heavy_and_colliding_users`,
:func:`heavy_users_with_amounts`).
"""
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from thresher.errors import ThresherError
from thresher.pipelines import cli
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running import release
from thresher.pipelines.specs import spec as spec_mod
from thresher.transforms.bounding import user_shards
from thresher.transforms.randomness import keyed_random
from tests.privacy.collisions import colliding_pair

PRIVACY = {"epsilon": 1.0, "delta": 1.0e-8}
RELEASED = ("released.parquet",)
RELEASED_AND_REPORT = ("released.parquet", "release_report.json")
HEAVY_ROWS = 3000          # the heavy user h's rows in both record sets below


def release_files(folder, table, secret, name, bounding, mechanism, *, files=RELEASED,
                  row_group_size=1000, public_keys=None, **sections):
    """{file name: bytes} of ``files`` that ``release.run`` publishes for ``table`` (written
    to ``folder``/input.parquet in row groups of ``row_group_size``: several read batches)
    under a spec of keys ``word``, users ``user_id``, the given ``bounding`` and
    ``mechanism`` sections and any other top-level ``sections`` not None (``aggregates``);
    ``public_keys``: the path of an ``input.public_keys`` file. The output folder is
    removed first: the same folder gives the same spec, paths included (the same config
    digest)."""
    data = os.path.join(folder, "input.parquet")
    pq.write_table(table, data, row_group_size=row_group_size)
    source = {"path": data, "format": "parquet", "user": "user_id", "keys": ["word"]}
    if public_keys is not None:
        source["public_keys"] = {"path": public_keys}
    out = os.path.join(folder, "out")
    doc = {"name": name, "input": source, "privacy": PRIVACY, "bounding": bounding,
           "mechanism": mechanism, "output": {"path": out},
           **{k: v for k, v in sections.items() if v is not None}}
    path = os.path.join(folder, "spec.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(doc, handle)
    shutil.rmtree(out, ignore_errors=True)
    release.run(make_plan(spec_mod.load(path)), [],
                rng_factory=keyed_random.KeyedSource(secret))
    found = {}
    for file in files:
        with open(os.path.join(out, file), "rb") as handle:
            found[file] = handle.read()
    return found


def released(*args, **kwargs):
    """The bytes of released.parquet: :func:`release_files` with ``files=RELEASED``."""
    return release_files(*args, files=RELEASED, **kwargs)["released.parquet"]


def most_rows_of_one_user_per_split(monkeypatch):
    """A list that grows, for every table the user shuffle splits, by the most rows one
    user has in the pieces the split hands the shuffle (in memory, ``split_by_shard``;
    spilled, ``tables.ShardSlices``)."""
    seen = []

    def record(pieces):
        # the rows the split hands the shuffle: its pieces (a pre-reduction may mark the
        # rows it keeps rather than filter them, user_shards.KEPT_COLUMN)
        if pieces:
            users = np.concatenate([p.column(user_shards.USER_COLUMN).to_numpy()
                                    for _, p in pieces])
            seen.append(int(np.unique(users, return_counts=True)[1].max()))
        return pieces

    split = user_shards.split_by_shard

    def recording(table, shard_ids, num_shards, **options):
        return iter(record(list(split(table, shard_ids, num_shards, **options))))

    class RecordingSlices(user_shards.ShardSlices):
        def take(self):   # the pieces of one write
            return record(super().take())

    monkeypatch.setattr(user_shards, "split_by_shard", recording)
    monkeypatch.setattr(user_shards, "ShardSlices", RecordingSlices)
    return seen


def without_step(monkeypatch, step="_prereduced", says_if_ran=False):
    """Remove one of release's steps before the user shuffle (``release.<step>``): the
    records pass as read (with ``says_if_ran``, as ``(records, False)``, the return of
    ``_prereduced_heavy``)."""
    if says_if_ran:
        monkeypatch.setattr(release, step, lambda records, plan, rng_factory: (records, False))
    else:
        monkeypatch.setattr(release, step, lambda records, plan, rng_factory: records)


def with_and_without(monkeypatch, run, remove_step):
    """(``run()`` with the step, the most rows of one user per split with it, ``run()``
    after ``remove_step()``, the same per split without it)."""
    seen = most_rows_of_one_user_per_split(monkeypatch)
    with_step = run()
    rows_with = list(seen)
    seen.clear()
    remove_step()
    return with_step, rows_with, run(), seen


def bounded_not_refused(monkeypatch, run, remove_step, limit, refusal):
    """A heavy user passes a whole-user limit of ``limit`` rows with the step: ``run()``
    publishes what the same run publishes without the step and without the limit, while
    without the step the limit refuses it, the error matching ``refusal``. Returns the
    most rows of one user per split with the step and without it (unlimited)."""
    seen = most_rows_of_one_user_per_split(monkeypatch)
    monkeypatch.setattr(release, "MAX_USER_ROWS", limit)
    bounded = run()
    rows_bounded = list(seen)
    remove_step()
    with pytest.raises(ThresherError, match=refusal):
        run()
    monkeypatch.setattr(release, "MAX_USER_ROWS", 1 << 21)
    seen.clear()
    assert run() == bounded
    return rows_bounded, seen


def cli_spec(folder, data, bounding, mechanism, out="out"):
    """The path of a spec written to ``folder`` for the CLI: ``data`` (parquet; users
    ``user_id``, keys ``word``) released to ``folder``/``out``."""
    doc = {"name": "heavy", "input": {"path": data, "format": "parquet", "user": "user_id",
                                      "keys": ["word"]},
           "privacy": PRIVACY, "bounding": bounding, "mechanism": mechanism,
           "output": {"path": os.path.join(folder, out)}}
    path = os.path.join(folder, "spec.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(doc, handle)
    return path


def cli_runs_then_refused(folder, capsys, data, bounding, mechanism, remove_step):
    """``thresher run`` of :func:`cli_spec` exits 0 and publishes; after ``remove_step()``
    the same spec (another output folder) exits 2. Returns that run's stderr."""
    spec = cli_spec(folder, data, bounding, mechanism)
    assert cli.main(["run", spec, "--quiet"]) == 0, capsys.readouterr().err
    assert os.path.exists(os.path.join(folder, "out", "released.parquet"))
    spec = cli_spec(folder, data, bounding, mechanism, out="out2")
    remove_step()
    assert cli.main(["run", spec, "--quiet"]) == 2
    return capsys.readouterr().err


def heavy_user_input(folder, distinct=False, amounts=False):
    """The path of ``folder``/input.parquet (row groups of 5,000): 3,600 users of 5 rows
    over 40 words and a user "heavy" with 2,000 rows on one word (on 2,000 words of its
    own: ``distinct``); with ``amounts``, a column of halves from 0 to 4; rows shuffled."""
    rng = np.random.default_rng(43)
    users = [f"u{u}" for u in range(3600) for _ in range(5)] + ["heavy"] * 2000
    words = [f"w{w}" for w in rng.integers(0, 40, size=18000)] + (
        [f"h{i}" for i in range(2000)] if distinct else ["w1"] * 2000)
    order = rng.permutation(len(users))
    columns = {"user_id": pa.array(users).take(order), "word": pa.array(words).take(order)}
    if amounts:
        columns["amount"] = pa.array(rng.integers(0, 9, size=len(users)) / 2.0)
    path = os.path.join(folder, "input.parquet")
    pq.write_table(pa.table(columns), path, row_group_size=5000)
    return path


def heavy_and_colliding_users(seed=5):
    """400 ordinary users (6 of 30 words each, on 1 or 2 rows), a heavy user h (3,000 rows
    over 1,500 words, some repeated, some the others' words) and a user v holding two
    pairs of keys with equal public hashes among 8 words; amounts in quarters; rows
    shuffled."""
    rng = np.random.default_rng(seed)
    users, words = [], []
    for u in range(400):
        for w in rng.choice(30, size=6, replace=False):
            for _ in range(1 + u % 2):   # odd users hold each of their words twice
                users.append(f"o{u}")
                words.append(f"w{w}")
    for i in range(HEAVY_ROWS):
        users.append("h")
        words.append(f"w{i % 30}" if i % 7 == 0 else f"h{i % 1500}")
    for tag in ("k1", "k2"):
        for word in colliding_pair(tag):
            users.append("v")
            words.append(word)
    for w in range(8):
        users.append("v")
        words.append(f"w{w}")
    order = rng.permutation(len(users))
    amounts = rng.integers(0, 40, size=len(users)) / 4.0
    return pa.table({"user_id": pa.array(users).take(order),
                     "word": pa.array(words).take(order),
                     "amount": pa.array(amounts)})


def heavy_users_with_amounts(seed=43):
    """300 ordinary users (5 of 30 words, 1 to 3 rows each), a heavy user h (3,000 rows:
    2,000 on the word w1, the rest over 200 words of its own), a heavy user g (1,500
    rows on two words: both kept at C = 4, so the first-C cut alone leaves all its rows),
    decimal amounts (two places: their float sums depend on the order and split), 5%
    null; rows shuffled."""
    rng = np.random.default_rng(seed)
    users, words = [], []
    for u in range(300):
        for w in rng.choice(30, size=5, replace=False):
            for _ in range(1 + u % 3):
                users.append(f"o{u}")
                words.append(f"w{w}")
    for i in range(HEAVY_ROWS):
        users.append("h")
        words.append("w1" if i < 2000 else f"h{i % 200}")
    for i in range(1500):   # g: all of its keys are kept (C = 4)
        users.append("g")
        words.append(f"w{2 + i % 2}")
    order = rng.permutation(len(users))
    amounts = np.round(rng.normal(3.0, 2.5, size=len(users)), 2)
    amounts[rng.random(len(users)) < 0.05] = np.nan          # dropped values: null
    return pa.table({"user_id": pa.array(users).take(order),
                     "word": pa.array(words).take(order),
                     "amount": pa.array(amounts, from_pandas=True)})
