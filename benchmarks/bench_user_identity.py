"""The read-path cost of the secret-keyed user identity (issue 25, F1).

Measures, for a thresher checkout (``--root``, default this one, so an older checkout can
be measured with the same script), with string user ids (``u<n>``, as
:mod:`benchmarks.datagen` writes them) and with integer ids (the same ids as int64):

- ``read``: ``pipelines.io.prepare_batch`` over the input's 100k-row row groups, in one
  fresh process: rows/s, wall and CPU seconds (the read path alone: drop, identify users,
  hash keys), and beside it the seconds of reading the row groups as the release does;
- ``run``: ``thresher run`` end to end on Beam's default runner (gaussian, C = 8,
  eps = 1, delta = 1e-8), in a fresh process (``bench_release.measure``): wall, CPU,
  rows/s.

Data: ``bench_release.ensure_data`` (``--rows`` rows, users = vocabulary = rows / 10,
seed 8); the integer variant is written beside it. Every figure is printed with the
1-minute load average at its start and end: the machine is shared.

    python benchmarks/bench_user_identity.py --rows 1e7
    python benchmarks/bench_user_identity.py --rows 1e7 --root /path/to/older/checkout
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def int_data(path):
    """The string-id data with ``user_id`` as int64 (``u123`` -> 123), written once."""
    out = path.replace(".parquet", "_intids.parquet")
    if not os.path.exists(out):
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
        table = pq.read_table(path)
        ids = pc.cast(pc.utf8_slice_codeunits(table.column("user_id"), 1), pa.int64())
        table = table.set_column(0, "user_id", ids)
        pq.write_table(table, out + ".part", row_group_size=100_000, compression="zstd")
        os.replace(out + ".part", out)
    return out


def _read_main(path):
    """In a fresh process with the measured checkout first on sys.path: each row group
    read as the release reads it (``io._read_row_group``: text keys, and since issue 34
    a text user column, as dictionaries; then the keys decoded), then ``prepare_batch``.
    Both are timed: reading a column as a dictionary costs in the read what it saves in
    the identity."""
    import pyarrow.parquet as pq
    from thresher.pipelines.dataio import io as pio
    from thresher.pipelines.dataio.io import prepare_batch
    try:   # the public test key, asked for by name (an older checkout has no such argument)
        from thresher.transforms.randomness.user_identity import TEST_KEY
    except ImportError:
        TEST_KEY = None
    columns = ["user_id", "word"]
    handle = pq.ParquetFile(path)
    rows, wall, cpu, read_wall, read_cpu = 0, 0.0, 0.0, 0.0, 0.0
    for group in range(handle.metadata.num_row_groups):
        w0, c0 = time.perf_counter(), time.process_time()
        if hasattr(pio, "_read_row_group"):
            try:
                table, text_keys = pio._read_row_group(path, group, columns, ["word"],
                                                       "user_id")
            except TypeError:   # before issue 34: no user argument
                table, text_keys = pio._read_row_group(path, group, columns, ["word"])
            if not hasattr(pio, "_text_dictionary"):   # since issue 43 prepare decodes
                table = pio._decoded(table, text_keys)
        else:
            table = handle.read_row_group(group, columns=columns)
        read_wall += time.perf_counter() - w0
        read_cpu += time.process_time() - c0
        w0, c0 = time.perf_counter(), time.process_time()
        prepared, _ = prepare_batch(table, "user_id", ["word"], identity_key=TEST_KEY)
        wall += time.perf_counter() - w0
        cpu += time.process_time() - c0
        rows += prepared.num_rows
    print(json.dumps({"rows": rows, "wall": wall, "cpu": cpu, "read_wall": read_wall,
                      "read_cpu": read_cpu}))


def measure_read(root, path, python=None):
    """The read path of the thresher that ``python`` imports (default: this interpreter,
    with ``root`` first on the path)."""
    load0 = os.getloadavg()[0]
    env = dict(os.environ, PYTHONPATH=root) if python is None else dict(os.environ)
    proc = subprocess.run([python or sys.executable, os.path.abspath(__file__), "_read", path],
                          cwd=root if python is None else "/",
                          env=env, capture_output=True, text=True, check=True)
    m = json.loads(proc.stdout.strip().splitlines()[-1])
    m["load"] = (load0, os.getloadavg()[0])
    return m


def measure_run(root, path, work, name):
    from benchmarks import bench_release as br
    config, _ = br.write_config(work, name, path, "gaussian", br.BOUND)
    m = br.measure([sys.executable, "-m", "thresher.pipelines.cli", "run", config, "--overwrite",
                    "--quiet"], cwd=root)
    if m["rc"] != 0:
        raise SystemExit(f"thresher run failed in {root}: {m['stderr'][-2000:]}")
    return m


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=lambda s: int(float(s)), default=10_000_000)
    parser.add_argument("--root", default=ROOT, help="the thresher checkout to measure")
    parser.add_argument("--only", default="read,run")
    parser.add_argument("--python", action="append", default=[],
                        help="read: also measure the thresher this interpreter imports "
                             "(a virtualenv of another checkout), in turns with this one")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "benchmarks", "data"))
    parser.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    args = parser.parse_args(argv)
    from benchmarks import bench_release as br
    import tempfile
    strings = br.ensure_data(args.data_dir, args.rows, 8)
    inputs = {"string ids": strings, "int ids": int_data(strings)}
    work = args.work or tempfile.mkdtemp(prefix="bench_identity_")
    root = os.path.abspath(args.root)
    print(f"# checkout {root}, {args.rows:,} rows")
    print("| path | ids | rows/s | wall s | cpu s | read row groups: wall s, cpu s "
          "| load start-end |")
    print("|---|---|---|---|---|---|---|")
    only = args.only.split(",")
    for ids, path in inputs.items():
        for _ in range(args.rounds if "read" in only else 0):
            for python in [None] + args.python:
                m = measure_read(root, path, python)
                name = "read (prepare_batch)" + (f" [{python}]" if python else "")
                print(f"| {name} | {ids} | {m['rows'] / m['wall']:,.0f} | "
                      f"{m['wall']:.2f} | {m['cpu']:.2f} | {m['read_wall']:.2f}, "
                      f"{m['read_cpu']:.2f} | {m['load'][0]:.1f}-{m['load'][1]:.1f} |",
                      flush=True)
        if "run" in only:
            m = measure_run(root, path, work, f"identity_{ids.split()[0]}")
            print(f"| thresher run (gaussian, C=8) | {ids} | {args.rows / m['wall']:,.0f} | "
                  f"{m['wall']:.2f} | {m['cpu']:.2f} | | {m['load'][0]:.1f}-{m['load'][1]:.1f} |",
                  flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "_read":
        sys.path.insert(0, os.getcwd())
        _read_main(sys.argv[2])
    else:
        main()
