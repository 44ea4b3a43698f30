"""Exclusive publishing: a release into an output folder is computed at most once at a time.

``thresher run`` holds an exclusive claim on ``output.path`` from before it reads any
data until the release is published or discarded (issue 13):

- **local folders**: an advisory ``flock`` on the file ``<output.path>.lock`` beside the
  folder. A second run into the same output finds the lock held and exits 2 at once,
  before computing anything; a run that finds the lock free re-checks the folder (an
  earlier run may have published meanwhile, and then ``--overwrite`` is needed). The
  kernel drops the lock when the process ends, however it ends, so a killed run never
  blocks the next one. The lock file is removed when the claim is released (then
  re-created by the next run: ``acquire`` checks it locked the file that is still at the
  path, so a run that removes it cannot let two runs in).
- **stale staging folders**: while the claim is held no other run can be writing into
  ``<output.path>.tmp-*`` or ``<output.path>.old-*``; such folders are leftovers of a run
  that was killed (SIGKILL, power loss) and are removed, with a warning naming them.
- **object storage** (gs://, s3://, ...): Beam's FileSystems have no atomic
  create-if-absent, so no claim can be made there; two concurrent runs into one remote
  output both compute, and the later publish replaces the earlier. Documented in
  docs/running.md; serialise remote releases in the scheduler that starts them.
"""
import fcntl
import glob
import logging
import os
import shutil

from thresher.pipelines.errors import SpecError

log = logging.getLogger("thresher")


class OutputClaim:
    """The exclusive claim on one local output folder (a context manager)."""

    def __init__(self, final):
        self.final = final.rstrip("/") or final
        self.lock_path = f"{self.final}.lock"
        self._fd = None

    def acquire(self):
        parent = os.path.dirname(os.path.abspath(self.lock_path))
        os.makedirs(parent, exist_ok=True)
        while True:
            fd = os.open(self.lock_path, os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise SpecError("output.path", f"another thresher run is writing a release "
                                f"into {self.final!r} (it holds {self.lock_path!r}); wait "
                                f"for it to finish or choose another output.path") from None
            try:
                same = os.stat(self.lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return self
            os.close(fd)        # the file was removed by the run that held it: lock anew

    def remove_stale_staging(self):
        """Delete staging and trash folders of earlier, killed runs into this output."""
        removed = []
        for pattern in (f"{self.final}.tmp-*", f"{self.final}.old-*"):
            for path in sorted(glob.glob(glob.escape(self.final) + pattern[len(self.final):])):
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
        if removed:
            log.warning("removed %d staging folder(s) left by an interrupted run: %s",
                        len(removed), ", ".join(removed))
        return removed

    def release(self):
        if self._fd is None:
            return
        try:
            os.unlink(self.lock_path)
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False


class _NoClaim:
    """Object storage: nothing can be claimed (see the module docstring)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def remove_stale_staging(self):
        return []


def claim(final):
    """The claim for ``output.path``: an :class:`OutputClaim` for a local folder."""
    if "://" in final:
        return _NoClaim()
    return OutputClaim(final)
