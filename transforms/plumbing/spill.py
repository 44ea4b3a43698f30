"""Spilled shuffle pieces: Arrow IPC files in a scratch folder, so that a shuffle moves
file names instead of bytes.

Why: Beam's in-process runner (FnApiRunner) keeps every shuffle in memory, and holds each
shuffled byte three to four times (the grouped buffer, its re-encoded output, the data
channel's copy for the worker, the decoded element), so the user shuffle of a release —
every input row — made peak RSS grow by ~110-160 bytes per input row (docs/performance.md).
With a spill folder each user-shard piece is written once to a file and only
``(shard, file name)`` goes through the GroupByKey; the consumer reads one shard's pieces
at a time. Memory then holds one shard (~1e6 rows, ``pipelines.io.num_shards_for``),
not the input.

The pieces are written by the splitting DoFn under fresh random names, so a retried or
repeated bundle writes new files and only the names its committed output carries are
read; unread files are removed with the folder (``pipelines.running.release`` puts it under the
release's staging folder as ``beam-temp-user-shuffle``, which is deleted after the
pipeline and with the staging folder on failure). Nothing in the folder is published.
The same tables reach the consumers as through the in-memory shuffle, so the release is
unchanged (tests/transforms/plumbing/test_spill.py).
"""
import os
import uuid

import apache_beam as beam
import pyarrow as pa

SPILL_FOLDER = "beam-temp-user-shuffle"

# A splitting DoFn whose pieces are spilled holds about PIECE_ROWS rows per shard on
# average before it writes them (each table is split as it comes, its pieces held as
# slices: ``tables.ShardSlices``): every piece is a file written, opened, read and deleted,
# and the shards grow with the input (``pipelines.dataio.io.num_shards_for``), so writing
# each table's pieces as it comes makes tables x shards files, rows^2 (1e8 rows: 19,100
# files in the user shuffle and 10,000 in the key shuffle, ~12 s of CPU in the files
# alone). The wait is
# capped at SPLIT_MAX_ROWS rows held at once (~80 MB of prepared rows), so beyond 128 shards
# (1.3e8 rows) the pieces shrink again rather than memory growing. It changes only how the
# rows are cut into pieces, never which rows reach a shard.
PIECE_ROWS = 1 << 14
SPLIT_MAX_ROWS = 1 << 21


def split_rows(num_shards):
    """Rows a splitting DoFn gathers (within a bundle) before it writes spilled pieces."""
    return min(int(num_shards) * PIECE_ROWS, SPLIT_MAX_ROWS)


def write_piece(table, folder):
    """Write ``table`` to a new Arrow IPC file in ``folder``; returns its path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{uuid.uuid4().hex}.arrow")
    with pa.OSFile(path + ".part", "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    os.replace(path + ".part", path)   # a reader never sees a half-written piece
    return path


def read_piece(path):
    """The table written by :func:`write_piece` (read into memory, not mapped), or one
    piece of a file written by :func:`write_pieces` (a ``(path, batch)`` reference)."""
    if isinstance(path, tuple):
        path, batch = path
        with pa.OSFile(path, "rb") as source:
            return pa.Table.from_batches([pa.ipc.open_file(source).get_batch(batch)])
    with pa.OSFile(path, "rb") as source:
        return pa.ipc.open_file(source).read_all()


# A reference to one piece of a file of several (:func:`write_pieces`): (path, batch).
PIECE_REF = beam.typehints.Tuple[str, int]
# (key shard, reference): the element type of spilled pieces before their group.
SHARD_AND_PIECE_REF = beam.typehints.Tuple[int, PIECE_REF]


def write_pieces(keyed_tables, folder):
    """Write the tables of ``[(key, pyarrow.Table)]`` (one schema) as the record batches
    of one new Arrow IPC file in ``folder`` (one file instead of one per table: a step
    that emits many small pieces per element, e.g. the automatic bound's key-shard
    partials, creates, renames and later removes one file per element instead of one per
    piece); returns ``[(key, (path, batch))]``, each reference read back by
    :func:`read_piece` as its table (each table is written as one batch)."""
    keyed_tables = list(keyed_tables)
    if not keyed_tables:
        return []
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{uuid.uuid4().hex}.arrow")
    schema = keyed_tables[0][1].schema
    with pa.OSFile(path + ".part", "wb") as sink:
        with pa.ipc.new_file(sink, schema) as writer:
            for _, table in keyed_tables:
                writer.write_batch(_one_batch(table, schema))
    os.replace(path + ".part", path)   # a reader never sees a half-written file
    return [(key, (path, batch)) for batch, (key, _) in enumerate(keyed_tables)]


def _one_batch(table, schema):
    """``table`` (of ``schema``) as a single record batch."""
    if not table.schema.equals(schema):
        raise ValueError(f"write_pieces: the tables' schemas differ: {table.schema} "
                         f"against {schema}")
    batches = table.combine_chunks().to_batches()
    if len(batches) == 1:
        return batches[0]
    return pa.RecordBatch.from_arrays([table.column(i).combine_chunks()
                                       for i in range(table.num_columns)], schema=schema)


def read_piece_columns(path, columns):
    """Some columns of a piece, through a memory map (the other columns are not read)."""
    with pa.memory_map(path, "rb") as source:
        return pa.ipc.open_file(source).read_all().select(list(columns)).combine_chunks()


def _spill_value(key_and_table, folder):
    key, table = key_and_table
    return key, write_piece(table, folder)


def _read_values(key_and_paths):
    key, paths = key_and_paths
    return key, [read_piece(path) for path in paths]


class SpilledGroupByKey(beam.PTransform):
    """GroupByKey of (key, pyarrow.Table) pairs whose tables travel as files in
    ``folder`` (see the module docstring): PCollection[(key, Table)] ->
    PCollection[(key, [Table])], the same groups as ``beam.GroupByKey()``. The writing
    step fuses with the producer, so the runner holds only file names."""

    def __init__(self, folder, label=None):
        super().__init__(label)
        self._folder = folder

    def expand(self, pairs):
        return (pairs
                | "Spill" >> beam.Map(_spill_value, folder=self._folder)
                | "GroupByKey" >> beam.GroupByKey()
                | "Read" >> beam.Map(_read_values))


def group_by_key(folder):
    """``SpilledGroupByKey(folder)``, or the runner's ``beam.GroupByKey()`` when
    ``folder`` is None."""
    return beam.GroupByKey() if folder is None else SpilledGroupByKey(folder)


class GroupSpilledByKey(beam.PTransform):
    """GroupByKey of (key, piece reference) pairs whose tables were spilled by their
    producer (:func:`write_pieces`): PCollection[(key, (path, batch))] ->
    PCollection[(key, [Table])], the groups :class:`SpilledGroupByKey` gives for the same
    tables."""

    def expand(self, pairs):
        return (pairs
                | "GroupByKey" >> beam.GroupByKey()
                | "Read" >> beam.Map(_read_values))
