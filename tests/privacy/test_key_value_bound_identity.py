"""Per-key quantiles' bounding (``transforms.bounding.key_value_bound``) keys its per-user streams
by the user's identity words, never by the grouping code ``exact_users`` puts in
``__user`` when two users of a shard share identity word 0 (that code is a rank among the
shard's users, so it depends on who else is there). Tables are built by hand with the
identity columns, the collision of word 0 made on purpose (in a release it is accidental:
about U^2 / 2^65 for U users, and cannot be crafted without the secret)."""
import pyarrow as pa

from thresher.transforms.randomness import keyed_random
from thresher.transforms.bounding.key_value_bound import bound_key_values
from thresher.transforms.bounding.user_shards import exact_users

SOURCE = keyed_random.KeyedSource(b"test-only secret: key-value bound")


def _table(users):
    cols = {"__user": [], "__user_lo": [], "__key": [], "k": [], "x": []}
    for w0, w1 in users:
        for k in range(4):
            for x in range(5):
                cols["__user"].append(w0)
                cols["__user_lo"].append(w1)
                cols["__key"].append(k)
                cols["k"].append(str(k))
                cols["x"].append(float(x))
    return pa.table({"__user": pa.array(cols["__user"], pa.uint64()),
                     "__user_lo": pa.array(cols["__user_lo"], pa.uint64()),
                     "__key": pa.array(cols["__key"], pa.uint64()),
                     "k": cols["k"], "x": cols["x"]})


def _kept(users, who):
    table = exact_users(_table(users))
    kept = table.take(pa.array(bound_key_values(
        table, ["k"], "x", 2, keyed_random.StageSource(SOURCE, "s/value"),
        keyed_random.StageSource(SOURCE, "s/keys"))))
    high = kept.column("__user_hi" if "__user_hi" in kept.column_names else "__user")
    rows = zip(high.to_pylist(), kept.column("__user_lo").to_pylist(),
               kept.column("k").to_pylist(), kept.column("x").to_pylist())
    return sorted((k, x) for h, lo, k, x in rows if (h, lo) == who)


def test_adding_a_user_changes_no_other_users_kept_values():
    """Deterministic (one fixed secret). With the streams keyed by __user (the rank code)
    v's kept (key, value) set changed in 20 of 20 of these cases."""
    u = (5, 7)                       # a new user whose word 0 sorts first
    for trial in range(20):
        v = (1000 + 10 * trial, 1)
        w = (v[0], 2)                # shares word 0 with v: __user becomes a rank code
        assert _kept([v, w], v) == _kept([v, w, u], v), trial
        assert len(_kept([v, w], v)) == 2      # two keys of four, one value each
