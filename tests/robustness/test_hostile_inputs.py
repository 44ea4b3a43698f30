"""Hostile inputs through the real CLI (``thresher run``): each gets a clear error (exit
code 2, a message naming the field, file or row, no traceback, nothing published) or a
documented, counted drop (operator diagnostics) with a complete release.

Default-run tests call the CLI in-process (same code path and Beam runner, ~3 s each);
the ``slow`` ones run it in a fresh interpreter, as a user would.
"""
import glob
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.robustness.conftest import (assert_clean_error, assert_nothing_published, diagnostics,
                                       read_release, run_cli, words_table, write_parquet,
                                       write_spec)


def _assert_complete_release(code, err, output):
    assert code == 0, err
    assert "Traceback" not in err
    report, table = read_release(output)
    assert report["released_keys"] == table.num_rows
    assert sorted(os.listdir(output)) == ["release_report.json", "released.parquet"]
    assert not glob.glob(f"{output}.tmp-*")
    return report, table


def test_null_and_empty_user_ids_are_dropped_and_counted(tmp_path):
    table = words_table()
    users = table.column("user_id").to_pylist()
    for i in range(0, 300, 3):
        users[i] = None
    for i in range(1, 300, 3):
        users[i] = ""
    data = write_parquet(tmp_path / "in.parquet", table.set_column(0, "user_id", pa.array(users)))
    spec, output = write_spec(tmp_path, data)
    code, _, err = run_cli("run", spec)
    _assert_complete_release(code, err, output)
    assert diagnostics(err)["rows_dropped_null_or_empty_user"] == 200


def test_null_nan_and_inf_keys(tmp_path):
    """Null keys and NaN in a float key column are counted drops; +-inf are ordinary key
    values (released like any other key when frequent enough)."""
    n = 3000
    rng = np.random.default_rng(1)
    score = rng.choice([1.5, 2.5, np.inf, -np.inf], size=n).astype(np.float64)
    score[:40] = np.nan
    word = [f"w{i % 3}" for i in range(n)]
    word[40:70] = [None] * 30
    data = write_parquet(tmp_path / "in.parquet", pa.table({
        "user_id": pa.array([f"u{i}" for i in range(n)]), "word": pa.array(word),
        "score": pa.array(score)}))
    spec, output = write_spec(tmp_path, data, keys=("word", "score"))
    code, _, err = run_cli("run", spec)
    _, released = _assert_complete_release(code, err, output)
    assert diagnostics(err)["rows_dropped_null_key"] == 70
    assert not np.isnan(released.column("score").to_numpy()).any()
    assert np.isinf(released.column("score").to_numpy()).any()


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_non_utf8_text_input_is_a_clear_error_and_nothing_is_published(tmp_path, fmt):
    rows = [b"user_id,word\n"] + [b"u%d,w%d\n" % (i, i % 5) for i in range(500)]
    if fmt == "jsonl":
        rows = [b'{"user_id": "u%d", "word": "w%d"}\n' % (i, i % 5) for i in range(500)]
    rows[250] = (b"u250,caf\xe9\n" if fmt == "csv" else b'{"user_id": "u250", "word": "caf\xe9"}\n')
    path = tmp_path / f"in.{fmt}"
    path.write_bytes(b"".join(rows))
    spec, output = write_spec(tmp_path, path, fmt=fmt)
    code, _, err = run_cli("run", spec)
    assert_clean_error(code, err, "in." + fmt)
    assert "utf" in err.lower()
    assert_nothing_published(output)


def test_non_utf8_bytes_in_a_binary_parquet_key_are_keys_like_any_other(tmp_path):
    """Parquet binary columns hold bytes, not text: invalid UTF-8 is a legitimate key."""
    n = 3000
    keys = [b"caf\xe9" if i % 2 else b"\xff\xfe" for i in range(n)]
    data = write_parquet(tmp_path / "in.parquet", pa.table({
        "user_id": pa.array([f"u{i}" for i in range(n)]), "word": pa.array(keys, type=pa.binary())}))
    spec, output = write_spec(tmp_path, data)
    code, _, err = run_cli("run", spec)
    _, released = _assert_complete_release(code, err, output)
    assert set(released.column("word").to_pylist()) == {b"caf\xe9", b"\xff\xfe"}


def test_duplicate_rows_count_once(tmp_path):
    table = words_table(seed=2)
    once = write_parquet(tmp_path / "once.parquet", table)
    thrice = write_parquet(tmp_path / "thrice.parquet", pa.concat_tables([table] * 3))
    kept = []
    for name, data in (("a", once), ("b", thrice)):
        spec, output = write_spec(tmp_path, data, output=name)
        code, _, err = run_cli("run", spec)
        _assert_complete_release(code, err, output)
        kept.append(diagnostics(err)["contributions_kept"])
    assert kept[0] == kept[1] > 0


def test_empty_input_releases_nothing_or_says_so(tmp_path):
    empty = words_table().slice(0, 0)
    data = write_parquet(tmp_path / "in.parquet", empty)
    spec, output = write_spec(tmp_path, data)
    code, _, err = run_cli("run", spec)
    if code == 0:
        report, table = _assert_complete_release(code, err, output)
        assert report["released_keys"] == 0 and table.num_rows == 0
        assert table.schema.names == ["word", "count", "count_low", "count_high"]
    else:
        assert_clean_error(code, err, "input")
        assert_nothing_published(output)


