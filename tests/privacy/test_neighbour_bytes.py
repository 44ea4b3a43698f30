"""The published bytes of neighbouring datasets differ only in the released values
(issue 13; harness: tests/privacy/harness.py). Each case runs the real CLI twice."""
import pytest

from tests.privacy import harness

CASES = {
    "gaussian": dict(kind="gaussian"),
    "laplace": dict(kind="laplace"),
    "sample_and_threshold": dict(kind="sample_and_threshold"),
    "weighted_sampling": dict(kind="weighted_sampling"),
    "weighted_sampling_keys": dict(kind="weighted_sampling", report="keys"),
    "gaussian_auto": dict(kind="gaussian", auto=True),
    "laplace_auto": dict(kind="laplace", auto=True),
    "sample_and_threshold_auto": dict(kind="sample_and_threshold", auto=True),
    "gaussian_public_keys": dict(kind="gaussian", public_keys=True),
    "laplace_public_keys_auto": dict(kind="laplace", public_keys=True, auto=True),
    "gaussian_aggregates": dict(kind="gaussian", aggregates=[
        {"column": "amount", "statistic": "sum", "clip": [0, 100]},
        {"column": "amount", "statistic": "mean", "clip": [0, 100]}]),
    # issue 27: variance / stddev intervals read staged noisy sums (dropped before publishing)
    "gaussian_variance": dict(kind="gaussian", aggregates=[
        {"column": "amount", "statistic": "variance", "clip": [0, 100]},
        {"column": "amount", "statistic": "stddev", "clip": [0, 100]}]),
    "heavy_hitters": dict(kind="heavy_hitters", top_k=5),
    "quantiles_public_keys": dict(kind="quantiles", public_keys=True, column="amount",
                                  ranks=[0.5, 0.9], domain=[0, 100]),
    "laplace_public_keys_aggregates": dict(kind="laplace", public_keys=True, aggregates=[
        {"column": "amount", "statistic": "sum", "clip": [0, 100]}]),
    "weighted_gaussian": dict(kind="weighted_gaussian"),
    "weighted_gaussian_auto": dict(kind="weighted_gaussian", auto=True),
    "adaptive": dict(kind="adaptive"),
    "adaptive_auto": dict(kind="adaptive", auto=True),
    # issue 38: one shared draw per release; its value never reaches the file or report
    "gaussian_correlated": dict(kind="gaussian", noise="correlated"),
    "gaussian_noise_auto_bound_auto": dict(kind="gaussian", noise="auto", auto=True),
}
FAST = ("gaussian", "laplace_public_keys_auto", "weighted_gaussian", "adaptive")


def _params():
    return [pytest.param(name, marks=() if name in FAST else pytest.mark.slow) for name in CASES]


@pytest.mark.parametrize("case", _params())
def test_adding_a_user_changes_only_released_values(case, tmp_path, monkeypatch):
    """D vs D + one user whose hash sorts first in user shard 0 and whose words are
    released anyway: same keys, same order, same layout, same report."""
    base = harness.dataset()
    added = harness.with_user(base, harness.first_in_shard_zero_id(base), ["w4", "w3", "solo"])
    spec = harness.spec_dict(**CASES[case])
    out_a = harness.release(tmp_path / "a", base, spec, monkeypatch)
    out_b = harness.release(tmp_path / "b", added, spec, monkeypatch)
    harness.assert_only_values_differ(out_a, out_b)


@pytest.mark.parametrize("case", ["gaussian", pytest.param("sample_and_threshold", marks=pytest.mark.slow),
                                  pytest.param("gaussian_public_keys", marks=pytest.mark.slow)])
def test_neighbours_either_side_of_the_size_boundaries(case, tmp_path, monkeypatch):
    """Shards, read batches and coalesced shuffle pieces of 1000 rows: D has 3999 rows
    (4 shards, 4 batches, 4 pieces), D + one user 4002 (5 of each). Nothing about the
    input size may show in the published bytes (before issue 13: one row group per key
    shard)."""
    base = harness.dataset(n_users=1333)             # 3 rows a user: 3999 rows
    assert base.num_rows == 3999
    added = harness.with_user(base, "newcomer", ["w3", "w4", "newcomer-own"])
    spec = harness.spec_dict(**CASES[case])
    kw = dict(rows_per_shard=1000, batch_rows=1000, coalesce_rows=1000)
    out_a = harness.release(tmp_path / "a", base, spec, monkeypatch, **kw)
    out_b = harness.release(tmp_path / "b", added, spec, monkeypatch, **kw)
    harness.assert_only_values_differ(out_a, out_b)


def test_public_keys_are_published_in_domain_order(tmp_path, monkeypatch):
    """A public domain is released in the domain file's order, every key once."""
    import pyarrow.parquet as pq
    out = harness.release(tmp_path / "a", harness.dataset(n_users=300),
                          harness.spec_dict(kind="laplace", public_keys=True), monkeypatch)
    assert pq.read_table(out + "/released.parquet").column("word").to_pylist() == harness.DOMAIN
