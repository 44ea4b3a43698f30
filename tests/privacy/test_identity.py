"""Users and keys are identified exactly, even when their public hashes collide
(issue 13, item 3; issue 25, F1). Colliding ids are crafted with Thue-Morse strings
(tests/privacy/collisions.py). Users are identified by a secret-keyed 128-bit PRF of
their id computed at read time (transforms/randomness/user_identity.py), never by the public hash."""
import os

import numpy as np
import pyarrow as pa
import pytest

from thresher.errors import ThresherError
from thresher.pipelines.dataio import io as pio
from tests.privacy.collisions import colliding_pair
from thresher.transforms.randomness import keyed_random, user_identity
from thresher.transforms.randomness.hashing import hash_array
from thresher.transforms.bounding.per_user_bound import bound_table_l0
from thresher.transforms.bounding.user_shards import (
    USER_HIGH_COLUMN, USER_LOW_COLUMN, exact_users, user_identity_columns)
from thresher.transforms.randomness.user_identity import TEST_KEY
from tests.robustness.conftest import diagnostics, run_cli, write_parquet, write_spec

SECRET = b"test-only secret for identities.."


def _words(prepared):
    return list(zip(prepared.column("__user").to_pylist(),
                    prepared.column(USER_LOW_COLUMN).to_pylist()))


def test_crafted_ids_collide_under_the_public_hash():
    """The premise: without exact identity these users would be merged."""
    a, b = colliding_pair("x")
    assert a != b
    h = hash_array(pa.array([a, b]))
    assert h[0] == h[1]


def test_colliding_user_ids_have_different_identities():
    """Ids colliding under the public hash get unrelated 128-bit identities; the id
    itself does not travel (no long ids through the shuffle)."""
    a, b = colliding_pair("u")
    key = user_identity.identity_key(keyed_random.KeyedSource(SECRET))
    prepared, _ = pio.prepare_batch(
        pa.table({"user_id": [a, b, a, "plain"], "word": ["k1", "k2", "k3", "k1"]}),
        "user_id", ["word"], identity_key=key)
    assert prepared.column_names == ["__user", USER_LOW_COLUMN, "__key", "word"]
    users = _words(prepared)
    assert users[0] == users[2] and len(set(users)) == 3
    assert users[0][0] != users[1][0] and users[0][1] != users[1][1]


def test_identity_is_a_function_of_the_id_and_the_secret_alone():
    """The same id has the same identity in any batch, whatever other ids it meets and
    whatever their order; another secret gives other identities; the test key (no
    KeyedSource) is fixed."""
    key = user_identity.identity_key(keyed_random.KeyedSource(SECRET))
    other = user_identity.identity_key(keyed_random.KeyedSource(SECRET[::-1]))
    ids = ["v", "w", *colliding_pair("x")]

    def identity(batch, k=key):
        prepared, _ = pio.prepare_batch(pa.table({"user_id": batch, "word": ["k"] * len(batch)}),
                                        "user_id", ["word"], identity_key=k)
        return dict(zip(batch, _words(prepared)))

    alone = {i: identity([i])[i] for i in ids}
    assert identity(ids) == alone == identity(ids[::-1])
    assert identity(ids + [f"o{i}" for i in range(300)])["v"] == alone["v"]
    assert all(identity([i], other)[i] != alone[i] for i in ids)
    # no silent public key: only a KeyedSource, or the test key asked for by name
    assert user_identity.identity_key(keyed_random.seeded_for_tests(0)) == user_identity.TEST_KEY
    for unkeyed in (None, lambda: np.random.default_rng(0)):
        with pytest.raises(ThresherError, match="rng_factory"):
            user_identity.identity_key(unkeyed)


