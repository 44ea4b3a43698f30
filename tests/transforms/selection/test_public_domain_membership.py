"""Membership in a public key domain: the sorted-hash index and the exact join it falls
back to decide alike (review F5), and as the release reads keys.

``DomainIndex.member`` confirms a candidate by IEEE equality and its hash folds -0.0 into
0.0, while the join compared bits and refused mixed types: int32 domain vs int64 records
and string vs large_string raised ArrowInvalid, -0.0 was a member by the index and not by
the join, NaN the other way round. Both now compare in a common type, -0.0 equals 0.0
(the reader folds it), NaN and null equal nothing (the reader drops such keys). Each case
is checked against its expected mask written out, against a plain-Python oracle, and the
index on all rows, on the fallback's path (a batch of another type), and the join
(``domain_mask``/``restrict_to_domain``). A domain listing 0.0 and -0.0 released two rows
with one noise draw (their difference the exact count): it is now refused as a duplicate.
Deterministic (a fixed seed for the random cases)."""
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thresher.pipelines.dataio.public_keys import load_domain
from thresher.pipelines.errors import SpecError
from thresher.transforms.selection.public_domain import DomainIndex, domain_mask, restrict_to_domain

NAN = float("nan")

CASES = {
    "int32 domain, int64 records": (pa.array([1, 2, 3], pa.int32()),
                                    pa.array([1, 2, 5], pa.int64()), [True, True, False]),
    "-0.0 records, 0.0 domain": (pa.array([0.0, 1.5]), pa.array([-0.0, 1.5, NAN]),
                                 [True, True, False]),
    "-0.0 domain, 0.0 records": (pa.array([-0.0, 1.5]), pa.array([0.0, 2.5]), [True, False]),
    "NaN in both": (pa.array([NAN, 1.0]), pa.array([NAN, 1.0]), [False, True]),
    "null in both": (pa.array(["a", None]), pa.array([None, "a", "b"]), [False, True, False]),
    "large_string domain": (pa.array(["a", "b"], pa.large_string()), pa.array(["a", "c"]),
                            [True, False]),
    "string domain, large_string records": (pa.array(["a", "b"]),
                                            pa.array(["b", "z"], pa.large_string()),
                                            [True, False]),
    "int domain, float records": (pa.array([1, 2]), pa.array([1.0, 2.5]), [True, False]),
    "float32 domain, float64 records": (pa.array([0.5, 1.0], pa.float32()),
                                        pa.array([0.5, 0.1, 1.0]), [True, False, True]),
    "uint64 domain, int64 records": (pa.array([2 ** 64 - 1, 5], pa.uint64()),
                                     pa.array([-1, 5, 2 ** 63 - 1], pa.int64()),
                                     [False, True, False]),
}


def _masks(domain_column, records_column, extra=None):
    """(index on the records as given, join) masks; ``extra``: a second key column."""
    domain = pa.table({"k": domain_column, **({"j": extra[0]} if extra else {})})
    records = pa.table({"k": records_column, **({"j": extra[1]} if extra else {})})
    keys = list(domain.column_names)
    index = DomainIndex(domain, keys).member(records).tolist()
    joined = domain_mask(records, domain, keys).tolist()
    numbered = records.append_column("row", pa.array(np.arange(records.num_rows)))
    kept = restrict_to_domain(numbered, domain, keys).column("row").to_pylist()
    assert kept == sorted(kept)                       # the rows, in their order
    assert [i in kept for i in range(records.num_rows)] == joined
    return index, joined


def _oracle(domain_values, record_values):
    """Python's own equality: 1 == 1.0, -0.0 == 0.0; NaN and None match nothing."""
    def usable(v):
        return v is not None and not (isinstance(v, float) and math.isnan(v))
    listed = [v for v in domain_values if usable(v)]
    return [usable(v) and any(v == d for d in listed) for v in record_values]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_index_and_the_join_agree_on_the_corners(case):
    domain, records, expected = CASES[case]
    index, joined = _masks(domain, records)
    assert index == joined == expected
    assert expected == _oracle(domain.to_pylist(), records.to_pylist())


def test_two_key_columns_of_other_types():
    index, joined = _masks(pa.array(["x", "y"]), pa.array(["x", "y", "x"], pa.large_string()),
                           extra=(pa.array([1, 2], pa.int32()), pa.array([1, 1, 2])))
    assert index == joined == [True, False, False]