def test_every_key_suppressed_is_a_complete_empty_release(tmp_path):
    # 300 keys with one user each: far below the threshold
    data = write_parquet(tmp_path / "in.parquet", pa.table({
        "user_id": pa.array([f"u{i}" for i in range(300)]),
        "word": pa.array([f"w{i}" for i in range(300)])}))
    spec, output = write_spec(tmp_path, data)
    code, _, err = run_cli("run", spec)
    report, table = _assert_complete_release(code, err, output)
    assert report["released_keys"] == 0 and table.num_rows == 0
    assert table.schema.names == ["word", "count", "count_low", "count_high"]


def test_glob_matching_no_files(tmp_path):
    spec, output = write_spec(tmp_path, tmp_path / "nothing-*.parquet")
    code, _, err = run_cli("run", spec)
    assert_clean_error(code, err, "input.path", "matches no files")
    assert_nothing_published(output)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty_file"])
def test_malformed_parquet_names_the_file(tmp_path, damage):
    good = write_parquet(tmp_path / "good.parquet", words_table())
    raw = open(good, "rb").read()
    bad = tmp_path / "bad.parquet"
    bad.write_bytes({"garbage": b"not a parquet file at all" * 40,
                     "truncated": raw[: len(raw) // 2],
                     "empty_file": b""}[damage])
    spec, output = write_spec(tmp_path, tmp_path / "*.parquet")
    code, _, err = run_cli("run", spec)
    assert_clean_error(code, err, "input.path", "bad.parquet")
    assert_nothing_published(output)


def test_corrupt_row_group_found_while_reading_publishes_nothing(tmp_path):
    """A file whose footer is intact but whose data pages are damaged fails only when the
    pipeline reads it: the error must still be clear and nothing published."""
    table = words_table(n_users=20_000)
    path = tmp_path / "in.parquet"
    pq.write_table(table, str(path), compression="snappy", row_group_size=5000)
    raw = bytearray(path.read_bytes())
    footer_len = int.from_bytes(raw[-8:-4], "little")
    start, stop = 8, len(raw) - footer_len - 8
    for i in range(start + 200, stop - 200, 997):   # scribble over the data pages only
        raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))
    spec, output = write_spec(tmp_path, path)
    code, _, err = run_cli("run", spec)
    assert_clean_error(code, err, "in.parquet")
    assert_nothing_published(output)


def test_missing_key_column_names_the_field(tmp_path):
    data = write_parquet(tmp_path / "in.parquet", words_table())
    spec, output = write_spec(tmp_path, data, keys=("colour",))
    code, _, err = run_cli("run", spec)
    assert_clean_error(code, err, "input.keys[0]", "colour")
    assert_nothing_published(output)


@pytest.mark.slow
def test_one_user_with_a_million_rows(tmp_path):
    """One user holding 10^6 rows over 5,000 keys, beside ordinary users: bounded to C
    keys like anyone else (fresh interpreter, the way a user runs it)."""
    heavy = pa.table({"user_id": pa.array(["heavy"] * 1_000_000),
                      "word": pa.array([f"h{i % 5000}" for i in range(1_000_000)])})
    data = write_parquet(tmp_path / "in.parquet", pa.concat_tables([words_table(), heavy]))
    spec, output = write_spec(tmp_path, data, max_keys_per_user=3)
    code, _, err = run_cli("run", spec, in_process=False)
    _, released = _assert_complete_release(code, err, output)
    assert not any(w.startswith("h") for w in released.column("word").to_pylist())
    stats = diagnostics(err)
    assert stats["rows_read"] == 1_006_000
    assert stats["contributions_kept"] <= 2000 * 3 + 3


@pytest.mark.slow
@pytest.mark.parametrize("case", ["null users", "malformed parquet", "non-utf8 csv"])
def test_hostile_inputs_in_a_fresh_interpreter(tmp_path, case):
    if case == "null users":
        table = words_table()
        users = table.column("user_id").to_pylist()
        users[:50] = [None] * 50
        data = write_parquet(tmp_path / "in.parquet", table.set_column(0, "user_id", pa.array(users)))
        spec, output = write_spec(tmp_path, data)
        code, _, err = run_cli("run", spec, in_process=False)
        _assert_complete_release(code, err, output)
        assert diagnostics(err)["rows_dropped_null_or_empty_user"] == 50
        return
    if case == "malformed parquet":
        path = tmp_path / "in.parquet"
        path.write_bytes(b"PAR1 this is not parquet")
        spec, output = write_spec(tmp_path, path)
    else:
        path = tmp_path / "in.csv"
        path.write_bytes(b"user_id,word\nu1,ok\nu2,caf\xe9\n")
        spec, output = write_spec(tmp_path, path, fmt="csv")
    code, _, err = run_cli("run", spec, in_process=False)
    assert_clean_error(code, err, "in.")
    assert_nothing_published(output)
