"""The shard-reader seam: everything above reads a shard's bytes through one small interface.

A ``ShardReader`` is one shard's (uncompressed) byte stream, opened once for a mount's life: its
size, an identity for cache validation, and ``pread`` of a byte range. That is all a new backend
must write. Three further calls have plain defaults built on ``pread`` and exist so that a backend
can be faster where it can:

- ``record``: one record's data, its checksum checked;
- ``borrow``: a large record's data for rendering, which a backend may read ahead (the local one
  does, on worker threads, when records are read in order);
- ``serve``: bytes of a large image left in the shard, answered as bytes, as memory the reader
  holds, or as a (descriptor, position, count) from which libfuse copies without Python.

Readers come from a ``Readers`` factory (one per mount: the local one shares its read-ahead pool
among all its readers). The index builder, the record store and the commit read through it.
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Union

from tfrfs.format import tfrecord

# What ``serve`` answers: the bytes, memory the reader holds (valid until the next call into it),
# or where they lie in a file the reader holds open: (descriptor, position, count).
Served = Union[bytes, memoryview, tuple[int, int, int]]

# ``borrow``'s look at the records after one: (header offset, data length) of record i, or None
# where reading ahead must stop (past the end, a record known to be bad).
Spans = Callable[[int], "tuple[int, int] | None"]

# What the caller makes of a borrowed record on a read-ahead worker: (index, header offset, data).
Prepare = Callable[[int, int, memoryview], Any]


@dataclass(eq=False)
class Borrowed:
    """A record's data lent by ``borrow``. ``prepared`` is a 1-tuple of what ``prepare`` made of it
    on a worker (None when it was not read ahead, or preparing failed). Call ``done`` once the
    data is no longer used (its memory may be read into again)."""

    data: memoryview
    prepared: tuple[Any] | None
    done: Callable[[], None]


class ShardReader(ABC):
    """One shard's uncompressed byte stream. A subclass sets ``size`` (the stream's length in
    bytes) and ``identity`` (changes whenever the bytes may have: what an index of them is
    validated against) when it opens the stream, and defines ``pread`` and ``close``."""

    size: int
    identity: str
    # Each ``pread`` is a request to a store that waits on a network (not a local file's read):
    # a caller that may choose reads as few as will do.
    reads_are_requests: bool = False

    @abstractmethod
    def pread(self, size: int, offset: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (fewer only at the end of the stream)."""

    @abstractmethod
    def close(self) -> None:
        """Let go of the stream; no call follows."""

    def fileno(self) -> int | None:
        """A descriptor of the stream that others may read from (libfuse, copy_file_range), if any."""
        return None

    def record(self, offset: int, length: int, *, verify: bool = True) -> bytes:
        """The data of the record whose header is at ``offset``; ``DataLoss`` when it is cut short
        or (``verify``) its data checksum fails."""
        return tfrecord.read_record(self.pread, offset, length, verify=verify)

    def borrow(self, index: int, offset: int, length: int, *, following: Spans | None = None,
               prepare: Prepare | None = None) -> Borrowed:
        """Record ``index``'s data (checked: ``DataLoss`` otherwise), lent for rendering. A backend
        may use ``following`` to read the next records ahead and ``prepare`` them on a worker."""
        data = memoryview(self.record(offset, length))
        return Borrowed(data, None, lambda: None)

    def serve(self, offset: int, size: int) -> Served:
        """``size`` bytes at ``offset``, which lie in a record already read and checked."""
        return self.pread(size, offset) if size > 0 else b""


class Readers(Protocol):
    """Opens shard readers for one mount (or one command)."""

    name: str   # for the log

    def open(self, path: str) -> ShardReader: ...
    def close(self) -> None: ...


class ReaderClass:
    """``Readers`` for a reader class that needs nothing shared: ``cls(path)`` opens one."""

    def __init__(self, cls: Callable[[str], ShardReader]) -> None:
        self.cls = cls
        self.name = getattr(cls, "__name__", repr(cls))

    def open(self, path: str) -> ShardReader:
        return self.cls(path)

    def close(self) -> None:
        pass


READER_ENV = "TFRFS_SHARD_READER"


def default_readers() -> Readers:
    """The local readers, or the reader class named ``module:Class`` in ``$TFRFS_SHARD_READER``
    (how the tests run the whole mount suite on another reader, proving the seam)."""
    spec = os.environ.get(READER_ENV)
    if spec:
        module, _, name = spec.partition(":")
        return ReaderClass(getattr(importlib.import_module(module), name))
    from tfrfs.storage.local_reader import LocalReaders
    return LocalReaders()
