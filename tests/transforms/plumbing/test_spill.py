"""The spilled shuffles (transforms/plumbing/spill.py) deliver exactly what the runner's
GroupByKey delivers, and a release through them is byte for byte the release through the
runner's in-memory shuffle, with nothing left behind.

Without the spill (transforms/plumbing/spill.py absent or unused), the in-process runner holds the
whole user shuffle in memory: docs/performance.md has the peak RSS figures."""
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from thresher.pipelines.dataio.io import prepare_batch
from thresher.transforms.randomness import keyed_random
from thresher.transforms.plumbing import spill
from thresher.transforms.bounding.user_shards import ShardByUser, user_shard_of
from thresher.transforms.randomness.user_identity import TEST_KEY


def _rows(table):
    return sorted(zip(*[table.column(c).to_pylist() for c in table.column_names]))


def test_spilled_group_by_key_gives_the_groups_of_group_by_key(tmp_path):
    rng = np.random.default_rng(3)
    pairs = [(int(k), pa.table({"x": rng.integers(0, 100, int(n))}))
             for k, n in zip(rng.integers(0, 4, 30), rng.integers(0, 50, 30))]
    expected = {}
    for k, t in pairs:
        expected.setdefault(k, []).extend(t.column("x").to_pylist())
    folder = str(tmp_path / "spill")
    with test_pipeline.TestPipeline() as p:
        groups = (p
                  | beam.Create(pairs)
                  | spill.SpilledGroupByKey(folder)
                  | beam.MapTuple(lambda k, tables: (k, sorted(
                      v for t in tables for v in t.column("x").to_pylist()))))
        assert_that(groups, equal_to([(k, sorted(v)) for k, v in expected.items()]))
    # one file per element, every one readable as the table that was written
    assert len(os.listdir(folder)) == len(pairs)
    assert sorted(spill.read_piece(os.path.join(folder, f)).num_rows
                  for f in os.listdir(folder)) == sorted(t.num_rows for _, t in pairs)



def test_pieces_written_to_one_file_group_as_pieces_written_one_by_one(tmp_path):
    """``write_pieces`` puts many (key, table) pieces into one file, one record batch
    each; each reference reads back as its table, and ``GroupSpilledByKey`` of the
    references gives the groups ``SpilledGroupByKey`` gives of the tables."""
    rng = np.random.default_rng(4)
    pairs = [(int(k), pa.table({"x": rng.integers(0, 100, int(n)), "y": rng.random(int(n))}))
             for k, n in zip(rng.integers(0, 4, 12), rng.integers(0, 50, 12))]
    folder = str(tmp_path / "one")
    refs = spill.write_pieces(pairs, folder)
    assert len(os.listdir(folder)) == 1
    assert [k for k, _ in refs] == [k for k, _ in pairs]
    for (_, ref), (_, table) in zip(refs, pairs):
        assert spill.read_piece(ref).equals(table)
    assert spill.write_pieces([], folder) == []
    with pytest.raises(ValueError, match="schemas differ"):
        spill.write_pieces([(0, pa.table({"x": [1]})), (1, pa.table({"z": [1]}))], folder)

    def values(groups, label):
        return groups | label >> beam.MapTuple(lambda k, tables: (k, sorted(
            v for t in tables for v in t.column("x").to_pylist())))
    with test_pipeline.TestPipeline() as p:
        by_ref = values(p | "Refs" >> beam.Create(refs).with_output_types(
            spill.SHARD_AND_PIECE_REF) | "ByRef" >> spill.GroupSpilledByKey(), "ValuesA")
        by_file = values(p | "Tables" >> beam.Create(pairs)
                         | "ByFile" >> spill.SpilledGroupByKey(str(tmp_path / "each")), "ValuesB")
        expected = {}
        for k, t in pairs:
            expected.setdefault(k, []).extend(t.column("x").to_pylist())
        want = [(k, sorted(v)) for k, v in expected.items()]
        assert_that(by_ref, equal_to(want), label="ByRefGroups")
        assert_that(by_file, equal_to(want), label="ByFileGroups")

def _batches(n=6000, seed=5):
    rng = np.random.default_rng(seed)
    users = [f"user-{i}" for i in rng.integers(0, 700, n)]
    words = [f"w{j}" for j in rng.integers(0, 90, n)]
    raw = pa.table({"user": users, "word": words})
    return [prepare_batch(raw.slice(i, 1000), "user", ["word"], identity_key=TEST_KEY)[0] for i in range(0, n, 1000)]


def test_user_shards_through_files_equal_the_in_memory_shuffle(tmp_path):
    """Same whole-user tables (rows, exact user words, the recomputed __key) with the
    spill folder and __key recomputed as through the runner's shuffle with __key
    travelling: each shard holds exactly the rows of its users."""
    batches = _batches()
    folder = str(tmp_path / "users")
    everything = pa.concat_tables(batches)   # 128-bit identities: __user one-to-one here
    shard_of = user_shard_of(everything.column("__user").to_numpy(), 5)
    expected = [tuple(_rows(everything.filter(pa.array(shard_of == s))))
                for s in sorted(set(shard_of.tolist()))]
    assert sum(len(e) for e in expected) == 6000
    with test_pipeline.TestPipeline() as p:
        batches_in = p | beam.Create(batches)
        in_memory = batches_in | "InMemory" >> ShardByUser(5)
        spilled = batches_in | "Spilled" >> ShardByUser(5, key_columns=["word"], spill_dir=folder)
        assert_that(in_memory | "RowsA" >> beam.Map(lambda t: tuple(_rows(t))),
                    equal_to(expected), label="InMemoryShards")
        assert_that(spilled | "RowsB" >> beam.Map(lambda t: tuple(_rows(t))),
                    equal_to(expected), label="SpilledShards")
    assert os.listdir(folder)   # the pieces went through files


