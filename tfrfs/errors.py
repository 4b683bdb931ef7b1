"""One exception tree for tfrfs.

Every leaf also subclasses the builtin it means and carries an errno, so the
FUSE adapter can map any of them in one place and never hands the binding an
``OSError`` without one.
"""

from __future__ import annotations

import errno as _errno


class TfrfsError(Exception):
    """Base of every error tfrfs raises on purpose."""

    errno: int = _errno.EIO

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class NotFound(TfrfsError, FileNotFoundError):
    errno = _errno.ENOENT


class NotADir(TfrfsError, NotADirectoryError):
    errno = _errno.ENOTDIR


class IsADir(TfrfsError, IsADirectoryError):
    errno = _errno.EISDIR


class ReadOnly(TfrfsError, PermissionError):
    errno = _errno.EROFS


class NotPermitted(TfrfsError, PermissionError):
    errno = _errno.EPERM


class Invalid(TfrfsError, ValueError):
    """Content or a name that does not fit what the dataset can hold."""

    errno = _errno.EINVAL


class NameTooLong(TfrfsError, ValueError):
    errno = _errno.ENAMETOOLONG


class Exists(TfrfsError, FileExistsError):
    errno = _errno.EEXIST


class NotEmpty(TfrfsError, OSError):
    errno = _errno.ENOTEMPTY


class NoAttr(TfrfsError, OSError):
    errno = _errno.ENODATA


class DataLoss(TfrfsError, OSError):
    """A checksum failed or a record is cut short: the bytes cannot be trusted."""

    errno = _errno.EIO


class DamagedRecord(DataLoss):
    """A record whose bytes cannot be served as they were written (SPEC 6): its data checksum
    fails, it is cut short, or records were lost before it. Names where, for the user to act on."""

    def __init__(self, shard: str, index: int | None, offset: int, reason: str) -> None:
        where = f"record {index}" if index is not None else "stream"
        super().__init__(f"{shard}: {where} at offset {offset}: {reason}")
        self.shard = shard
        self.index = index
        self.offset = offset
        self.reason = reason

    def __reduce__(self) -> tuple:   # raised in a Ray task: it crosses processes whole
        return (type(self), (self.shard, self.index, self.offset, self.reason))


class NoSpace(TfrfsError, OSError):
    errno = _errno.ENOSPC


class TooLarge(TfrfsError, OSError):
    """A value that would make its record larger than protobuf's message limit (2 GiB)."""

    errno = _errno.EFBIG


class UsageError(TfrfsError, ValueError):
    """Bad command-line input: the CLI exits with status 2."""

    errno = _errno.EINVAL


class Busy(TfrfsError, OSError):
    errno = _errno.EBUSY


class Unreachable(TfrfsError, OSError):
    """A request to a store (a remote shard) failed after its retries: that read fails, the
    mount goes on."""

    errno = _errno.EIO
