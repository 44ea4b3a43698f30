"""The exact/hash choice of the l0 bound is per user (``per_user_bound.bound_table_l0``).

A user who brings two keys whose 64-bit key hashes collide (crafted with the Thue-Morse
pair of tests/privacy/test_identity.py) is ranked on exact key codes; every other user
keeps the hash ranking. So, under one release secret, the other users' kept keys -- and
the published bytes for keys the added user does not hold -- are the same whether or not
that user is in the data. (Before, one such user switched its whole shard to exact
ranking, which re-drew every other user's kept set from another random source: still a
uniform C-subset per user, so still private, but the coupled bytes changed for others.)
Checked through the three bounding kernels that call ``bound_table_l0`` (PerUserBound's,
WeightedPerUserBound's ``weighted_counts`` and the aggregates' ``bound_with_values``) and
through a real CLI release.
"""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thresher.accounting.aggregates import fixed_point_grid
from thresher.pipelines.dataio import io as pio
from tests.privacy import harness
from tests.privacy.collisions import colliding_pair
from thresher.transforms.randomness import keyed_random
from thresher.transforms.values.aggregate_values import bound_with_values
from thresher.transforms.bounding.per_user_bound import bound_table_l0, users_with_colliding_keys
from thresher.transforms.bounding.user_shards import exact_users
from thresher.transforms.selection.weighted_threshold import WEIGHT_COLUMN, weighted_counts
from thresher.transforms.randomness.user_identity import TEST_KEY

SECRET = b"test-only secret: collision choice"
BOUND = 2


def _others(n_users=40, keys_per_user=6, n_words=12, seed=3):
    """Users o0.. with 6 distinct words each of w0..w11 (C = 2 keeps 2 of them)."""
    rng = np.random.default_rng(seed)
    users, words, amounts = [], [], []
    for u in range(n_users):
        for w in rng.choice(n_words, size=keys_per_user, replace=False):
            users.append(f"o{u}")
            words.append(f"w{w}")
            amounts.append(float(rng.integers(1, 50)))
    return pa.table({"user_id": users, "word": words, "amount": amounts})


def _with_colliding_user(table):
    """D + user v with the colliding keys ka, kb and a word others hold too."""
    ka, kb = colliding_pair("key")
    v = pa.table({"user_id": ["v", "v", "v"], "word": [ka, kb, "w0"],
                  "amount": [5.0, 6.0, 7.0]})
    return pa.concat_tables([table, v]), {ka, kb, "w0"}


def _prepared(table):
    prepared, _ = pio.prepare_batch(table, "user_id", ["word"],
                                    value_columns=[("amount", "__v0")],
                                    identity_key=TEST_KEY)
    return exact_users(prepared)


def _rng():
    return keyed_random.StageSource(keyed_random.KeyedSource(SECRET), "BoundL0")


def _kept_pairs(table):
    """{(user id, word)} that bound_table_l0 keeps (the rows in input order)."""
    kept = bound_table_l0(_prepared(table), ["word"], BOUND, _rng())
    rows = table.take(pa.array(kept))
    return set(zip(rows.column("user_id").to_pylist(), rows.column("word").to_pylist()))


def _by_word(out, columns):
    return {w: tuple(out.column(c)[i].as_py() for c in columns)
            for i, w in enumerate(out.column("word").to_pylist())}


def test_only_the_colliding_user_is_ranked_exactly():
    base = _others()
    added, v_words = _with_colliding_user(base)
    prepared = _prepared(added)
    exact = users_with_colliding_keys(prepared, ["word"])
    users = added.column("user_id").to_pylist()
    assert [u for u, e in zip(users, exact) if e] == ["v", "v", "v"]
    # keys that collide across users only (u1 holds ka, u2 kb) concern no user
    ka, kb = sorted(v_words - {"w0"})
    across = _prepared(pa.table({"user_id": ["u1", "u2"], "word": [ka, kb],
                                 "amount": [1.0, 1.0]}))
    assert not users_with_colliding_keys(across, ["word"]).any()


def test_other_users_keep_the_same_keys_when_a_colliding_user_is_added():
    base = _others()
    added, _ = _with_colliding_user(base)
    before, after = _kept_pairs(base), _kept_pairs(added)
    v_kept = {p for p in after if p[0] == "v"}
    assert len(v_kept) == BOUND                       # v keeps C of its 3 keys, exactly
    assert len(before) == 40 * BOUND
    assert after - v_kept == before


def test_weighted_kernel_counts_are_the_same_for_keys_the_added_user_does_not_hold():
    base = _others()
    added, v_words = _with_colliding_user(base)
    columns = ["count", WEIGHT_COLUMN]
    outs = [_by_word(weighted_counts(_prepared(t), ["word"], BOUND, _rng(), 1024,
                                     count_keys_per_user=1), columns)
            for t in (base, added)]
    others = {w: c for w, c in outs[1].items() if w not in v_words}
    assert others == {w: c for w, c in outs[0].items() if w not in v_words}
    assert len(others) >= 10


def test_aggregates_kernel_is_the_same_for_keys_the_added_user_does_not_hold():
    base = _others()
    added, v_words = _with_colliding_user(base)
    grid = fixed_point_grid(0, 100)
    columns = ["count", "__s0"]
    outs = [_by_word(bound_with_values(_prepared(t), ["word"], [("__v0", grid)], BOUND,
                                       _rng())[0], columns)
            for t in (base, added)]
    others = {w: c for w, c in outs[1].items() if w not in v_words}
    assert others == {w: c for w, c in outs[0].items() if w not in v_words}
    assert len(others) >= 10


@pytest.mark.parametrize("kind,auto", [
    ("gaussian", False), ("weighted_gaussian", False),
    ("gaussian", True)])
def test_released_bytes_are_the_same_when_a_colliding_user_is_added(kind, auto, tmp_path,
                                                                    monkeypatch):
    """The real CLI, one secret, C = 2 of each user's 3 keys (harness.dataset): D and
    D + a user with two colliding words (released nowhere: one user each) publish the
    same released.parquet bytes and the same report."""
    base = harness.dataset(n_users=600)
    ka, kb = colliding_pair("key")
    added = harness.with_user(base, "v", [ka, kb, "v-own"])
    assert users_with_colliding_keys(_prepared(added.select(["user_id", "word", "amount"])),
                                     ["word"]).sum() == 3
    spec = harness.spec_dict(kind=kind, bound=BOUND, auto=auto)
    if auto:       # candidates that bind: each user holds 3 keys
        spec["bounding"]["auto"] = {"candidates": [1, 2]}
    out_a = harness.release(tmp_path / "a", base, spec, monkeypatch)
    out_b = harness.release(tmp_path / "b", added, spec, monkeypatch)
    released = [pq.read_table(f"{out}/released.parquet") for out in (out_a, out_b)]
    assert released[0].num_rows >= 5
    assert not {ka, kb} & set(released[1].column("word").to_pylist())
    for name in ("released.parquet", "release_report.json"):
        with open(f"{out_a}/{name}", "rb") as a, open(f"{out_b}/{name}", "rb") as b:
            assert a.read() == b.read(), name
