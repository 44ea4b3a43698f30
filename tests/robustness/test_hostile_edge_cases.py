"""Issue 36's wrong answers and crashes at the edges of ``run``, ``plan`` and ``validate``,
through the real CLI (the items D1, D10, D12, D15, D17 and the small ones).

Every case runs ``pipelines.cli.main`` in one child interpreter (``tests.robustness.
cli_driver``: 3 GB address-space cap, a 60 s alarm per case) and must end with its exit
code, a message naming the field, file or column, no traceback, no "internal error", and
nothing left beside the output folder (``test_hostile_corpus.Case.verify``).
docs/robustness.md lists which case covers which item; on the code before, each refused
case below ended with exit 0 (a wrong release) or exit 1 (an internal error), as its
comment says.
"""
import json
import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.robustness.cli_driver import run_batch
from tests.robustness.test_hostile_corpus import Case


def _words(folder, key="word", n=900):
    """300 users with 3 rows each, a text key ``key``, an integer ``n`` and a float
    ``amount``."""
    rng = np.random.default_rng(0)
    pq.write_table(pa.table({"user_id": [f"u{i // 3}" for i in range(n)],
                             key: [f"w{i % 7}" for i in range(n)],
                             "n": pa.array(np.arange(n) % 5, pa.int64()),
                             "amount": rng.random(n) * 100}),
                   os.path.join(folder, "in.parquet"))


def _words_with(key):
    return lambda folder: _words(folder, key)


def _int64_domain(folder):
    _words(folder)
    pq.write_table(pa.table({"word": pa.array([0, 1, 2], pa.int64())}),
                   os.path.join(folder, "domain.parquet"))


def _with_domain(folder, spec):
    spec = json.loads(json.dumps(spec))
    spec["input"]["public_keys"] = {"path": os.path.join(folder, "domain.parquet")}
    return yaml.safe_dump(spec)


def _empty_folder(folder):
    os.makedirs(os.path.join(folder, "in"))


def _input_path(name, fmt=None):
    def text(folder, spec):
        spec = json.loads(json.dumps(spec))
        spec["input"]["path"] = os.path.join(folder, name)
        if fmt:
            spec["input"]["format"] = fmt
        return yaml.safe_dump(spec)
    return text


