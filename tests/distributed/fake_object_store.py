"""A Beam FileSystem with object-store semantics, for tests: scheme ``thresherobj://``.

Like GCS or S3 (and unlike a local disk) it has no folders: an object exists only once
written, listing is by name prefix, ``mkdirs`` does nothing, ``rename`` is copy then
delete, and deleting a "folder" deletes nothing unless the path ends with ``/``. Objects
are kept as files under ``ObjectStoreFileSystem.root`` (set by the test; empty parent
folders are pruned so no folder outlives its objects). Importing this module registers
the scheme with Beam's FileSystems (Beam finds FileSystem subclasses by their scheme);
it works in-process only (the default runner), as the root is a class attribute.
"""
import os
import shutil

from apache_beam.io.filesystem import (BeamIOError, CompressedFile, CompressionTypes,
                                       FileMetadata, FileSystem)

SCHEME = "thresherobj"


class ObjectStoreFileSystem(FileSystem):
    root = None

    @classmethod
    def scheme(cls):
        return SCHEME

    # -- names ---------------------------------------------------------------------------
    def _local(self, path):
        if not path.startswith(SCHEME + "://"):
            raise ValueError(f"not a {SCHEME}:// path: {path!r}")
        if self.root is None:
            raise BeamIOError("ObjectStoreFileSystem.root is not set")
        return os.path.join(self.root, path[len(SCHEME) + 3:])

    def _url(self, local):
        return f"{SCHEME}://" + os.path.relpath(local, self.root).replace(os.sep, "/")

    def join(self, basepath, *paths):
        out = basepath
        for p in paths:
            out = out.rstrip("/") + "/" + p.lstrip("/")
        return out

    def split(self, path):
        head, _, tail = path.rstrip("/").rpartition("/")
        return head, tail

    def mkdirs(self, path):
        pass  # object stores have no folders

    def has_dirs(self):
        return False

    def _list(self, dir_or_prefix):
        base = self._local(dir_or_prefix)
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                local = os.path.join(dirpath, name)
                if local.startswith(base):
                    yield FileMetadata(self._url(local), os.path.getsize(local),
                                       os.path.getmtime(local))

    # -- objects -------------------------------------------------------------------------
    def _is_object(self, path):
        return os.path.isfile(self._local(path))

    def create(self, path, mime_type="application/octet-stream",
               compression_type=CompressionTypes.AUTO):
        local = self._local(path)
        os.makedirs(os.path.dirname(local), exist_ok=True)
        return self._wrap(open(local, "wb"), path, compression_type)

    def open(self, path, mime_type="application/octet-stream",
             compression_type=CompressionTypes.AUTO):
        if not self._is_object(path):
            raise BeamIOError("Open failed", {path: FileNotFoundError(path)})
        return self._wrap(open(self._local(path), "rb"), path, compression_type)

    @staticmethod
    def _wrap(handle, path, compression_type):
        compression_type = FileSystem._get_compression_type(path, compression_type)
        if compression_type == CompressionTypes.UNCOMPRESSED:
            return handle
        return CompressedFile(handle, compression_type=compression_type)

    def copy(self, source_file_names, destination_file_names):
        errors = {}
        for src, dst in zip(source_file_names, destination_file_names):
            try:
                if not self._is_object(src):
                    raise FileNotFoundError(src)
                os.makedirs(os.path.dirname(self._local(dst)), exist_ok=True)
                shutil.copyfile(self._local(src), self._local(dst))
            except OSError as exc:
                errors[(src, dst)] = exc
        if errors:
            raise BeamIOError("Copy operation failed", errors)

    def rename(self, source_file_names, destination_file_names):
        self.copy(source_file_names, destination_file_names)
        self.delete(source_file_names)

    def exists(self, path):
        return self._is_object(path)

    def size(self, path):
        return os.path.getsize(self._local(path))

    def last_updated(self, path):
        return os.path.getmtime(self._local(path))

    def checksum(self, path):
        return str(self.size(path))

    def metadata(self, path):
        if not self._is_object(path):
            raise BeamIOError(f"Path does not exist: {path}")
        return FileMetadata(path, self.size(path), self.last_updated(path))

    def delete(self, paths):
        for path in paths:
            if path.endswith("/"):
                for meta in list(self._list(path)):
                    self._remove(meta.path)
            elif self._is_object(path):
                self._remove(path)

    def _remove(self, path):
        local = self._local(path)
        os.remove(local)
        parent = os.path.dirname(local)
        while parent != self.root and os.path.isdir(parent) and not os.listdir(parent):
            os.rmdir(parent)
            parent = os.path.dirname(parent)

    def report_lineage(self, path, lineage):
        pass