def test_users_sharing_the_first_word_are_grouped_apart_and_keep_their_streams():
    """Two users whose identities share word 0 (no one can craft this without the secret;
    simulated here by editing the word) stay two users (``exact_users``), and every
    user's kept keys are those it keeps without the other one present."""
    source = keyed_random.KeyedSource(SECRET)
    key = user_identity.identity_key(source)
    rows = {u: [f"{u}-{j}" for j in range(6)] for u in ("a", "b", "c")}
    table = pa.table({"user_id": [u for u, ws in rows.items() for _ in ws],
                      "word": [w for ws in rows.values() for w in ws]})
    prepared, _ = pio.prepare_batch(table, "user_id", ["word"], identity_key=key)
    words = prepared.column("__user").to_numpy().copy()
    is_b = np.array(table.column("user_id").to_pylist()) == "b"
    words[is_b] = words[0]                      # b now shares a's word 0
    clash = prepared.set_column(0, "__user", pa.array(words, pa.uint64()))

    def kept(t):
        t = exact_users(t)
        out = bound_table_l0(t, ["word"], 2, keyed_random.StageSource(source, "S"))
        return sorted(t.column("word").take(pa.array(out)).to_pylist())

    grouped = exact_users(clash)
    assert USER_HIGH_COLUMN in grouped.column_names
    assert user_identity_columns(grouped) == [USER_HIGH_COLUMN, USER_LOW_COLUMN]
    assert len(set(grouped.column("__user").to_pylist())) == 3
    both = kept(clash)
    assert len(both) == 6                                  # three users, C = 2 each
    without_b = kept(clash.filter(pa.array(~is_b)))
    assert [w for w in both if not w.startswith("b-")] == without_b
    b_alone = kept(clash.filter(pa.array(is_b)))
    assert [w for w in both if w.startswith("b-")] == b_alone


def test_keyed_draws_in_a_colliding_shard_ignore_row_order():
    """In a shard where two ids collide under the public hash, a user's kept keys under
    one release secret are the same whatever the order of the shard's rows."""
    a, b = colliding_pair("c")
    pair = pa.table({"user_id": [a, b], "word": ["p1", "p2"]})
    x = pa.table({"user_id": ["x"] * 6, "word": [f"w{i}" for i in range(6)]})
    source = keyed_random.KeyedSource(b"test-only secret for row order..")

    def kept_words_of_x(table):
        prepared, _ = pio.prepare_batch(table, "user_id", ["word"],
                                        identity_key=user_identity.identity_key(source))
        exact = exact_users(prepared)
        kept = bound_table_l0(exact, ["word"], 2, keyed_random.StageSource(source, "S"))
        words = exact.column("word").take(pa.array(kept)).to_pylist()
        ids = table.column("user_id").take(pa.array(kept)).to_pylist()
        return sorted(w for w, u in zip(words, ids) if u == "x")

    after = kept_words_of_x(pa.concat_tables([pair, x]))
    before = kept_words_of_x(pa.concat_tables([x, pair]))
    assert len(after) == 2
    assert after == before


def test_integer_ids_are_identified_by_their_64_bit_word():
    """As the public hash did: equal words are one user (int64 -1 and uint64 2**64 - 1,
    True and 1), different words two; integer ids and their decimal text are not the
    same user (an input column has one type)."""
    def words(arr):
        prepared, _ = pio.prepare_batch(pa.table({"user_id": arr, "word": ["a"] * len(arr)}),
                                        "user_id", ["word"], identity_key=TEST_KEY)
        return _words(prepared)
    users = words(pa.array([1, 2**64 - 1, 1], pa.uint64()))
    assert users[0] == users[2] != users[1]
    assert words(pa.array([-1, 1], pa.int64())) == users[1::-1]
    assert words(pa.array([True])) == users[:1]
    assert words(pa.array(["1"])) != users[:1]


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
    prepared, _ = pio.prepare_batch(table, "user_id", ["word"], identity_key=TEST_KEY)
    return exact_users(prepared), ka


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
    """Adaptive kind (transforms.selection.adaptive_rounds) on the FnApiRunner: 50 users hold K1,
    one victim holds only K2, whose public hash equals K1's. Both rounds' thresholds (10
    users' weight) release K1 and not K2 (the noise is sigma = 1e-3 grid units, so a
    draw of magnitude >= 1 has probability < 1e-100). The count stage must count only
    released keys, matched by value: the output is exactly [(K1, 50)]. Matching the count
    stage's rows on the key hash published (K2, 1), the victim's key."""
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.testing.util import assert_that, equal_to
    from thresher.transforms.selection import adaptive_rounds as ar
    from thresher.transforms.bounding.user_shards import ShardByUser
    from tests.pipelines.kinds.test_weighted_gaussian_kind import _records

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
                                         rng_factory=keyed_random.seeded_for_tests(1)))
        assert_that(released | beam.FlatMap(rows), equal_to([(k1, 50)]))


