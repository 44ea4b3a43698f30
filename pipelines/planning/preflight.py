"""Checks ``thresher validate`` and ``thresher run`` make before any row is read, beyond
the spec and the input schema (``pipelines.io.check_input``): that the output folder can
be written. ``publish.check_output`` decides whether an existing release may be replaced;
this decides whether anything can be created there at all (a path under /proc, a
read-only or immutable folder, a parent that is a file)."""
import os
import shutil
import uuid

from thresher.pipelines.errors import SpecError


def check_output_writable(path):
    """SpecError naming output.path unless a folder can be created beside it (local paths;
    remote object stores are checked by the runner when it writes)."""
    if "://" in path:
        return
    target = os.path.abspath(path)
    parent = os.path.dirname(target)
    existing = parent
    while not os.path.exists(existing):
        up = os.path.dirname(existing)
        if up == existing:
            break
        existing = up
    if not os.path.isdir(existing):
        raise SpecError("output.path", f"{path!r} cannot be created: {existing!r} is not a folder")
    # Create (and remove) a probe folder where the release's staging folder will go: the
    # only test that is right for read-only mounts, immutable folders, /proc and root alike.
    _probe(existing, f"{path!r} cannot be written: creating a folder in {existing!r} failed")
    if os.path.isdir(target):
        _probe(target, f"{path!r} cannot be written")


def _probe(folder, message):
    """Create and remove a probe folder in ``folder``; SpecError(output.path) if it fails."""
    probe = os.path.join(folder, f".thresher-probe-{uuid.uuid4().hex[:12]}")
    try:
        os.mkdir(probe)
    except OSError as exc:
        raise SpecError("output.path", f"{message} ({exc.strerror or type(exc).__name__})") from None
    shutil.rmtree(probe, ignore_errors=True)
