"""Where a dataset's own small files are written beside its shards (SPEC 1.2, 6): the index files,
the manifest, TFDS ``dataset_info.json``; in a local folder or in a bucket.

What follows a commit or a repair (``manifest.follow``, ``tfds.update``) is the same steps in
every storage: look at a file (size, identity), read it, replace it whole, delete it. The
storage makes a replacement whole (a local file by a temporary file, fsync and rename; an object
by one PUT, which a bucket makes visible at once and whole), so no temporary object is needed for
these small files.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Iterable

from tfrfs.storage.base import Storage

if TYPE_CHECKING:
    from tfrfs.storage.base import ObjectInfo
    from tfrfs.storage.remote_reader import RemoteReaders


Seen = tuple[int, str, int]   # (size, identity, mtime_ns) of a file or object


class Place:
    """The files under one dataset root in one storage. What the source's listing said
    (``listed``) is trusted for files this place has not written since (no request); the others
    are looked up. Every object looked up is made known to ``readers``, so that a shard rewritten
    since the listing is read as it is now (its blocks are cached under its new identity)."""

    def __init__(self, storage: Storage, root: str, listed: Iterable["ObjectInfo"] = (), *, complete: bool = False,
                 readers: "RemoteReaders | None" = None) -> None:
        self.storage = storage
        self.root = root.rstrip("/") or root
        self.readers = readers
        self._listed = {o.url: o for o in listed}
        self._complete = complete      # the listing holds every file under the root
        self._asked: set[str] = set()  # written or deleted here since: look them up

    @classmethod
    def at(cls, root: str) -> "Place":
        """The files under ``root`` (a local folder or a URL), nothing listed beforehand."""
        from tfrfs.storage.factory import open_storage
        return cls(open_storage(root), root)

    def join(self, rel: str) -> str:
        """The path (or URL) of ``rel``, relative to the root."""
        return self.storage.join(self.root, rel.replace(os.sep, "/"))

    def stat(self, path: str) -> Seen | None:
        """Size, identity and time of ``path``, None when there is none."""
        obj = self._listed.get(path) if path not in self._asked else None
        if obj is not None:
            return obj.size, obj.identity, obj.mtime_ns
        if self._complete and path not in self._asked and path.startswith(self.root + "/"):
            return None
        got = self.storage.stat(path)
        if got is None or got.is_dir:
            return None
        if self.readers is not None:
            from tfrfs.storage.base import ObjectInfo
            self.readers.know([ObjectInfo(path, got.size, got.identity, got.mtime_ns)])
        return got.size, got.identity, got.mtime_ns

    def read(self, path: str) -> bytes:
        """Raises FileNotFoundError when there is none, OSError when it cannot be read."""
        if self.stat(path) is None:
            raise FileNotFoundError(path)
        return self.storage.read(path)

    def changed(self, path: str) -> None:
        """``path`` is written (or deleted) by other means: look it up from now on."""
        self._asked.add(path)

    def write(self, path: str, data: bytes) -> None:
        """Replace ``path`` whole (a reader sees the old bytes or the new, never a mix)."""
        self._asked.add(path)
        self.storage.write(path, data)

    def unlink(self, path: str) -> None:
        self._asked.add(path)
        self.storage.delete(path)
