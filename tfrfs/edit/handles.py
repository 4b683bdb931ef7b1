"""Open files of a writable mount: feature files (``OpenFile``, one content shared by all the
descriptors of a file, each a ``WriteHandle``) and scratch files (``ScratchHandle``, a real file).
Both handles answer the whole ``nodes.FileHandle`` protocol, so the FUSE adapter drives every open
file the same way."""

from __future__ import annotations

import errno
import os
from typing import Callable, Protocol

from tfrfs.storage import durable
from tfrfs.errors import NoSpace, TfrfsError, TooLarge
from tfrfs.edit.largevalue import LIMIT


class _Judge(Protocol):
    """What judges and stages a feature file's content (``edit.FileEditor``)."""

    def flush(self, handle: "WriteHandle", *, final: bool = False) -> None: ...
    def sync(self, handle: "WriteHandle") -> None: ...
    def release(self, handle: "WriteHandle") -> None: ...


class WriteFailed(TfrfsError, OSError):
    """A write to an open feature file that failed: its close is refused with the same errno."""

    errno = errno.EIO


class OpenFile:
    """A feature file's content while any descriptor has it open, shared by all of them as a
    file's content is shared by its descriptors: a write through one is read through the other,
    and the kernel (which maps the file, and writes mapped pages back through whichever
    descriptor it likes) sees one file of one size.

    Until the first change the content is the value as shown (``base``, not copied); from then on
    it lives in a staging temporary file, and is judged when a descriptor opened for writing is
    closed (``edit.FileEditor.flush``).
    """

    def __init__(self, path: str, base: bytes, mtime_ns: int, tmp_file: Callable[[], tuple[int, str]],
                 *, new: bool) -> None:
        self.path = path          # where it is now (a rename of it while open moves it)
        self.base = base
        self.mtime_ns = mtime_ns
        self._tmp_file = tmp_file
        self.fd = -1
        self.tmp = ""
        self.new = new            # created and not yet staged: no feature behind it yet
        self.dirty = new          # content differs from what is staged
        self.written = False      # data written since last judged (a bare truncate to zero is not enough)
        self.handles = 0          # descriptors open on it
        self.gone = False         # removed, or replaced by a rename, while open: never staged
        # A write or truncate that failed (disk full, past the largest value): the content is not
        # what the writer meant, so its close is refused with this error, the old value kept.
        self.failed: TfrfsError | None = None
        # The kind a user.tfrfs.kind xattr set while open gives an empty list written here (cp -a
        # sets it before it closes the file): taken when the content is judged.
        self.kind: str | None = None

    def _own(self) -> int:
        """The temporary file, made (holding the value as shown) at the first change."""
        if self.fd < 0:
            fd, tmp = self._tmp_file()
            try:
                if self.base:
                    durable.pwrite(fd, self.base, 0, tmp)
            except BaseException:
                os.close(fd)   # as if never made: the file still reads as it was
                os.unlink(tmp)
                raise
            self.fd, self.tmp = fd, tmp
            self.base = b""
        return self.fd

    def _fail(self, exc: OSError) -> None:
        """Remember a change that failed (see ``failed``)."""
        self.dirty = self.written = True
        if isinstance(exc, TfrfsError):
            self.failed = exc
        elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
            self.failed = NoSpace(f"not all of it could be written: {os.strerror(exc.errno)}")
        else:
            self.failed = WriteFailed(f"not all of it could be written: {exc.strerror or exc}")
            self.failed.errno = exc.errno or errno.EIO

    def _check_size(self, size: int) -> None:
        # A file system refuses a file past its largest size at once (EFBIG): so does a feature
        # file, before the temporary file takes the disk, or the close a copy of it.
        if size > LIMIT:
            exc = TooLarge(f"{size:,} bytes is more than a record can hold: protobuf, and so TensorFlow, "
                           f"reads records of at most {LIMIT:,} bytes")
            self._fail(exc)
            raise exc

    def read(self, size: int, offset: int) -> bytes:
        if self.fd < 0:
            return self.base[offset:offset + size]
        return os.pread(self.fd, size, offset)

    def write(self, data: bytes, offset: int) -> int:
        self._check_size(offset + len(data))
        try:
            n = durable.pwrite(self._own(), data, offset, self.tmp)
        except OSError as exc:
            self._fail(exc)
            raise
        self.dirty = self.written = True
        return n

    def truncate(self, length: int) -> None:
        self._check_size(length)
        if self.fd < 0 and not length:
            self.base = b""   # nothing to copy for a truncate to zero
        else:
            try:
                os.ftruncate(self._own(), length)
            except OSError as exc:
                self._fail(exc)
                raise
        if not length:
            self.failed = None   # new content starts here
        self.dirty = True
        # Only a truncate to zero can be the step before new content; `truncate -s N` to any
        # other length is the change itself, judged at the next close so that close can fail.
        if length:
            self.written = True

    def size(self) -> int:
        return len(self.base) if self.fd < 0 else os.fstat(self.fd).st_size

    def content(self) -> bytes:
        if self.fd < 0:
            return self.base
        size = self.size()
        return os.pread(self.fd, size, 0) if size else b""

    def discard(self) -> None:
        """Let go of the temporary file (once no descriptor has the file open)."""
        self.base = b""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            try:
                os.unlink(self.tmp)
            except FileNotFoundError:
                pass


class WriteHandle:
    """One descriptor of a feature file (``OpenFile``) in a writable mount. Closing one opened for
    writing judges and stages the file's content; closing the last one judges what is left."""

    def __init__(self, judge: _Judge, file: OpenFile, *, writer: bool) -> None:
        self.judge = judge
        self.file = file
        self.writer = writer    # opened for writing: its close judges the content
        file.handles += 1

    @property
    def path(self) -> str:
        return self.file.path

    def read(self, size: int, offset: int) -> bytes:
        return self.file.read(size, offset)

    def write(self, data: bytes, offset: int) -> int:
        return self.file.write(data, offset)

    def truncate(self, length: int) -> None:
        self.file.truncate(length)

    def size(self) -> int:
        return self.file.size()

    def flush(self, *, final: bool = False) -> None:
        self.judge.flush(self, final=final)

    def sync(self) -> None:
        self.judge.sync(self)

    def release(self) -> None:
        self.judge.release(self)


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

    def sync(self) -> None:
        self.flush()

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