def _two_files(folder, first, second, fmt="parquet"):
    """A dataset of two files: user i has the word ``wa<i>`` in the first and ``wb<i>``
    in the second; ``first`` and ``second`` are the 200 user ids as each file stores them."""
    import json
    os.makedirs(folder)
    for name, ids, prefix in (("a", first, "wa"), ("b", second, "wb")):
        words = [f"{prefix}{i}" for i in range(len(ids))]
        if fmt == "parquet":
            write_parquet(os.path.join(folder, f"{name}.parquet"),
                          pa.table({"user_id": ids, "word": words}))
        else:
            with open(os.path.join(folder, f"{name}.jsonl"), "w", encoding="utf-8") as handle:
                for u, w in zip(ids.to_pylist(), words):
                    handle.write(json.dumps({"user_id": u, "word": w}) + "\n")
    return str(folder)


@pytest.mark.parametrize("fmt, first, second", [
    ("parquet", pa.array(range(200), pa.int64()), pa.array([float(i) for i in range(200)])),
    ("parquet", pa.array(range(200), pa.int32()), pa.array(range(200), pa.uint64())),
    ("jsonl", pa.array(range(200), pa.int64()), pa.array([i + 0.0 for i in range(199)] + [0.5])),
])
def test_cli_one_user_stored_as_different_types_in_two_files_is_one_user(tmp_path, fmt, first,
                                                                          second):
    """User i is ``i`` in one file and ``float(i)`` (or another integer width; in JSONL
    ``i.0``) in the other, with one word in each; C = 1 keeps ONE
    word per user: 200 contributions (the last JSONL case: 199 users have both words,
    the id 0.5 is a user of its own: 200 + 1). Identified by Arrow type, each user was
    two users keeping both words, its bound doubled (400)."""
    data = _two_files(tmp_path / "data", first, second, fmt)
    spec, _ = write_spec(tmp_path, data, fmt=fmt, max_keys_per_user=1)
    code, _, err = run_cli("run", spec)
    assert code == 0, err
    want = 201 if 0.5 in second.to_pylist() else 200
    assert diagnostics(err)["contributions_kept"] == want


def test_cli_refuses_user_ids_that_are_text_in_one_file_and_numbers_in_another(tmp_path):
    """Whether "7" is the user 7 is the data owner's question: refused before any row is
    read, exit 2, naming both files, both types and the field; nothing published."""
    from tests.robustness.conftest import assert_clean_error, assert_nothing_published
    data = _two_files(tmp_path / "data", pa.array(range(200), pa.int64()),
                      pa.array([str(i) for i in range(200)]))
    spec, output = write_spec(tmp_path, data, max_keys_per_user=1)
    code, _, err = run_cli("run", spec)
    assert_clean_error(code, err, "input.user", "a.parquet", "b.parquet", "int64", "string")
    assert_nothing_published(output)


