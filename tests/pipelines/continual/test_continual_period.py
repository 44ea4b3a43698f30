"""pipelines.continual.period on small tables: the bounding across periods and the node
noise drawn by (key, node)."""
import numpy as np
import pyarrow as pa

from thresher.pipelines.continual import period as pm
from thresher.transforms.randomness.keyed_random import KeyedSource

SOURCE = KeyedSource(bytes(range(32)))


def _records(users, words):
    return pa.table({"__user": pa.array(users, pa.uint64()),
                     "__user_lo": pa.array([7] * len(users), pa.uint64()),
                     "word": pa.array(words, pa.string())})


def test_each_user_contributes_to_at_most_c_keys_over_the_horizon_once_each():
    c = 3
    schema = pa.schema([pa.field("word", pa.string())])
    users = pm.empty_users(schema)
    # user 1: 2 keys in period 1, then 4 new and 1 old in period 2, then 2 more in 3
    periods = {1: _records([1, 1, 2], ["a", "b", "a"]),
               2: _records([1, 1, 1, 1, 1, 2], ["a", "c", "d", "e", "f", "a"]),
               3: _records([1, 1, 2], ["g", "h", "b"])}
    for t, records in periods.items():
        added = pm.new_contributions(records, users, ["word"], c, t, SOURCE)
        users = pa.concat_tables([users, added.cast(users.schema)])
    rows = users.to_pylist()
    one = [r for r in rows if r["__user"] == 1]
    assert len(one) == c                                   # C keys over the horizon
    assert {r["word"] for r in one if r["first_period"] == 1} == {"a", "b"}   # first keys first
    assert sum(r["first_period"] == 2 for r in one) == 1   # one slot left at period 2
    assert not any(r["first_period"] == 3 for r in one)
    two = sorted((r["word"], r["first_period"]) for r in rows if r["__user"] == 2)
    assert two == [("a", 1), ("b", 3)]                     # a repeated key counts once


def test_a_nodes_noise_is_the_same_in_every_period_that_reads_it():
    keys = pa.table({"word": pa.array([f"k{i}" for i in range(50)])})
    sigma = 9.0
    # periods 2 and 3 share node (1, 0); 3 adds (0, 2): N(3) - N(2) is (0, 2)'s noise alone
    n2 = pm.node_noise(keys, ["word"], 2, sigma, SOURCE)
    n3 = pm.node_noise(keys, ["word"], 3, sigma, SOURCE)
    assert np.array_equal(n3 - n2, pm.one_node_noise(keys, ["word"], (0, 2), sigma, SOURCE))
    # periods 6 and 7 share (2, 0) and (1, 2)
    n6 = pm.node_noise(keys, ["word"], 6, sigma, SOURCE)
    n7 = pm.node_noise(keys, ["word"], 7, sigma, SOURCE)
    assert np.array_equal(n7 - n6, pm.one_node_noise(keys, ["word"], (0, 6), sigma, SOURCE))
    # a key's noise does not depend on the other keys present
    part = keys.slice(10, 5)
    assert np.array_equal(pm.node_noise(part, ["word"], 7, sigma, SOURCE), n7[10:15])
    # different nodes draw different noise
    assert not np.array_equal(pm.one_node_noise(keys, ["word"], (0, 2), sigma, SOURCE),
                              pm.one_node_noise(keys, ["word"], (0, 6), sigma, SOURCE))
