"""Users and keys are identified exactly, even when their public hashes collide
(issue 13, item 3). Colliding ids are crafted with Thue-Morse strings: the polynomial hash
of transforms/hashing.py is the same for a length-2048 Thue-Morse word over {a, b} and
its complement, for any odd base mod 2**64, and stays equal under a common prefix or
suffix."""
import numpy as np
import pyarrow as pa
import pytest

from thresher.pipelines.dataio import io as pio
from thresher.transforms.hashing import hash_array
from thresher.transforms.per_user_bound import bound_table_l0
from thresher.transforms.user_shards import USER_ID_COLUMN, exact_user_ids
from tests.robustness.conftest import diagnostics, run_cli, write_parquet, write_spec

_TM = "".join("ab"[bin(i).count("1") % 2] for i in range(2048))
_TM_COMPLEMENT = _TM.translate(str.maketrans("ab", "ba"))


def colliding_pair(tag):
    return f"{tag}:{_TM}", f"{tag}:{_TM_COMPLEMENT}"


def test_crafted_ids_collide_under_the_public_hash():
    """The premise: without exact identity these users would be merged."""
    a, b = colliding_pair("x")
    assert a != b
    h = hash_array(pa.array([a, b]))
    assert h[0] == h[1]


def test_colliding_user_ids_are_two_users_in_their_shard():
    a, b = colliding_pair("u")
    prepared, _ = pio.prepare_batch(
        pa.table({"user_id": [a, b, a, "plain"], "word": ["k1", "k2", "k3", "k1"]}),
        "user_id", ["word"])
    assert prepared.column("__user").to_pylist()[0] == prepared.column("__user").to_pylist()[1]
    exact = exact_user_ids(prepared)
    users = exact.column("__user").to_pylist()
    assert USER_ID_COLUMN not in exact.column_names
    assert users[0] == users[2] and users[0] != users[1] and len(set(users)) == 3


def test_keyed_draws_in_a_colliding_shard_ignore_row_order():
    """In a shard where two ids collide, a user's kept keys under one release secret are
    the same whatever the order of the shard's rows (exact identities are ranks of the
    sorted ids, not the order of first appearance)."""
    from thresher.transforms import keyed_random
    a, b = colliding_pair("c")
    pair = pa.table({"user_id": [a, b], "word": ["p1", "p2"]})
    x = pa.table({"user_id": ["x"] * 6, "word": [f"w{i}" for i in range(6)]})
    source = keyed_random.KeyedSource(b"test-only secret for row order..")

    def kept_words_of_x(table):
        prepared, _ = pio.prepare_batch(table, "user_id", ["word"])
        exact = exact_user_ids(prepared)
        kept = bound_table_l0(exact, ["word"], 2, keyed_random.StageSource(source, "S"))
        words = exact.column("word").take(pa.array(kept)).to_pylist()
        ids = table.column("user_id").take(pa.array(kept)).to_pylist()
        return sorted(w for w, u in zip(words, ids) if u == "x")

    after = kept_words_of_x(pa.concat_tables([pair, x]))
    before = kept_words_of_x(pa.concat_tables([x, pair]))
    assert len(after) == 2
    assert after == before


def test_integer_ids_need_no_exact_column():
    prepared, _ = pio.prepare_batch(
        pa.table({"user_id": pa.array([1, 2**64 - 1, 1], pa.uint64()), "word": ["a", "b", "c"]}),
        "user_id", ["word"])
    assert USER_ID_COLUMN not in prepared.column_names
    users = prepared.column("__user").to_pylist()
    assert users[0] == users[2] != users[1]


