"""The published ``released.parquet``: canonical row order and layout.

What a release publishes must be a function of the private output alone. The released
rows are therefore written in an order and layout fixed by the released (key, values)
set, the spec and the thresher version, never by how the input was read, sharded or
shuffled (issue 13; docs/privacy_testing.md, "Artifact-level threats"):

- **order**: rows sorted by the key columns, in the spec's column order, then by the other
  columns (ties only arise for kinds with several rows per key), ascending, by Arrow's
  type-aware comparison (numbers by value, strings and binaries by their bytes,
  dates by date); -0.0 and NaN never reach here (the reader folds -0.0 into 0.0 and drops
  NaN keys). A public key domain (``input.public_keys``) is written in the domain
  file's order instead: the domain is public, so is its order.
- **layout**: one file, row groups of exactly :data:`ROW_GROUP_ROWS` rows (the last one
  shorter), written by one writer with fixed options. The number of row groups is a
  function of the number of released rows; shard counts and input size never enter.
- **metadata**: the Arrow schema (a function of the spec and the input's column types,
  which the schema check reads from file metadata) and column statistics (minimum,
  maximum, null count: functions of the released rows). No timestamps, paths or counts.

:func:`canonical_table` and :func:`write` are the whole contract; the neighbour tests in
``tests/privacy/`` compare the published bytes of neighbouring datasets through them.
"""
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROW_GROUP_ROWS = 1 << 16
# Fixed writer options: the bytes depend on them, so they change only with the version.
_WRITE_OPTIONS = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": True,
    "write_statistics": True,
    "data_page_size": 1 << 20,
    "version": "2.6",
}


def canonical_table(tables, schema, key_columns, domain=None):
    """One table of every released row, conformed to ``schema`` and in canonical order.

    Args:
      tables: released pyarrow Tables (any number, any order, any chunking).
      schema: the output schema (key columns, then the kind's columns).
      key_columns: the key column names, in the spec's order.
      domain: the public key domain (a Table with the key columns) or None; when given,
        rows follow the domain's order.
    """
    tables = [t.select(schema.names).cast(schema) for t in tables if t.num_rows]
    if not tables:
        return schema.empty_table()
    table = pa.concat_tables(tables).combine_chunks()
    if domain is None:
        # Keys first; the other columns break ties (kinds with several rows per key, such
        # as quantiles' one row per rank), so the order is total on the released rows.
        others = [c for c in schema.names if c not in key_columns]
        # (nulls sort last: Arrow's default)
        order = pc.sort_indices(table, sort_keys=[(c, "ascending") for c in (*key_columns, *others)])
    else:
        order = _domain_order(table, domain, schema, key_columns)
    return table.take(order).combine_chunks()


def _domain_order(table, domain, schema, key_columns):
    """Row indices of ``table`` in the order its keys have in ``domain`` (ties, for kinds
    with several rows per key, broken by the other columns)."""
    keys = {k: domain.column(k).cast(schema.field(k).type) for k in key_columns}
    positions = pa.table({**keys, "__position": pa.array(np.arange(domain.num_rows))})
    rows = pa.table({**{k: table.column(k) for k in key_columns},
                     "__row": pa.array(np.arange(table.num_rows))})
    joined = rows.join(positions, list(key_columns), join_type="left outer", use_threads=False)
    if joined.column("__position").null_count:
        raise ValueError("a released key is not in the public key domain")
    position = np.empty(table.num_rows, dtype=np.int64)
    position[joined.column("__row").to_numpy()] = joined.column("__position").to_numpy()
    others = [c for c in schema.names if c not in key_columns]
    ranked = table.select(others).append_column("__position", pa.array(position))
    return pc.sort_indices(ranked, sort_keys=[("__position", "ascending"),
                                              *[(c, "ascending") for c in others]])


def write(table, sink):
    """Write a canonical table (:func:`canonical_table`) to ``sink`` (a local path or a
    writable binary file object) as Parquet with the fixed layout."""
    pq.write_table(table, sink, row_group_size=ROW_GROUP_ROWS, **_WRITE_OPTIONS)


def serialise(table):
    """The bytes :func:`write` produces for ``table``."""
    sink = pa.BufferOutputStream()
    write(table, sink)
    return sink.getvalue().to_pybytes()
