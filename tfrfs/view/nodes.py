"""What the namespace is made of: nodes (one per kind of entry a mount shows) and file handles.

Nodes are values. The tree resolves a path to one (``Tree.lookup``) and answers ``stat``, listings,
reads and xattrs from it; the renderer builds the nodes inside a record folder; the editors find
what a path stands for from its node (``Loc``). What a node knows of itself it answers itself:
whether it is a folder (``folder``) and its ``stat`` (but a ``.tfrfs/`` file's, whose time is its
folder's); what needs the record store or SOURCE, the tree answers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Mapping, Protocol, Union

from tfrfs.errors import DataLoss, ReadOnly

RecordId = Union[int, str]   # an original record's index, or the name of a record added since


def record_name_width(count: int) -> int:
    """SPEC 2: record names are zero-padded to max(6, digits of count - 1)."""
    return max(6, len(str(count - 1)))


@dataclass(frozen=True)
class Stat:
    is_dir: bool
    size: int
    mtime_ns: int
    nlink: int = 1


@dataclass(frozen=True)
class Loc:
    """Which part of a record a file or folder inside it stands for."""

    section: str             # "" (Example features), "context" or "feature_lists"
    key: str
    item: int | None = None  # a value's index in a .list/ folder, or a step's in .steps/
    raw: bool = False        # shown as a PNG decoded from raw pixels
    sub: int | None = None   # a value's index in step ``item``'s own N.list/ folder (inside .steps/)


@dataclass(eq=False)
class Dir:
    """A folder whose children are known: the mirror of SOURCE, or inside a record."""

    children: dict[str, "Node"] = field(default_factory=dict)
    mtime_ns: int = 0
    xattrs: Mapping[str, bytes] = field(default_factory=dict)
    loc: Loc | None = None        # set for a .list/ or .steps/ folder
    scratch: str | None = None    # real folder behind it, when the user made it (writable mounts)
    aliases: dict[str, "Node"] | None = None   # names found by lookup, never listed (rare: made when needed)
    folder: ClassVar[bool] = True

    def stat(self) -> Stat:
        # Its subfolders are known: the link count finds and ls -l expect.
        return Stat(True, 0, self.mtime_ns, 2 + sum(1 for c in self.children.values() if c.folder))


@dataclass(frozen=True)
class InShard:
    """A feature value shown as it lies in its shard: ``length`` bytes at ``offset`` of the shard's
    (uncompressed) stream, in a record whose checksum was checked when it was first shown."""

    shard: int
    offset: int
    length: int

    def __len__(self) -> int:
        return self.length


@dataclass(frozen=True, eq=False)
class DataFile:
    """A file whose bytes are known (a feature value as shown)."""

    data: bytes | InShard   # InShard: a large image, in read-only mounts
    mtime_ns: int
    xattrs: Mapping[str, bytes]
    damaged: str | None = None   # reason reads fail with EIO
    loc: Loc | None = None
    folder: ClassVar[bool] = False

    def stat(self) -> Stat:
        return Stat(False, len(self.data), self.mtime_ns)


@dataclass(frozen=True)
class ShardDir:
    shard: int          # the shard's number in the record store
    mtime_ns: int
    folder: ClassVar[bool] = True

    def stat(self) -> Stat:
        # 1 ("unknown"): counting subfolders would parse records, and ls -l or find on a shard
        # folder must not parse every record.
        return Stat(True, 0, self.mtime_ns, 1)


@dataclass(frozen=True)
class RecordDir:
    shard: int
    rid: RecordId
    mtime_ns: int
    folder: ClassVar[bool] = True

    def stat(self) -> Stat:
        return Stat(True, 0, self.mtime_ns, 1)   # as a shard folder's: its record is not parsed for it


@dataclass(frozen=True)
class RecordBin:
    """A record shown as its raw bytes (raw shards, and records that do not parse)."""

    shard: int
    rid: RecordId
    size: int
    mtime_ns: int
    damaged: str | None = None   # an empty record whose data checksum fails (SPEC 6): no byte to
                                 # fail a read on, so its stat fails with EIO
    folder: ClassVar[bool] = False

    def stat(self) -> Stat:
        if self.damaged:
            raise DataLoss(self.damaged)
        return Stat(False, self.size, self.mtime_ns)


@dataclass(frozen=True)
class ScratchFile:
    """A user's scratch file (editor swap or backup) in a writable mount: a real file."""

    path: str
    folder: ClassVar[bool] = False

    def stat(self) -> Stat:
        st = os.stat(self.path)
        return Stat(False, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class PlainFile:
    """A file of SOURCE that is not a shard, shown as it is."""

    path: str          # relative to SOURCE
    size: int
    mtime_ns: int
    folder: ClassVar[bool] = False

    def stat(self) -> Stat:
        return Stat(False, self.size, self.mtime_ns)


@dataclass(frozen=True)
class MetaFile:
    """A file under ``.tfrfs/`` whose content is made when it is looked at."""

    name: str
    render: Callable[[], bytes]
    folder: ClassVar[bool] = False


Node = Union[Dir, DataFile, ShardDir, RecordDir, RecordBin, PlainFile, MetaFile, ScratchFile]
FILE_NODES = (DataFile, RecordBin, PlainFile, MetaFile, ScratchFile)
DIR_NODES = (Dir, ShardDir, RecordDir)


def is_dir(node: Node) -> bool:
    return node.folder


# --- handles ---------------------------------------------------------------------

class FileHandle(Protocol):
    """An open file, as the FUSE adapter drives it: every handle answers every call."""

    def read(self, size: int, offset: int) -> bytes: ...
    def write(self, data: bytes, offset: int) -> int: ...
    def truncate(self, length: int) -> None: ...
    def flush(self, *, final: bool = False) -> None: ...
    def sync(self) -> None: ...
    def release(self) -> None: ...


class ReadHandle:
    """A file open for reading: its bytes, or a descriptor, taken at open, so a record evicted
    from the cache (or renumbered by a commit) stays readable through it."""

    __slots__ = ("data", "fd", "damaged")

    def __init__(self, data: bytes | None = None, fd: int | None = None, damaged: str | None = None) -> None:
        self.data = data
        self.fd = fd
        self.damaged = damaged

    def read(self, size: int, offset: int) -> bytes:
        if self.damaged:
            raise DataLoss(self.damaged)
        if self.data is not None:
            return self.data[offset:offset + size]
        assert self.fd is not None
        return os.pread(self.fd, size, offset)

    def write(self, data: bytes, offset: int) -> int:
        raise ReadOnly("opened for reading")

    def truncate(self, length: int) -> None:
        raise ReadOnly("opened for reading")

    def flush(self, *, final: bool = False) -> None:
        pass

    def sync(self) -> None:
        pass

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