def test_cli_counts_colliding_users_as_two(tmp_path):
    """200 pairs of colliding ids, each user with one word of its own and C = 1: every user
    keeps its word, so 400 contributions are kept (a merged pair would keep one)."""
    users, words = [], []
    for i in range(200):
        a, b = colliding_pair(f"p{i}")
        users += [a, b]
        words += [f"wa{i}", f"wb{i}"]
    data = write_parquet(tmp_path / "ids.parquet", pa.table({"user_id": users, "word": words}))
    spec, _ = write_spec(tmp_path, data, max_keys_per_user=1)
    code, _, err = run_cli("run", spec)
    assert code == 0, err
    assert diagnostics(err)["contributions_kept"] == 400


def _colliding_key_table(other_rows_first):
    """User 'v' has two different words whose key hashes collide; user 'o' (other rows)
    comes before or after it."""
    ka, kb = colliding_pair("key")
    v = pa.table({"user_id": ["v", "v"], "word": [ka, kb]})
    others = pa.table({"user_id": [f"o{i}" for i in range(50)], "word": [kb] * 25 + [ka] * 25})
    table = pa.concat_tables([others, v] if other_rows_first else [v, others])
    prepared, _ = pio.prepare_batch(table, "user_id", ["word"])
    return exact_user_ids(prepared), ka


@pytest.mark.parametrize("other_rows_first", [False, True])
def test_colliding_keys_stay_two_keys_and_the_choice_is_uniform(other_rows_first):
    """With C = 1, user v keeps one of its two colliding words, each with probability 1/2
    whatever the order of the other users' rows (the hash once made them one key, kept by
    row position). 400 seeded draws: the share of the first word must be in [0.4, 0.6]
    (4 standard deviations; false failure about 6e-5)."""
    table, ka = _colliding_key_table(other_rows_first)
    words = table.column("word").to_pylist()
    v_rows = [50, 51] if other_rows_first else [0, 1]      # prepare_batch keeps row order
    assert words[v_rows[0]] == ka and words[v_rows[1]] != ka
    first = 0
    for seed in range(400):
        kept = bound_table_l0(table, ["word"], 1, np.random.default_rng(seed))
        kept_v = [i for i in kept if i in v_rows]
        assert len(kept_v) == 1
        # every other user keeps its one word
        assert len(kept) == 51
        first += words[kept_v[0]] == ka
    assert 0.4 <= first / 400 <= 0.6


def test_adaptive_never_outputs_a_key_colliding_with_a_released_one():
    """Adaptive kind (transforms.adaptive_rounds) on the FnApiRunner: 50 users hold K1,
    one victim holds only K2, whose public hash equals K1's. Both rounds' thresholds (10
    users' weight) release K1 and not K2 (the noise is sigma = 1e-3 grid units, so a
    draw of magnitude >= 1 has probability < 1e-100). The count stage must count only
    released keys, matched by value: the output is exactly [(K1, 50)]. Matching the count
    stage's rows on the key hash published (K2, 1), the victim's key."""
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.testing.util import assert_that, equal_to
    from thresher.transforms import adaptive_rounds as ar
    from thresher.transforms.user_shards import ShardByUser
    from tests.kinds.test_weighted_gaussian_kind import _records

    k1, k2 = colliding_pair("key")
    records = _records([(f"u{i}", k1) for i in range(50)] + [("victim", k2)])
    assert len(set(records.column("__key").to_pylist())) == 1      # the premise
    scale = 1024
    params = {"rounds": [{"sigma": 1e-3, "threshold_grid": 10 * scale},
                         {"sigma": 1e-3, "threshold_grid": 10 * scale}],
              "scale": scale, "count_sigma": 1e-3, "count_stage": {"counts_per_user": 4}}

    def rows(table):
        return list(zip(table.column("word").to_pylist(), table.column("count").to_pylist()))

    with beam.Pipeline(runner=FnApiRunner()) as p:
        released = (p | beam.Create([records]) | ShardByUser(3)
                    | ar.AdaptiveRelease(["word"], params, 4, 2, 3,
                                         rng_factory=lambda: np.random.default_rng(1)))
        assert_that(released | beam.FlatMap(rows), equal_to([(k1, 50)]))