def test_keys_without_a_common_type_are_an_error_naming_the_column():
    """Text and numbers (the plan refuses such a domain first: issue 36 D12), and
    integers a float64 cannot hold exactly: a clear error from both paths."""
    for domain, records in ((pa.array([1, 2]), pa.array(["1", "2"])),
                            (pa.array([0.5]), pa.array([2 ** 53 + 1]))):
        for decide in (lambda d, r: DomainIndex(d, ["k"]).member(r),
                       lambda d, r: domain_mask(r, d, ["k"])):
            with pytest.raises(TypeError, match="key column 'k'"):
                decide(pa.table({"k": domain}), pa.table({"k": records}))


def test_keys_sharing_a_hash_are_decided_by_value():
    """Two domain keys with one public hash (Thue-Morse pair: the index's shared path, the
    join) and a record key sharing the hash of one domain key it is not (the single path:
    the hash only finds the candidate)."""
    from tests.privacy.collisions import colliding_pair
    a, b = colliding_pair("d")
    c, d = colliding_pair("e")
    index, joined = _masks(pa.array([a, b, "x"]), pa.array([b, "y", a, "x", d]))
    assert index == joined == [True, False, True, True, False]
    index, joined = _masks(pa.array([c, "x"]), pa.array([d, c]))
    assert index == joined == [False, True]


def test_random_batches_agree_with_the_oracle():
    """Random float and integer keys with signed zeros, NaN and nulls, on the index's own
    path (float64 records) and on its fallback (float32 and int64 records)."""
    rng = np.random.default_rng(5)
    pool = [0.0, -0.0, 1.0, 2.0, 2.5, NAN, None, 7.0, -3.0]
    for trial in range(60):
        # distinct domain keys by value: one of the two zeros at most
        zero = [0.0, -0.0][int(rng.integers(2))]
        distinct = [zero, 1.0, 2.0, 2.5, NAN, None, 7.0, -3.0]
        domain_values = [distinct[i] for i in sorted(rng.choice(len(distinct), size=4,
                                                                replace=False))]
        records = [pool[i] for i in rng.integers(0, len(pool), size=40)]
        as_float = pa.array(records, pa.float64())
        index, joined = _masks(pa.array(domain_values, pa.float64()), as_float)
        expected = _oracle(domain_values, records)
        assert index == joined == expected, (trial, domain_values, records)
        # the same records as float32 batch: the index takes the join (other type)
        index32, _ = _masks(pa.array(domain_values, pa.float64()), as_float.cast(pa.float32()))
        assert index32 == expected
        ints = [int(v) if v is not None and v == v else None for v in records]
        index_int, joined_int = _masks(pa.array(domain_values, pa.float64()),
                                       pa.array(ints, pa.int64()))
        assert index_int == joined_int == _oracle(domain_values, ints)


def _domain_file(tmp_path, values):
    path = tmp_path / "domain.parquet"
    pq.write_table(pa.table({"k": pa.array(values, pa.float64())}), path)
    return {"path": str(path), "format": "parquet"}


def test_a_domain_listing_zero_and_minus_zero_is_refused_as_a_duplicate(tmp_path):
    """0.0 and -0.0 are one key (the reader folds -0.0): listed both, they were released
    as two rows drawing one noise value (one canonical text), so the difference of their
    counts was the exact count of 0.0 (measured: released 969 and -3 for 972 records)."""
    with pytest.raises(SpecError, match=r"lists key \{'k': 0\.0\} more than once") as err:
        load_domain(_domain_file(tmp_path, [0.0, -0.0, 1.0]), ["k"], {"k": pa.float64()})
    assert err.value.field == "input.public_keys.path"
    domain = load_domain(_domain_file(tmp_path, [-0.0, 1.0]), ["k"], {"k": pa.float64()})
    assert [math.copysign(1.0, v) for v in domain.column("k").to_pylist()] == [1.0, 1.0]


def test_a_nan_public_key_is_refused(tmp_path):
    with pytest.raises(SpecError, match="key column 'k' has 1 NaN value") as err:
        load_domain(_domain_file(tmp_path, [NAN, 1.0]), ["k"], {"k": pa.float64()})
    assert err.value.field == "input.public_keys.path"
