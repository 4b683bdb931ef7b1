"""Where a dataset's own small files are written beside its shards (SPEC 1.2, 6): the index files,
the manifest, TFDS ``dataset_info.json``; in a local folder or in a bucket.

What follows a commit or a repair (``manifest.follow``, ``tfds.update``) is the same steps in
both: look at a file (size, identity), read it, replace it whole, delete it. A ``LocalPlace``
replaces a file by a temporary file, fsync and rename; a ``BucketPlace`` by one PUT, which a
bucket makes visible at once and whole (a reader sees the old object or the new one), so no
temporary object is needed for these small files.
"""

from __future__ import annotations

import os
import posixpath
from typing import TYPE_CHECKING, Iterable, Protocol

if TYPE_CHECKING:
    from tfrfs.storage.remote_reader import RemoteReaders
    from tfrfs.storage.fsspec_store import ObjectInfo, Store


Seen = tuple[int, str, int]   # (size, identity, mtime_ns) of a file or object


class Place(Protocol):
    """The files under one dataset root."""

    root: str

    def join(self, rel: str) -> str:
        """The path (or URL) of ``rel``, relative to the root."""

    def stat(self, path: str) -> Seen | None:
        """Size, identity and time of ``path``, None when there is none."""

    def read(self, path: str) -> bytes:
        """Raises FileNotFoundError when there is none, OSError when it cannot be read."""

    def write(self, path: str, data: bytes) -> None:
        """Replace ``path`` whole (a reader sees the old bytes or the new, never a mix)."""

    def unlink(self, path: str) -> None: ...


class LocalPlace:
    """A local folder: files replaced by the durable path (temporary file, fsync, rename)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def join(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def stat(self, path: str) -> Seen | None:
        from tfrfs.index.shard_index import local_identity
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_size, local_identity(st), st.st_mtime_ns

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def write(self, path: str, data: bytes) -> None:
        from tfrfs.index.shard_index import SourceFiles
        SourceFiles(self.root).write_bytes(path, data)

    def unlink(self, path: str) -> None:
        from tfrfs.storage import durable
        durable.unlink(path)


class BucketPlace:
    """A prefix in a bucket (``s3://``, ``gs://``). What the source's listing said is trusted for
    objects this place has not written since (no request); the others are looked up. Every
    object looked up is made known to ``readers``, so that a shard rewritten since the listing
    is read as it is now (its blocks are cached under its new identity)."""

    def __init__(self, store: "Store", root: str, listed: Iterable["ObjectInfo"] = (), *, complete: bool = False,
                 readers: "RemoteReaders | None" = None) -> None:
        self.store = store
        self.root = root.rstrip("/")
        self.readers = readers
        self._listed = {o.url: o for o in listed}
        self._complete = complete      # the listing holds every object under the root
        self._asked: set[str] = set()  # written or deleted here since: look them up

    def join(self, rel: str) -> str:
        return posixpath.join(self.root, rel.replace(os.sep, "/"))

    def stat(self, path: str) -> Seen | None:
        from tfrfs.storage.fsspec_store import ObjectInfo, object_info
        obj = self._listed.get(path) if path not in self._asked else None
        if obj is None:
            if self._complete and path not in self._asked and path.startswith(self.root + "/"):
                return None
            try:
                info = self.store.info(path, fresh=True)
            except FileNotFoundError:
                return None
            if info.get("type") == "directory":
                return None
            got = object_info(self.store, {**info, "name": info.get("name", self.store.path_of(path))})
            obj = ObjectInfo(path, got.size, got.identity, got.mtime_ns)
            if self.readers is not None:
                self.readers.know([obj])
        return obj.size, obj.identity, obj.mtime_ns

    def read(self, path: str) -> bytes:
        if self.stat(path) is None:
            raise FileNotFoundError(path)
        store = self.store
        return bytes(store.call("read", path, lambda: store.fs.cat_file(store.path_of(path), timeout=store.timeout)))

    def changed(self, path: str) -> None:
        """``path`` is written (or deleted) by other means: look it up from now on."""
        self._asked.add(path)

    def write(self, path: str, data: bytes) -> None:
        from tfrfs.storage import durable
        durable.fault_point("write", path)
        self._asked.add(path)
        self.store.write_all(path, data)

    def unlink(self, path: str) -> None:
        from tfrfs.storage import durable
        durable.fault_point("unlink", path)
        self._asked.add(path)
        self.store.delete(path)
