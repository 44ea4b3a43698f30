"""Where a spec's paths point: the files an input path names, and the resolved form of a
relative path for error messages."""
import glob
import os

from thresher.pipelines.errors import SpecError


def resolved(path):
    """" (resolved: /abs/path)" for a relative local path, so an error shows where it looked."""
    if "://" in path or os.path.isabs(path):
        return ""
    return f" (resolved: {os.path.abspath(path)})"


def input_files(input_spec):
    """The files an input path names (a file, a glob, or a folder of files); SpecError if none.

    Remote paths (gs://, s3://, ...) are matched through Beam's FileSystems."""
    path = input_spec.path
    if "://" in path:
        from apache_beam.io.filesystems import FileSystems  # heavy: apache_beam
        try:
            matches = FileSystems.match([path])[0].metadata_list
        except Exception as exc:  # noqa: BLE001 - any filesystem failure is reported as such
            raise SpecError("input.path", f"cannot list {path!r}: {exc}") from None
        files = sorted(m.path for m in matches)
    elif os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path)
                       if not f.startswith((".", "_")) and os.path.isfile(os.path.join(path, f)))
    elif glob.has_magic(path):
        files = sorted(f for f in glob.glob(path) if os.path.isfile(f))
    else:
        files = [path] if os.path.isfile(path) else []
    if not files:
        if glob.has_magic(path):
            what = "matches no files"
        elif os.path.isdir(path):
            what = "is a folder with no input files in it (names starting with . or _ are skipped)"
        elif os.path.exists(path):
            what = "is not a regular file (a FIFO, socket or device); give a file or a folder"
        else:
            what = "does not exist"
        raise SpecError("input.path", f"{path!r}{resolved(path)} {what}")
    return files
