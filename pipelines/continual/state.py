"""The horizon's state, kept in a folder beside the ledger and verified before use.

``<ledger>.continual/<dataset>--<name>-<digest>/`` holds:

- ``secret``: the horizon's 32-byte secret (mode 0600), drawn once from ``os.urandom`` at
  the first run of period 1. Every random value of every period (user identities, the
  bounding priorities, the node noise) is a keyed PRF of it
  (``transforms.randomness.keyed_random``), so a node's noise is the same in every period
  that reads it and no noise is stored. Like the input, it must stay readable by the
  operator only: whoever holds it and the published counts can remove the noise.
- ``horizon.json``: the spec's and the plan's digests, the horizon, the ledger run token
  of the one charge (written *before* the charge, so a crash between the two is repaired
  by re-running period 1: the ledger charges a token once).
- ``users-<sha256>.parquet``: every (user identity, key, first_period) pair counted so far
  (at most C per user over the horizon); ``released-<sha256>.parquet``: every released key
  with its first period. Content-addressed: a file is never rewritten in place.
- ``head.json``: the last published period, the two files' names and digests, and the
  digests of every published period's files. Replacing it (write, fsync, rename) is the
  commit of a period; a file whose digest does not match head.json is refused.
- ``lock``: an exclusive ``flock`` held by the run (two runs of one horizon at once are
  refused).
"""
import contextlib
import fcntl
import hashlib
import json
import os
import re

import pyarrow as pa
import pyarrow.parquet as pq

from thresher.pipelines.errors import SpecError

SECRET_BYTES = 32
HEAD, HORIZON, SECRET, LOCK = "head.json", "horizon.json", "secret", "lock"
# The digests of the period being published, written before its folder appears: a re-run
# after a crash must publish those bytes or nothing, even when the folder was removed.
PENDING = "pending.json"


def folder_for(budget, name):
    """The state folder of (ledger, dataset, release name)."""
    ledger = os.path.abspath(budget.ledger)
    digest = hashlib.sha256(f"{budget.dataset}\0{name}".encode("utf-8")).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{budget.dataset}--{name}")[:80]
    return os.path.join(ledger + ".continual", f"{safe}-{digest}")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_atomic(path, data):
    """Write bytes to ``path`` through a temporary file, fsync, rename."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


def _fsync_dir(folder):
    fd = os.open(folder or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def json_bytes(document):
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8")


def table_bytes(table):
    """A table's Parquet bytes (deterministic for one pyarrow version)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


class State:
    """The opened state folder of one horizon (module docstring)."""

    def __init__(self, folder):
        self.folder = folder
        self._lock = None

    @contextlib.contextmanager
    def locked(self):
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(self.folder, LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SpecError("continual", f"another run of this horizon holds its state "
                                f"{self.folder!r}; wait for it to end") from None
            yield self
        finally:
            os.close(fd)

    def path(self, name):
        return os.path.join(self.folder, name)

    # ---- the secret -----------------------------------------------------------------
    def secret(self, create):
        path = self.path(SECRET)
        if not os.path.exists(path):
            if not create:
                raise SpecError("continual", f"the horizon's secret {path!r} is missing: a "
                                f"continual release cannot go on without it (restore the state "
                                f"folder from a backup)")
            data = os.urandom(SECRET_BYTES)
            fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(path + ".tmp", path)
            _fsync_dir(self.folder)
        with open(path, "rb") as f:
            data = f.read()
        if len(data) != SECRET_BYTES:
            raise SpecError("continual", f"the horizon's secret {path!r} is damaged "
                            f"({len(data)} bytes, not {SECRET_BYTES})")
        return data

    # ---- documents -------------------------------------------------------------------
    def read_json(self, name):
        path = self.path(name)
        if not os.path.exists(path):
            return None
        try:
            with open(path, "rb") as f:
                return json.loads(f.read().decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise SpecError("continual", f"the state file {path!r} is damaged ({exc})") from None

    def write_json(self, name, document):
        write_atomic(self.path(name), json_bytes(document))

    def head(self):
        """head.json, or the head before period 1."""
        return self.read_json(HEAD) or {"period": 0, "users": None, "released": None,
                                        "outputs": {}}

    def read_table(self, entry):
        """A state table named in head.json, after checking its digest."""
        path = self.path(entry["file"])
        if not os.path.exists(path) or sha256_file(path) != entry["sha256"]:
            raise SpecError("continual", f"the state file {path!r} is missing or does not match "
                            f"its digest in {HEAD}: the state was changed outside thresher; "
                            f"restore the state folder")
        return pq.read_table(path)

    def write_table(self, prefix, table):
        """Write a content-addressed state table; returns its head entry."""
        data = table_bytes(table)
        digest = hashlib.sha256(data).hexdigest()
        name = f"{prefix}-{digest}.parquet"
        if not os.path.exists(self.path(name)):
            write_atomic(self.path(name), data)
        return {"file": name, "sha256": digest}

    def remove_unreferenced(self, head):
        keep = {head[k]["file"] for k in ("users", "released") if head.get(k)}
        for name in os.listdir(self.folder):
            if name.endswith(".parquet") and name not in keep:
                os.remove(self.path(name))
            elif name.endswith(".tmp"):
                os.remove(self.path(name))
