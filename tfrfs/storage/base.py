"""Where bytes live, as one small interface: a ``Storage`` (a local file system, or a bucket or web
server reached through fsspec) and a ``Location``, a folder or prefix in one storage that a job
can carry to another process.

Everything above asks a storage what it can do (``renames_atomically``, ``local_path``), never
whether it is "remote": only ``storage.factory`` looks at a URL's scheme. Paths are given in
the storage's own spelling (an absolute local path, or a URL) and joined by ``join``.
"""

from __future__ import annotations

import errno as _errno
import hashlib
import os
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from tfrfs.errors import TfrfsError

if TYPE_CHECKING:
    from tfrfs.storage.readers import Readers


class NotSupported(TfrfsError, OSError):
    """The storage cannot do this (a conditional write on a store without conditional requests)."""

    errno = _errno.EOPNOTSUPP


class Conflict(TfrfsError, FileExistsError):
    """A conditional write found the object other than it expected: there already (create), or
    changed since it was looked at (replace)."""

    errno = _errno.EEXIST


@dataclass(frozen=True)
class Stat:
    """What a storage says about one file or object."""

    size: int
    identity: str    # changes whenever the bytes may have: inode/mtime, ETag, generation
    mtime_ns: int
    is_dir: bool = False


@dataclass(frozen=True)
class Entry:
    """One name a listing found: ``name`` relative to the folder listed ("/"-separated)."""

    name: str
    path: str        # in the storage's spelling, for the calls that take a path
    stat: Stat


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing (or a look-up) says about one file or object."""

    url: str
    size: int
    identity: str     # changes whenever the bytes may have: ETag, generation, or time
    mtime_ns: int


@dataclass(frozen=True)
class Listing:
    """What a SOURCE in a storage holds: every file (object) under it and its folders, relative to
    ``root``."""

    root: str
    files: tuple[tuple[str, ObjectInfo], ...]   # (relative path, info)
    dirs: tuple[str, ...]
    named: bool                                  # one object named as SOURCE


def describe(exc: BaseException) -> str:
    """One line for a failed request: what the store said, without a traceback."""
    if isinstance(exc, FileNotFoundError):
        return "not found"
    if isinstance(exc, PermissionError):
        return "access denied (check the credentials)"
    if "Credentials" in type(exc).__name__:
        return f"no credentials found ({exc}): set them as the store's own tools expect them"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "Cannot connect" in text or "Connection refused" in text or "Could not connect" in text:
        return "cannot connect: " + text
    return text if len(text) < 300 else text[:297] + "..."


class Writing:
    """A new file being streamed (``Storage.create``): write into ``file``, then ``close`` for
    what was written. ``fd`` is a descriptor of the file when it is local (for ``fstat`` and
    ``copy_file_range``), else None."""

    def __init__(self, file: BinaryIO, fd: int | None) -> None:
        self.file = file
        self.fd = fd


class Storage(ABC):
    """One place bytes live. ``name`` is for messages and cache keys; ``options`` as given to the
    factory (what a job in another process opens the same storage with)."""

    name: str
    options: dict[str, Any]
    # A file or folder renames atomically over another, a folder with everything in it (a local
    # file system); a bucket has no rename, and a multi-object write is made whole by other means
    # (a marker), an object replaced by a copy over it.
    renames_atomically: bool = False

    # -- paths ---------------------------------------------------------------------------------

    @abstractmethod
    def join(self, base: str, *parts: str) -> str:
        """``base`` with ``parts`` ("/"-separated relative names) appended."""

    @abstractmethod
    def split(self, path: str) -> tuple[str, str]:
        """(parent, last name) of ``path``."""

    def absolute(self, path: str) -> str:
        """``path`` spelled so that it names the same file or folder from any working directory
        (what a key of a dataset's content may hold): a local path made absolute; a URL is."""
        return path

    def local_path(self, path: str) -> str | None:
        """The local file system path that holds ``path``'s bytes, when there is one (what a
        reader may ``mmap``, what ``statvfs`` asks about); None for an object in a store."""
        return None

    def cache_key(self, path: str, identity: str = "") -> str:
        """A key for cached bytes of ``path`` as of ``identity`` (a new identity, a new key)."""
        return hashlib.sha256(f"{path}\0{identity}".encode("utf-8", "surrogateescape")).hexdigest()[:32]

    # -- looking -------------------------------------------------------------------------------

    @abstractmethod
    def stat(self, path: str, *, fresh: bool = True) -> Stat | None:
        """What ``path`` is now (``fresh=False``: a listing this storage holds will do), None when
        there is nothing there."""

    @abstractmethod
    def list_source(self, path: str) -> Listing:
        """What SOURCE ``path`` names, as a user gives it: one file (``named``), a folder or prefix
        (every file under it, recursively, but a staging folder's), or a glob of files. Raises
        UsageError when it names nothing (or cannot be listed)."""

    @abstractmethod
    def list(self, path: str, *, recursive: bool = False) -> list[Entry] | None:
        """The files (and, not ``recursive``, folders) under the folder or prefix ``path``, sorted
        by name; None when there is no such folder (an empty prefix lists as ``[]``)."""

    # -- reading -------------------------------------------------------------------------------

    @abstractmethod
    def read(self, path: str) -> bytes:
        """All of ``path``. Raises FileNotFoundError when there is none."""

    @abstractmethod
    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``start``..``end`` of ``path`` (fewer only past its end)."""

    def read_head(self, path: str, size: int) -> bytes:
        """The first ``size`` bytes of ``path`` (fewer when it is shorter), in one request where
        there are requests: also from a server that answers no ranged request (it sends all)."""
        return self.read_range(path, 0, size)

    @abstractmethod
    def open_read(self, path: str) -> BinaryIO:
        """A sequential binary reader of the whole of ``path``."""

    # -- writing -------------------------------------------------------------------------------

    @abstractmethod
    def write(self, path: str, data: bytes, *, sync: bool = True) -> None:
        """Replace ``path`` with ``data`` whole: a reader sees the old bytes or the new, never a
        mix. ``sync=False``: a local file is written in place and not made durable (the caller
        makes many durable at once, ``sync_all``, and checks what it wrote before trusting it);
        a store's one PUT is whole either way. (No look-up follows: ``stat`` when it matters.)"""

    @abstractmethod
    def create(self, path: str) -> Writing:
        """A new file ``path`` to stream into (replaced if there), finished by ``finish``."""

    @abstractmethod
    def finish(self, path: str, writing: Writing) -> Stat:
        """Close what ``create`` gave: what was written (not yet durable locally: ``sync_all``)."""

    @abstractmethod
    def write_if(self, path: str, data: bytes, *, identity: str | None) -> str:
        """Write ``data`` whole only if ``path`` is absent (``identity`` None) or still has
        ``identity``; else ``Conflict``. ``NotSupported`` where the storage cannot tell. Returns
        the identity of what it wrote, as the write itself gave it (not looked up after, when
        another writer may already have replaced it)."""

    @abstractmethod
    def copy(self, src: str, dst: str) -> None:
        """Replace ``dst`` whole with ``src``'s bytes (a store copies on its side: none of them
        pass through here)."""

    @abstractmethod
    def upload(self, local: str, path: str) -> None:
        """Replace ``path`` whole with the bytes of the local file ``local``."""

    def upload_checked(self, local: str, path: str) -> Stat:
        """``upload``, then the object checked against the local file: its size, and its bytes'
        checksum as the storage gives it (here: read back and CRC-32C compared; a store that keeps
        a checksum of its own says it without the bytes). Raises DataLoss when they differ."""
        self.upload(local, path)
        return self.read_back(local, path)

    def read_back(self, local: str, path: str) -> Stat:
        """The object just uploaded from ``local``, its size and bytes read back and compared."""
        from tfrfs.errors import DataLoss
        got = self.stat(path)
        want = os.path.getsize(local)
        if got is None or got.size != want:
            raise DataLoss(f"{path}: uploaded as {want} bytes, now {'missing' if got is None else got.size}")
        if _crc_of(self.open_read(path)) != _crc_of(open(local, "rb")):
            raise DataLoss(f"{path}: its bytes read back differ from {local}")
        return got

    @abstractmethod
    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` over ``dst`` (atomic for a local file or folder; a copy and a delete in a
        store, where nothing renames)."""

    @abstractmethod
    def delete(self, path: str) -> None:
        """Delete a file or object; one that is not there is no error."""

    @abstractmethod
    def remove_tree(self, path: str) -> None:
        """Delete the folder or prefix ``path`` and all under it (not made durable file by file:
        ``sync_folder`` its parent after)."""

    def makedirs(self, path: str) -> None:
        """Make the folder ``path`` and its parents (a store has no folders: nothing to do)."""

    def sync_folder(self, path: str) -> None:
        """Make the folder's own entries durable: the names made, renamed or removed in it (a
        store's are at once)."""

    def sync_all(self, path: str) -> None:
        """Make every file written under ``path`` durable (a store's writes already are)."""

    # Objects can be written (a web server's cannot).
    writable: bool = True
    # Reads are requests that wait on a network: many in flight at once pay off (indexing
    # shards on threads); on a local file system they would only contend.
    requests_overlap: bool = False

    @abstractmethod
    def open_readers(self, cache_dir: Path, cache_size: int | None = None) -> "Readers":
        """The shard readers for shards in this storage (``cache_dir``, ``cache_size``: where and
        how many bytes of fetched blocks a store's readers keep)."""

    def stats(self) -> str:
        """Requests made and bytes fetched, for the log."""
        return ""


def _crc_of(stream: BinaryIO) -> int:
    """CRC-32C of a stream to its end (closed after)."""
    import crc32c
    crc = 0
    with stream:
        while chunk := stream.read(4 << 20):
            crc = crc32c.crc32c(chunk, crc)
    return crc


# --- a location a job can carry ------------------------------------------------------------------

_opened: dict[tuple[str, tuple[tuple[str, Any], ...]], Storage] = {}
_opened_lock = threading.Lock()


@dataclass(frozen=True)
class Location:
    """A folder or prefix in one storage: its path (absolute local path, or URL) and the store
    options it is opened with. Small and picklable: what a job carries to its worker, which
    opens the storage once per process (``storage()``)."""

    root: str
    options: tuple[tuple[str, Any], ...] = ()

    def storage(self) -> Storage:
        key = (self.root, self.options)
        with _opened_lock:
            found = _opened.get(key)
            if found is None:
                from tfrfs.storage.factory import open_storage
                found = _opened[key] = open_storage(self.root, dict(self.options) or None)
            return found

    def join(self, *parts: str) -> str:
        return self.storage().join(self.root, *parts)

    @property
    def name(self) -> str:
        return self.storage().split(self.root)[1]