@pytest.mark.parametrize("numbers, strings", [
    ([i for i in range(200)], [str(i) for i in range(200)]),
    ([float(i) for i in range(200)], [f"{i}.0" for i in range(200)]),
    ([i * 1000.0 for i in range(200)], [f"{i}e3" for i in range(200)]),
], ids=["1_and_'1'", "1.0_and_'1.0'", "1e3_and_'1e3'"])
@pytest.mark.parametrize("command", ["validate", "run"])
def test_cli_refuses_jsonl_user_ids_that_are_numbers_in_one_file_and_strings_in_another(
        tmp_path, numbers, strings, command):
    """Issue 36 P4: a JSONL user id's identity is its text, and the text of a number
    depends on its spelling, so ``1`` / ``"1"`` were one user but ``1.0`` / ``"1.0"`` and
    ``1e3`` / ``"1e3"`` two, each with its own bound (C = 1 kept 400 contributions instead
    of 200). A user column of JSON numbers in one file and strings in another is refused
    before any row is read, as Parquet's text/numbers mix is: exit 2 naming the field and
    both files; nothing published. (Within one file pyarrow already refuses two JSON
    types, docs/privacy_testing.md.)"""
    from tests.robustness.conftest import assert_clean_error, assert_nothing_published
    data = _two_files(tmp_path / "data", pa.array(numbers), pa.array(strings), "jsonl")
    spec, output = write_spec(tmp_path, data, fmt="jsonl", max_keys_per_user=1)
    code, _, err = run_cli(command, spec)
    assert_clean_error(code, err, "input.user", "a.jsonl", "b.jsonl", "JSON numbers",
                       "JSON strings")
    assert_nothing_published(output)


def test_cli_refuses_jsonl_user_ids_read_as_floats_beyond_2_to_53(tmp_path):
    """A JSONL file with one fractional id is read with a floating-point user column: the
    id 2**53 + 1 in it becomes 2**53 (digits lost), so the user 2**53 + 1 of the other
    file (an exact integer there) would be split into two identities, each with its own
    bound. Refused, exit 2, naming the field, the file and the row; nothing published."""
    from tests.robustness.conftest import assert_clean_error, assert_nothing_published
    import json
    big = 2 ** 53 + 1
    folder = tmp_path / "data"
    os.makedirs(folder)
    for name, ids in (("a", [big] + list(range(1, 200))), ("b", [big] + list(range(1, 199)) + [0.5])):
        with open(folder / f"{name}.jsonl", "w", encoding="utf-8") as handle:
            for i, u in enumerate(ids):
                handle.write(json.dumps({"user_id": u, "word": f"w{name}{i}"}) + "\n")
    data = str(folder)
    spec, output = write_spec(tmp_path, data, fmt="jsonl", max_keys_per_user=1)
    code, _, err = run_cli("run", spec)
    assert_clean_error(code, err, "input.user", "b.jsonl", "row 1", "2**53")
    assert_nothing_published(output)


def test_cli_refuses_parquet_float_user_ids_at_or_beyond_2_to_53(tmp_path):
    """pandas makes an int64 id column with a missing value float64: the 64-bit id
    2**53 + 1 is then stored as 2**53 in one file and exactly in the other, one user as
    two identities with two bounds. Refused, exit 2, naming the field, the file and the
    row; nothing published."""
    from tests.robustness.conftest import assert_clean_error, assert_nothing_published
    big = 2 ** 53 + 1
    data = _two_files(tmp_path / "data", pa.array([big] + list(range(1, 200)), pa.int64()),
                      pa.array([float(big)] + [float(i) for i in range(1, 199)] + [None]))
    spec, output = write_spec(tmp_path, data, max_keys_per_user=1)
    code, _, err = run_cli("run", spec)
    assert_clean_error(code, err, "input.user", "b.parquet", "row 1", "2**53")
    assert_nothing_published(output)


def test_only_named_test_sources_get_the_public_identity_key():
    """An object that merely claims ``public_test_identity`` (a Mock, a user's class) is
    not the test source: refused like any source without a secret."""
    from thresher.errors import ThresherError
    from thresher.transforms.randomness.keyed_random import seeded_for_tests
    from thresher.transforms.randomness.user_identity import TEST_KEY, identity_key

    class Claims:
        public_test_identity = True

        def __call__(self):
            return np.random.default_rng(0)

    assert identity_key(seeded_for_tests(1)) == TEST_KEY
    with pytest.raises(ThresherError, match="holds none"):
        identity_key(Claims())
