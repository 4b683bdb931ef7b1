"""Durable file operations, each passing through one fault-injection seam.

Staging and commit do every write, fsync, rename and unlink through these
functions. Tests set ``durable.fault_hook`` to raise at the N-th call of a
given kind, then check that recovery leaves every shard wholly old or wholly
new and every staged change still staged.
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile
from pathlib import Path
from contextlib import contextmanager
from typing import BinaryIO, Callable, Iterator, Protocol

PathLike = str | os.PathLike[str]

# Called with the operation's name ("write", "fsync", "rename", "unlink") and its path
# before the operation runs; raising here simulates a crash or I/O error at that point.
fault_hook: Callable[[str, str], None] | None = None


class Streamed(Protocol):
    """Content written out a piece at a time rather than held whole (``largevalue.Spliced``)."""

    def __len__(self) -> int: ...
    def write_to(self, f: BinaryIO, path: PathLike) -> None: ...
    def prefixed(self, data: bytes) -> "Streamed": ...


def fault_point(op: str, path: PathLike) -> None:
    if fault_hook is not None:
        fault_hook(op, os.fspath(path))


def fsync(fd: int, path: PathLike = "") -> None:
    fault_point("fsync", path)
    os.fsync(fd)


def syncfs(path: PathLike) -> None:
    """Make every file written on ``path``'s file system durable at once (``syncfs``; ``sync``
    where it is missing): one call where many files written side by side would each take an
    ``fsync``."""
    fault_point("fsync", path)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), os.fspath(path))
    except (AttributeError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno not in (None, 38):   # 38: ENOSYS
            raise
        os.sync()
    finally:
        os.close(fd)


_SYNC_FILE_RANGE_WRITE = 2


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range``, or None where there is none (not Linux); looked up once."""
    try:
        import ctypes
        f = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    f.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    f.restype = ctypes.c_int
    return f


def start_writeback(fd: int) -> None:
    """Have the kernel begin writing ``fd``'s dirty pages to the disk now, without waiting
    (``sync_file_range(SYNC_FILE_RANGE_WRITE)``): a job that writes many files and makes them
    durable at the end (one ``syncfs``) lets the disk write each while the next is made, so the
    final sync finds little left. Not durability: nothing waits. A no-op where the call is
    missing (not Linux); an error is ignored (the final sync reports it)."""
    call = _sync_file_range()
    if call is not None:
        call(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


def fsync_dir(path: PathLike) -> None:
    fault_point("fsync", path)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(f: BinaryIO, data: bytes | memoryview, path: PathLike = "") -> None:
    fault_point("write", path)
    f.write(data)


def pwrite(fd: int, data: bytes, offset: int, path: PathLike = "") -> int:
    fault_point("write", path)
    return os.pwrite(fd, data, offset)


# What copy_file_range answers where it cannot copy between two files: another file system, an
# older kernel, a file system that does not take the call.
_KERNEL_COPY_REFUSED = frozenset({errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL})


def copy_range(src: int, dst: int, start: int, end: int, path: PathLike | None,
               ended: Callable[[int], Exception], *, chunk: int | None = None, may_refuse: bool = True) -> bool:
    """Bytes [start, end) of file ``src`` appended to file ``dst`` (at its position) within the
    kernel (``copy_file_range``), at most ``chunk`` bytes a call, each call passing the write
    seam for ``path`` (None: none, a file made durable later as a whole). False, with nothing
    copied, where ``may_refuse`` and the first call is refused as unsupported between these two
    files (``_KERNEL_COPY_REFUSED``, or no copy_file_range at all): the caller then writes the
    bytes itself. ``ended(pos)`` is raised where ``src`` ends at ``pos``, before ``end``."""
    if may_refuse and not hasattr(os, "copy_file_range"):
        return False
    pos = start
    while pos < end:
        if path is not None:
            fault_point("write", path)
        try:
            n = os.copy_file_range(src, dst, min(chunk or end - pos, end - pos), pos)
        except OSError as exc:
            if may_refuse and pos == start and exc.errno in _KERNEL_COPY_REFUSED:
                return False
            raise
        if n == 0:
            raise ended(pos)
        pos += n
    return True


def rename(src: PathLike, dst: PathLike) -> None:
    fault_point("rename", dst)
    os.replace(src, dst)


def unlink(path: PathLike) -> None:
    fault_point("unlink", path)
    os.unlink(path)
    fsync_dir(os.path.dirname(os.fspath(path)) or ".")


def mkstemp(folder: PathLike, prefix: str = ".tmp-") -> tuple[int, str]:
    return tempfile.mkstemp(dir=folder, prefix=prefix)


@contextmanager
def removed_on_failure(tmp: PathLike) -> Iterator[None]:
    """Remove the temporary file ``tmp`` when the block raises (whatever it raises: a fault,
    a full disk, Ctrl-C), and raise on; a file already gone is no second error."""
    try:
        yield
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_file(path: PathLike, data: bytes | Streamed, *, prefix: str = ".tmp-", mode: int | None = None,
               sync: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new file, whole (and
    maybe a temporary file named ``prefix``... beside it). ``mode``: the new file's (mkstemp's
    0600 otherwise), e.g. the old file's, so a file others read stays readable. ``sync=False``:
    not fsynced (the caller makes many files durable at once later, ``syncfs``)."""
    path = Path(path)
    fd, tmp = mkstemp(path.parent, prefix)
    with removed_on_failure(tmp):
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, bytes):
                write(f, data, tmp)
            else:
                data.write_to(f, tmp)
            f.flush()
            if sync:
                fsync(f.fileno(), tmp)
        rename(tmp, path)
    if sync:
        fsync_dir(path.parent)
