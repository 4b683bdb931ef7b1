"""Files open for writing in a writable mount. Both kinds answer the whole ``nodes.FileHandle``
protocol, so the FUSE adapter drives every open file the same way."""

from __future__ import annotations

import os
from typing import Protocol

from . import durable


class _Judge(Protocol):
    """What judges and stages a feature file's content (``edit.FileEditor``)."""

    def flush(self, handle: "WriteHandle", *, final: bool = False) -> None: ...
    def release(self, handle: "WriteHandle") -> None: ...


class WriteHandle:
    """A feature file open for writing: content collects in a staging temp file until it is
    flushed (closed), and is judged then, never on an intermediate state such as the truncation
    that precedes new content."""

    def __init__(self, judge: _Judge, path: str, fd: int, tmp: str, *, new: bool) -> None:
        self.judge = judge
        self.path = path
        self.fd = fd
        self.tmp = tmp
        self.new = new          # created by this open: the file exists only once flushed
        self.dirty = new        # content differs from what is staged
        self.written = False    # data was written since the last flush (a bare truncate is not enough)

    def read(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def write(self, data: bytes, offset: int) -> int:
        n = durable.pwrite(self.fd, data, offset, self.tmp)
        self.dirty = self.written = True
        return n

    def truncate(self, length: int) -> None:
        os.ftruncate(self.fd, length)
        self.dirty = True
        # Only a truncate to zero can be the step before new content; `truncate -s N` to any
        # other length is the change itself, judged at the next close so that close can fail.
        if length:
            self.written = True

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def content(self) -> bytes:
        size = self.size()
        return os.pread(self.fd, size, 0) if size else b""

    def flush(self, *, final: bool = False) -> None:
        self.judge.flush(self, final=final)

    def release(self) -> None:
        self.judge.release(self)

    def discard(self) -> None:
        """Let go of the temporary file (the judge calls this once done with the handle)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass


class ScratchHandle:
    """A scratch file open for reading and writing: a plain real file."""

    def __init__(self, path: str, flags: int) -> None:
        self.path = path
        self.fd = os.open(path, flags & ~(os.O_CREAT | os.O_EXCL))
        self.dirty = False

    def read(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def write(self, data: bytes, offset: int) -> int:
        self.dirty = True
        return durable.pwrite(self.fd, data, offset, self.path)

    def truncate(self, length: int) -> None:
        os.ftruncate(self.fd, length)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def flush(self, *, final: bool = False) -> None:
        if self.dirty:
            durable.fsync(self.fd, self.path)
            self.dirty = False

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