def _jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def _jsonl_user_in_one_file(folder):
    """D15: user 1 written as 1 and as "1" in one file."""
    _jsonl(os.path.join(folder, "in.jsonl"),
           [{"user_id": i // 3 if i % 2 else str(i // 3), "word": f"w{i % 7}"}
            for i in range(900)])


def _jsonl_key_in_one_file(folder):
    _jsonl(os.path.join(folder, "in.jsonl"),
           [{"user_id": f"u{i // 3}", "word": i % 7 if i % 2 else str(i % 7)}
            for i in range(900)])


def _null_confidence(folder, spec):
    spec = json.loads(json.dumps(spec))
    spec["output"]["confidence"] = None
    return yaml.safe_dump(spec)


def _says_whole_key_level_added(case, result):
    assert "mechanism.prefix_lengths [2, 4] does not end with null" in result["out"], result["out"]
    assert "3 levels, [2, 4, null]" in result["out"], result["out"]


def _finite_spread(case, result):
    table = pq.read_table(os.path.join(case.output, "released.parquet"))
    assert table.num_rows > 0
    for column in ("amount_variance", "amount_variance_low", "amount_variance_high"):
        assert all(math.isfinite(v) for v in table.column(column).to_pylist()), column


MEAN = [{"column": "amount", "statistic": "mean", "clip": [0, 100]}]
SPREAD_LIMIT = 2.0 ** 486

# name, command, data, spec sections, text, expected code, needles, check
CASES = [
    # D1: a key named like an output or interval column was overwritten (exit 0, no keys)
    *[(f"d1_key_count_low_{cmd}", cmd, _words_with("count_low"), {"input": {"keys": ["count_low"]}},
       None, 2, ("input.keys[0]", "'count_low' is the interval column of 'count'"), None)
      for cmd in ("validate", "run")],
    ("d1_key_like_an_aggregate_interval", "run", _words_with("amount_mean_high"),
     {"input": {"keys": ["amount_mean_high"]}, "aggregates": MEAN}, None, 2,
     ("input.keys[0]", "'amount_mean_high' is the interval column of 'amount_mean'"), None),
    ("d1_key_estimate_low_sample_and_threshold", "plan", None,
     {"input": {"keys": ["estimate_low"]}, "mechanism": {"kind": "sample_and_threshold"}}, None,
     2, ("input.keys[0]", "'estimate_low'"), None),
    ("d1_quantile_column_named_value", "plan", None,
     {"input": {"keys": []}, "bounding": {"max_keys_per_user": 1},
      "mechanism": {"kind": "quantiles", "column": "value", "ranks": [0.5], "domain": [0, 1]}},
     None, 2, ("mechanism.column", "'value' is an output column of mechanism.kind quantiles"),
     None),
    # D10: a variance's squared clip overflowed to inf (exit 1 in run, plan and validate)
    *[(f"d10_variance_clip_1e300_{cmd}", cmd, _words,
       {"aggregates": [{"column": "amount", "statistic": "variance", "clip": [-1e300, 1e300]}]},
       None, 2, ("aggregates[0].clip", "2**486", "the largest a variance accepts"), None)
      for cmd in ("validate", "plan", "run")],
    ("d10_stddev_clip_beyond_the_limit", "plan", None,
     {"aggregates": [{"column": "amount", "statistic": "stddev",
                      "clip": [0, SPREAD_LIMIT * 1.01]}]}, None, 2, ("aggregates[0].clip",), None),
    ("d10_variance_at_the_largest_clip_runs", "run", _words,
     {"aggregates": [{"column": "amount", "statistic": "variance",
                      "clip": [-SPREAD_LIMIT, SPREAD_LIMIT]}]}, None, 0, (), _finite_spread),
    # D12: an int64 domain for string keys released pure noise (exit 0, full charge)
    *[(f"d12_int64_domain_string_keys_{cmd}", cmd, _int64_domain, {}, _with_domain, 2,
       ("input.public_keys", "holds numbers (int64)", "holds text (string)"), None)
      for cmd in ("validate", "plan", "run")],
    # D15: 1 and "1" for the user (or a key) in one JSONL file: a named error, documented
    *[(f"d15_jsonl_user_number_and_string_{cmd}", cmd, _jsonl_user_in_one_file, {},
       _input_path("in.jsonl", "jsonl"), 2,
       ("input.user", "in.jsonl", "column 'user_id' holds JSON", "one JSON type"), None)
      for cmd in ("validate", "run")],
    ("d15_jsonl_key_number_and_string", "validate", _jsonl_key_in_one_file, {},
     _input_path("in.jsonl", "jsonl"), 2, ("input.keys[0]", "column 'word' holds JSON"), None),
    # D17: heavy hitters on an int64 key passed validate and failed in the pipeline
    *[(f"d17_heavy_hitters_int64_key_{cmd}", cmd, _words,
       {"input": {"keys": ["n"]}, "mechanism": {"kind": "heavy_hitters"}}, None, 2,
       ("input.keys[0]", "heavy_hitters needs a string key column", "'n' is int64"), None)
      for cmd in ("validate", "plan")],
    # small: output.confidence: null was taken as 0.95
    ("small_confidence_null", "validate", _words, {}, _null_confidence, 2,
     ("output.confidence", "null"), None),
    # small: an empty input folder was "cannot tell the format"
    ("small_empty_input_folder", "validate", _empty_folder, {}, _input_path("in"), 2,
     ("input.path", "is empty"), None),
    # small: prefix_lengths [2, 4] ran [2, 4, None] without saying so
    ("small_prefix_lengths_without_the_whole_key", "plan", None,
     {"mechanism": {"kind": "heavy_hitters", "prefix_lengths": [2, 4]}}, None, 0, (),
     _says_whole_key_level_added),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("issue36"))
    cases = [Case(root, name, command=command, data=data, spec=spec, text=text, code=code,
                  needles=needles, check=check)
             for name, command, data, spec, text, code, needles, check in CASES]
    out = run_batch([c.argv() for c in cases])
    return dict(zip([c.name for c in cases], zip(cases, out)))


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_case(results, name):
    case, result = results[name]
    case.verify(result)


def test_prefix_lengths_note_is_in_the_report():
    """The plan's report (``plan --json``, release_report.json) says it too; a schedule
    ending with null says nothing."""
    import thresher
    spec = {"name": "hh", "input": {"path": "in.parquet", "user": "user_id", "keys": ["word"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-8}, "bounding": {"max_keys_per_user": 3},
            "mechanism": {"kind": "heavy_hitters", "prefix_lengths": [2, 4]},
            "output": {"path": "out"}}
    mechanism = thresher.plan(spec).report()["mechanism"]
    assert mechanism["prefix_lengths"] == [2, 4, None]
    assert "the trie runs 3 levels, [2, 4, null]" in mechanism["prefix_lengths_note"]
    spec["mechanism"]["prefix_lengths"] = [2, 4, None]
    assert "prefix_lengths_note" not in thresher.plan(spec).report()["mechanism"]
