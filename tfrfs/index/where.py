"""How a job, in whatever process, reaches a dataset's bytes: ``Where`` (small and picklable: what
a job carries) and what opens through it once per process (the storage and its shard readers),
with the plain stream of a shard read from there.

It lives with the indexes, below everything that runs shard jobs (``tfrfs.jobs``, a commit's
repacking in ``tfrfs.edit``, the Ray source), so each of them can carry one without importing
the others; ``tfrfs.jobs.runner`` holds the runners that carry it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, ContextManager, Iterator

from tfrfs.format import salvage
from tfrfs.format import tfrecord
from tfrfs.index.discovery import ShardFile, SourceFiles

if TYPE_CHECKING:
    from tfrfs.storage.base import Storage


@dataclass(frozen=True)
class Where:
    """How a job, in whatever process, reads a SOURCE's shards: the source as the user named it
    (a local path or a URL), the store options for a URL, and the cache directory (remote blocks
    and indexes). Small and picklable; ``readers()`` opens (once per process) what reads."""

    source: str
    options: tuple[tuple[str, Any], ...] = ()
    cache_dir: str | None = None

    @classmethod
    def of(cls, source: Any) -> "Where":
        """The ``Where`` of an opened ``sources.Source``."""
        return cls(source.name, tuple(sorted(source.storage.options.items())), str(source.cache_dir))

    def _open(self) -> tuple["Storage", Any]:
        """This process's storage of the source and its shard readers (shared by the jobs it runs)."""
        key = (self.source, self.options, self.cache_dir)
        with _opened_lock:
            found = _OPENED.get(key)
            if found is None:
                from tfrfs.index.cache_dir import default_cache_dir
                from tfrfs.storage.factory import open_storage
                storage = open_storage(self.source, dict(self.options) or None)
                cache = Path(self.cache_dir) if self.cache_dir else default_cache_dir()
                found = _OPENED[key] = (storage, storage.open_readers(cache))
            return found

    def storage(self) -> "Storage":
        return self._open()[0]

    def readers(self) -> Any:
        """This process's shard readers for the source (shared by the jobs it runs)."""
        return self._open()[1]

    def open_stream(self, path: str) -> BinaryIO:
        """The stored bytes of ``path`` as a stream (a compressed shard, to inflate)."""
        return self.storage().open_read(path)


_OPENED: dict[tuple, Any] = {}
_opened_lock = threading.Lock()


class WhereFiles(SourceFiles):
    """A job's way to a shard's stored bytes (a compressed shard, to inflate)."""

    def __init__(self, where: Where) -> None:
        super().__init__("/")
        self.where = where

    def open_stream(self, path: str) -> Any:
        return self.where.open_stream(path)

    def local_path(self, path: str) -> str | None:
        return self.where.storage().local_path(path)


def readers_of(where: Where, shard: ShardFile) -> Any:
    """``where``'s readers, told the shard's size and identity as the caller saw them (no look-up)."""
    readers = where.readers()
    know = getattr(readers, "know", None)
    if know is not None:
        from tfrfs.storage.base import ObjectInfo
        know([ObjectInfo(shard.path, shard.size, shard.identity, shard.mtime_ns)])
    return readers


def plain_stream(where: Where, shard: ShardFile) -> ContextManager[tuple[tfrecord.PRead, int, Any]]:
    """(pread, size, the problem that ended the inflation or None) of the shard's plain stream,
    reached from any process through ``where``: read in place, or inflated into a temporary file
    first (GZIP, ZLIB)."""
    return stream_of(shard, lambda: readers_of(where, shard).open(shard.path), where.open_stream)


@contextlib.contextmanager
def stream_of(shard: ShardFile, open_reader: Callable[[], Any],
              open_stored: Callable[[str], Any]) -> Iterator[tuple[tfrecord.PRead, int, Any]]:
    """``plain_stream`` through the given openers: ``open_reader()`` a reader of an uncompressed
    shard, ``open_stored(path)`` the stored bytes of a compressed one."""
    if shard.compression == tfrecord.NONE:
        reader = open_reader()
        try:
            yield reader.pread, reader.size, None
        finally:
            reader.close()
        return
    with tempfile.TemporaryFile() as tmp:
        with open_stored(shard.path) as src:
            problem = salvage.inflate(src, tmp, shard.compression)
        tmp.flush()
        fd = tmp.fileno()
        yield (lambda n, off: os.pread(fd, n, off)), os.fstat(fd).st_size, problem
