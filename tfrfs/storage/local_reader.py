"""Shards on the local disk, read through descriptors opened once, with the local fast paths.

- ``serve`` answers with the shard's descriptor and a position, so libfuse copies a large image
  from the shard's page cache into the reply in C (``read_buf``), without passing through Python.
- ``borrow`` reads a large record into a reused buffer; when a shard's large records are read in
  order (from the second in a row on), the next ones are read and checked on worker threads
  (``readahead``) while the current one is served. Either way the record goes through the page
  cache, so its images, served from the shard, come from memory.

Readers are used by several threads at once (a read-only mount's FUSE workers): reads are
``os.pread``s (no shared file position), and the buffer a large record is read into is each
thread's own, or the read-ahead's until the record is rendered.

A mount reads each shard through the descriptor it opened at start, so a shard file that another
process replaces never mixes this mount's offsets with the new file's bytes.
"""

from __future__ import annotations

import os
import threading

from tfrfs.format import tfrecord
from tfrfs.storage.readahead import MAX_AHEAD, ReadAhead, Record
from tfrfs.storage.readers import Borrowed, Prepare, Served, ShardReader, Spans

_SEQUENTIAL_BLOCK = 1 << 20   # reads this large, in order, have the next ones asked for ...
_AHEAD_BLOCKS = 4             # ... this many reads ahead
_SCRATCH_MAX = 64 << 20       # the buffer large records are read into is kept up to this size


def advise(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to read bytes [offset, offset + length) of ``fd`` into the page cache in
    the background (``POSIX_FADV_WILLNEED``); nothing where the call is missing or refused."""
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
    except (AttributeError, OSError):
        pass


class LocalReaders:
    """Opens local shard files; its readers share one read-ahead pool and the buffers it fills."""

    name = "local"

    def __init__(self) -> None:
        self.ahead = ReadAhead()
        self._scratch = threading.local()   # .buf: the buffer a large record is read into

    def open(self, path: str) -> "LocalReader":
        return LocalReader(path, self)

    def close(self) -> None:
        self.ahead.close()

    def scratch(self, size: int) -> bytearray:
        """A buffer of at least ``size`` bytes, the calling thread's own (reused by its next call)."""
        buf = getattr(self._scratch, "buf", None)
        if buf is None or len(buf) < size:
            buf = bytearray(size)
            if len(buf) <= _SCRATCH_MAX:
                self._scratch.buf = buf
        return buf


class LocalReader(ShardReader):
    """One local file (a shard, or the decompressed stream of a GZIP/ZLIB shard)."""

    def __init__(self, path: str, shared: LocalReaders | None = None) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        st = os.fstat(self.fd)
        self.size = st.st_size
        self.identity = f"{st.st_size}:{st.st_mtime_ns}"
        self._shared = shared or LocalReaders()
        self._last_borrowed: int | None = None
        self._sequential = 0       # where a large read in order would start next

    def pread(self, size: int, offset: int) -> bytes:
        if size >= _SEQUENTIAL_BLOCK:
            self._ahead_of(size, offset)
        return os.pread(self.fd, size, offset)

    def _ahead_of(self, size: int, offset: int) -> None:
        """Large reads in order (a walk of the shard: index, verify, repair) ask the kernel for
        the next blocks while this one is read and looked at, so the disk and the walk overlap."""
        if offset == self._sequential:
            advise(self.fd, offset + size, _AHEAD_BLOCKS * size)
        self._sequential = offset + size

    def fileno(self) -> int | None:
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def record(self, offset: int, length: int, *, verify: bool = True) -> bytes:
        return tfrecord.read_record(self.fd, offset, length, verify=verify)

    def serve(self, offset: int, size: int) -> Served:
        return (self.fd, offset, size) if size > 0 else b""

    def borrow(self, index: int, offset: int, length: int, *, following: Spans | None = None,
               prepare: Prepare | None = None) -> Borrowed:
        ahead = self._shared.ahead.take((self, index))
        if ahead is None:
            buf = self._shared.scratch(length + tfrecord.FOOTER)
            data = tfrecord.read_record_into(self.fd, offset, length, buf)
            self._read_ahead(index, False, following, prepare)
            return Borrowed(data, None, data.release)
        self._read_ahead(index, True, following, prepare)
        return Borrowed(ahead.data(), ahead.prepared, lambda: self._shared.ahead.give_back(ahead))

    def _read_ahead(self, index: int, was_ahead: bool, following: Spans | None, prepare: Prepare | None) -> None:
        """Start reading the records after ``index`` (as many as ``MAX_AHEAD``) when the shard's
        large records are being read in order (this one was read ahead, or follows the last one).
        (Threads reading the shard at once may see each other's last record: that only changes
        what is read ahead, never what a read gives; ``start`` reads a record once.)"""
        previous, self._last_borrowed = self._last_borrowed, index
        if following is None or not (was_ahead or previous == index - 1):
            return
        for nxt in range(index + 1, index + 1 + MAX_AHEAD):
            span = following(nxt)
            if span is None:
                return
            offset, length = span
            job = None if prepare is None else _Preparing(prepare, nxt, offset)
            self._shared.ahead.start((self, nxt), self.fd, offset, length, job)


class _Preparing:
    """``prepare`` for one record, in the form the read-ahead workers call."""

    __slots__ = ("prepare", "index", "offset")

    def __init__(self, prepare: Prepare, index: int, offset: int) -> None:
        self.prepare, self.index, self.offset = prepare, index, offset

    def __call__(self, record: Record) -> tuple[object]:
        data = record.data()
        try:
            return (self.prepare(self.index, self.offset, data),)
        finally:
            data.release()
