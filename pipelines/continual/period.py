"""One period of a continual release: bound, count, noise the tree, select, intervals.

All of it is vectorised (pyarrow kernels, numpy; no Python per row, user or key) over the
period's records and the horizon's state (``pipelines.continual.state``):

1. **Bounding across periods** (``accounting.continual``, "Sensitivity"): the period's
   distinct (user, key) pairs, minus those the user already contributed; each user keeps
   at most C - (keys it already holds) of its new pairs, chosen by a keyed random priority
   per (user, key) (stage ``continual/bound``; smallest first). So each user contributes to
   at most C keys over the whole horizon, each once, at its first period: the user's
   first C distinct keys in period order, random within a period. The choice depends only
   on the user's own records and the secret.
2. **The tree** (binary mechanism): the cumulative count of a key at period P is the number
   of its contributions with first period <= P; the released value adds the noise of the
   nodes of P's decomposition, each N_Z(0, sigma^2) drawn from the keyed randomness by
   (key, node) (stage ``continual/node``, identity: the key's canonical text and the
   node's level and index). The node noise is therefore the same in every period that
   reads the node, and nothing noisy is stored.
3. **Selection**: keys released before stay; a key is added (``first_period`` = P) when its
   noisy cumulative count reaches tau.
4. **Intervals**: ``accounting.continual.count_intervals`` for the law of P's noise.
"""
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thresher.accounting import continual as acc
from thresher.transforms.plumbing.tables import USER_COLUMN, USER_LOW_COLUMN
from thresher.transforms.randomness import keyed_random, samplers

BOUND_STAGE = "continual/bound"
NODE_STAGE = "continual/node"
NODE_COLUMN = "__node"
FIRST_PERIOD = "first_period"
USERS = [USER_COLUMN, USER_LOW_COLUMN]
OUTPUT_COLUMNS = ("count", "count_low", "count_high", FIRST_PERIOD)


def _empty_users(key_schema):
    return pa.schema([pa.field(USER_COLUMN, pa.uint64()), pa.field(USER_LOW_COLUMN, pa.uint64()),
                      *key_schema, pa.field(FIRST_PERIOD, pa.int32())])


def new_contributions(prepared, users_before, key_columns, max_keys_per_user, period, source):
    """Step 1: the table (users, keys, first_period = ``period``) of the pairs counted at
    this period. ``prepared``: the period's records (``__user``, ``__user_lo``, keys);
    ``users_before``: the state's pairs with first_period < period."""
    cols = USERS + list(key_columns)
    pairs = prepared.select(cols).group_by(cols).aggregate([])
    if users_before.num_rows:
        pairs = pairs.join(users_before.select(cols), keys=cols, join_type="left anti")
        held = users_before.group_by(USERS).aggregate([([], "count_all")])
        pairs = pairs.join(held, keys=USERS, join_type="left outer")
        used = pc.fill_null(pairs.column("count_all"), 0).to_numpy(zero_copy_only=False)
        pairs = pairs.drop_columns(["count_all"])
    else:
        used = np.zeros(pairs.num_rows, dtype=np.int64)
    n = pairs.num_rows
    if n == 0:
        return pairs.append_column(FIRST_PERIOD, pa.array([], pa.int32()))
    streams = keyed_random.TableStreams(
        keyed_random.StageKeys(source.stage_key(BOUND_STAGE)), pairs, {"pair": cols})
    priority = samplers.uniform_priorities(streams.rows(np.arange(n), "pair"), n)
    hi = pairs.column(USER_COLUMN).to_numpy()
    lo = pairs.column(USER_LOW_COLUMN).to_numpy()
    order = np.lexsort((priority, lo, hi))
    new_user = np.ones(n, dtype=bool)
    new_user[1:] = (hi[order][1:] != hi[order][:-1]) | (lo[order][1:] != lo[order][:-1])
    position = np.arange(n)
    rank = position - np.maximum.accumulate(np.where(new_user, position, 0))
    keep = np.zeros(n, dtype=bool)
    keep[order] = rank < (int(max_keys_per_user) - np.asarray(used)[order])
    chosen = pairs.filter(pa.array(keep))
    return chosen.append_column(FIRST_PERIOD, pa.array(np.full(chosen.num_rows, period,
                                                               dtype=np.int32)))