@pytest.mark.parametrize("bound", [1000, "auto"])
def test_release_through_files_on_the_in_process_runner(tmp_path, monkeypatch, bound):
    """A release on the default runner goes through the spill folder and leaves nothing
    of it behind; its counts are the true distinct-user counts plus the discrete
    Gaussian noise (with C = 1000 not binding: every count within 7 sigma, false-failure
    probability < 1e-10 per key), as through the runner's own shuffle (spill off)."""
    import pyarrow.parquet as pq
    import yaml

    from thresher.pipelines.running import release

    from thresher.pipelines.specs import spec as spec_mod
    from thresher.pipelines.planning.plan import make_plan
    from tests.pipelines.conftest import BASE_SPEC, QUICKSTART_DATA

    table = pq.read_table(QUICKSTART_DATA, columns=["user_id", "word"])
    pairs = table.group_by(["user_id", "word"]).aggregate([])
    truth = dict(zip(*pairs.group_by(["word"]).aggregate([([], "count_all")]).to_pydict().values()))

    def run_once(name, spill_on):
        spec = dict(BASE_SPEC, input=dict(BASE_SPEC["input"], path=QUICKSTART_DATA),
                    bounding={"max_keys_per_user": bound},
                    output={"path": str(tmp_path / name)})
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        written = []
        if not spill_on:
            monkeypatch.setattr(release, "_spill_dir", lambda pipeline, staging: None)
        original = spill.write_piece
        monkeypatch.setattr(spill, "write_piece",
                            lambda table, folder: written.append(1) or original(table, folder))
        report = release.run(make_plan(spec_mod.load(str(path))),
                             rng_factory=keyed_random.seeded_for_tests(11))
        monkeypatch.undo()
        out = tmp_path / name
        assert sorted(os.listdir(out)) == ["release_report.json", "released.parquet"]
        released = pq.read_table(out / "released.parquet")
        columns = released.to_pydict()          # key, count and its interval (issue 27)
        return report, dict(zip(columns["word"], columns["count"])), len(written)

    for name, spill_on in (("spilled", True), ("in_memory", False)):
        report, got, pieces = run_once(name, spill_on)
        assert (pieces > 0) == spill_on
        assert got and set(got) <= set(truth)
        if bound != "auto":
            sigma = report["mechanism"]["sigma"]
            assert all(abs(got[w] - truth[w]) <= 7 * sigma for w in got)
    # no staging folder (where the spill folder lived) beside the outputs
    assert sorted(os.listdir(tmp_path)) == ["in_memory", "in_memory.yaml", "spilled", "spilled.yaml"]


@pytest.mark.parametrize("flags, spills", [
    ([], True),
    (["--direct_running_mode=multi_processing"], True),      # workers on this machine
    (["--environment_type=EXTERNAL", "--environment_config=localhost:1"], False),
    (["--environment_type=DOCKER"], False),
])
def test_spill_only_where_the_workers_share_this_disk(tmp_path, flags, spills):
    """The in-process runner with SDK workers elsewhere (EXTERNAL, DOCKER) keeps Beam's
    shuffle: a spill file written here could not be read there."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from thresher.pipelines.running import release
    from thresher.pipelines.running.live_metrics import LiveMetricsRunner
    pipeline = beam.Pipeline(runner=LiveMetricsRunner(), options=PipelineOptions(flags))
    folder = release._spill_dir(pipeline, str(tmp_path / "staging"))
    assert (folder is not None) == spills


def partial_counts(seed, tables, rows, words):
    """(``tables`` partial-count tables (word, __key, count) of ``rows`` rows over
    ``words`` words, the true count per word), drawn from a fixed seed."""
    from thresher.transforms.randomness.hashing import hash_array
    rng = np.random.default_rng(seed)
    partials, truth = [], {}
    for _ in range(tables):
        text = pa.array([f"w{j}" for j in rng.integers(0, words, rows)])
        counts = rng.integers(1, 5, rows)
        for w, c in zip(text.to_pylist(), counts.tolist()):
            truth[w] = truth.get(w, 0) + c
        partials.append(pa.table({"word": text, "__key": pa.array(hash_array(text), pa.uint64()),
                                  "count": pa.array(counts, pa.int64())}))
    return partials, truth


def test_key_shuffle_through_files_sums_as_the_in_memory_shuffle(tmp_path):
    """SumCountsPerKey with a spill folder: the same count per key as the runner's own
    shuffle (several partial rows per key across and within tables), pieces on disk."""
    from thresher.transforms.plumbing.aggregate import SumCountsPerKey
    partials, truth = partial_counts(seed=7, tables=6, rows=400, words=300)
    folder = str(tmp_path / "keys")

    def per_key(tables):
        return sorted((w, c) for t in tables for w, c in zip(t.column("word").to_pylist(),
                                                             t.column("count").to_pylist()))
    with test_pipeline.TestPipeline() as p:
        tables = p | beam.Create(partials)
        for name, spill_dir in (("Memory", None), ("Files", folder)):
            summed = tables | name >> SumCountsPerKey(["word"], 4, spill_dir=spill_dir)
            assert_that(summed | f"All{name}" >> beam.combiners.ToList()
                        | f"PerKey{name}" >> beam.Map(per_key),
                        equal_to([sorted(truth.items())]), label=f"Check{name}")
    assert os.listdir(folder)   # the key shards went through files