def node_noise(keys, key_columns, period, sigma, source):
    """Step 2: int64 sum of the node noises of ``period``'s decomposition for each row of
    ``keys`` (distinct keys)."""
    total = np.zeros(keys.num_rows, dtype=np.int64)
    for node in acc.prefix_nodes(period):
        total += one_node_noise(keys, key_columns, node, sigma, source)
    return total


def one_node_noise(keys, key_columns, node, sigma, source):
    """int64 noise N_Z(0, sigma^2) of node (level, index) for each row of ``keys``, drawn
    by (key, node): the same in every period that reads the node, and independent of
    which other keys are present."""
    n = keys.num_rows
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    level, index = node
    node_id = (int(level) << 40) | int(index)
    table = keys.select(list(key_columns)).append_column(
        NODE_COLUMN, pa.array(np.full(n, node_id, dtype=np.int64)))
    streams = keyed_random.TableStreams(
        keyed_random.StageKeys(source.stage_key(NODE_STAGE)), table,
        {"node": list(key_columns) + [NODE_COLUMN]}, distinct_rows=("node",))
    return np.asarray(samplers.discrete_gaussian(streams.rows(np.arange(n), "node"), sigma, n),
                      dtype=np.int64)


def release(prepared, users_before, released_before, key_columns, calibration, period,
            confidence, source):
    """One period. Returns (released rows, users after, released keys after, figures)."""
    key_columns = list(key_columns)
    added = new_contributions(prepared, users_before, key_columns,
                              calibration.max_keys_per_user, period, source)
    users = pa.concat_tables([users_before, added.cast(users_before.schema)])
    users = users.sort_by([(FIRST_PERIOD, "ascending"), (USER_COLUMN, "ascending"),
                           (USER_LOW_COLUMN, "ascending")]
                          + [(k, "ascending") for k in key_columns])
    counts = users.group_by(key_columns).aggregate([([], "count_all")])
    counts = counts.sort_by([(k, "ascending") for k in key_columns])
    true = counts.column("count_all").to_numpy(zero_copy_only=False).astype(np.int64)
    noisy = true + node_noise(counts, key_columns, period, calibration.sigma, source)
    counts = counts.append_column("noisy", pa.array(noisy))
    crossed = counts.filter(pc.greater_equal(counts.column("noisy"), calibration.threshold))
    new_keys = crossed.select(key_columns)
    if released_before.num_rows:
        new_keys = new_keys.join(released_before.select(key_columns), keys=key_columns,
                                 join_type="left anti")
    new_keys = new_keys.append_column(FIRST_PERIOD, pa.array(
        np.full(new_keys.num_rows, period, dtype=np.int32)))
    released_keys = pa.concat_tables([released_before, new_keys.cast(released_before.schema)])
    released_keys = released_keys.sort_by([(k, "ascending") for k in key_columns])
    rows = released_keys.join(counts.select(key_columns + ["noisy"]), keys=key_columns,
                              join_type="left outer")
    rows = rows.sort_by([(k, "ascending") for k in key_columns])
    values = rows.column("noisy").to_numpy(zero_copy_only=False).astype(np.int64)
    low, high = acc.count_intervals(values, calibration.sigma, period, confidence)
    out = rows.select(key_columns).append_column("count", pa.array(values, pa.int64()))
    out = out.append_column("count_low", pa.array(low, pa.int64()))
    out = out.append_column("count_high", pa.array(high, pa.int64()))
    out = out.append_column(FIRST_PERIOD, rows.column(FIRST_PERIOD).cast(pa.int32()))
    figures = {"released_keys": out.num_rows, "new_keys": new_keys.num_rows}
    return out, users, released_keys, figures


def empty_users(key_schema):
    """The state's pairs before period 1."""
    return _empty_users(key_schema).empty_table()


def empty_released(key_schema):
    return pa.schema([*key_schema, pa.field(FIRST_PERIOD, pa.int32())]).empty_table()
