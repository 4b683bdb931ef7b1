"""What the namespace is made of: nodes (one per kind of entry a mount shows) and file handles.

Nodes are values. The tree resolves a path to one (``Tree.lookup``); the renderer builds the nodes
inside a record folder; the editors find what a path stands for from its node (``Loc``). Each kind
of node answers for itself: its child by name, its entries, a handle to read it, bytes served by
path, its xattrs and its stat, asking the tree it is in (``Within``) for what needs the record
store or SOURCE. A folder's reads fail with EISDIR and a file's listings with ENOTDIR once, in the
two kinds' bases (``FolderNode``, ``FileNode``), so no caller chooses by the node's type.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar, Iterator, Mapping, Protocol, Union

from tfrfs.errors import DataLoss, IsADir, NotADir, NotFound, ReadOnly
from tfrfs.storage.readers import Served

if TYPE_CHECKING:
    from tfrfs.view.records import RecordStore

RecordId = Union[int, str]   # an original record's index, or the name of a record added since


def record_name_width(count: int) -> int:
    """SPEC 2: record names are zero-padded to max(6, digits of count - 1)."""
    return max(6, len(str(count - 1)))


class Within(Protocol):
    """What a node asks of the tree it is in (``view.tree.Tree``)."""

    @property
    def store(self) -> "RecordStore": ...
    @property
    def meta_mtime_ns(self) -> int: ...

    def settle(self, folder: "Dir") -> None: ...
    def record_root(self, record: "RecordDir") -> "Dir": ...
    def record_entry(self, shard: "ShardDir", name: str) -> "Node": ...
    def shard_names(self, shard: int, start: int = 0) -> Iterator[tuple[int, str, bool]]: ...
    def plain_path(self, path: str) -> str: ...
    def plain_read(self, path: str, size: int, offset: int) -> bytes: ...
    def record_xattrs(self, shard: int, rid: "RecordId") -> dict[str, bytes]: ...
    def shard_xattrs(self, shard: int) -> dict[str, bytes]: ...


class FolderNode:
    """What every folder answers alike: it cannot be read."""

    folder: ClassVar[bool] = True

    def open(self, tree: Within) -> "ReadHandle":
        raise IsADir("is a folder")

    def serve(self, tree: Within, size: int, offset: int) -> Served:
        raise IsADir("is a folder")


class FileNode:
    """What every file answers alike: it has no entries, and (but a ``.tfrfs/`` file) it knows
    its own stat and xattrs."""

    folder: ClassVar[bool] = False

    def child(self, tree: Within, name: str) -> "Node":
        raise NotADir(name)

    def names(self, tree: Within) -> Iterator[tuple[str, bool]]:
        raise NotADir("not a folder")

    def entries(self, tree: Within, start: int = 0) -> Iterator[tuple[int, str, "Node"]]:
        raise NotADir("not a folder")

    def stat(self) -> "Stat":
        raise NotImplementedError

    def stat_in(self, tree: Within) -> "Stat":
        return self.stat()

    def xattrs_in(self, tree: Within) -> Mapping[str, bytes]:
        return {}


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
class Dir(FolderNode):
    """A folder whose children are known: the mirror of SOURCE, or inside a record."""

    children: dict[str, "Node"] = field(default_factory=dict)
    mtime_ns: int = 0
    xattrs: Mapping[str, bytes] = field(default_factory=dict)
    loc: Loc | None = None        # set for a .list/ or .steps/ folder
    scratch: str | None = None    # real folder behind it, when the user made it (writable mounts)
    aliases: dict[str, "Node"] | None = None   # names found by lookup, never listed (rare: made when needed)

    def stat(self) -> Stat:
        # Its subfolders are known: the link count finds and ls -l expect.
        return Stat(True, 0, self.mtime_ns, 2 + sum(1 for c in self.children.values() if c.folder))

    def stat_in(self, tree: Within) -> Stat:
        tree.settle(self)
        return self.stat()

    def child(self, tree: Within, name: str) -> "Node":
        tree.settle(self)
        try:
            return self.children[name]
        except KeyError:
            pass
        # A name a feature file was written through, now shown under another (pins.keep_written)
        alias = self.aliases.get(name) if self.aliases else None
        if alias is None:
            raise NotFound(name)
        return alias

    def names(self, tree: Within) -> Iterator[tuple[str, bool]]:
        tree.settle(self)
        return iter([(n, c.folder) for n, c in self.children.items()])

    def entries(self, tree: Within, start: int = 0) -> Iterator[tuple[int, str, "Node"]]:
        tree.settle(self)
        rest = itertools.islice(self.children.items(), start, None)
        return ((pos, name, child) for pos, (name, child) in enumerate(rest, start))

    def xattrs_in(self, tree: Within) -> Mapping[str, bytes]:
        return self.xattrs


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
class DataFile(FileNode):
    """A file whose bytes are known (a feature value as shown)."""

    data: bytes | InShard   # InShard: a large image, in read-only mounts
    mtime_ns: int
    xattrs: Mapping[str, bytes]
    damaged: str | None = None   # reason reads fail with EIO
    loc: Loc | None = None

    def stat(self) -> Stat:
        return Stat(False, len(self.data), self.mtime_ns)

    def open(self, tree: Within) -> "ReadHandle":
        # A file of a record whose data checksum fails: EIO at once.
        if self.damaged:
            raise DataLoss(self.damaged)
        if isinstance(self.data, InShard):
            return ReadHandle(as_bytes(tree.store.serve(self.data, self.data.length, 0)))
        return ReadHandle(self.data)

    def serve(self, tree: Within, size: int, offset: int) -> Served:
        if self.damaged:
            raise DataLoss(self.damaged)
        if isinstance(self.data, InShard):
            return tree.store.serve(self.data, size, offset)
        return self.data[offset:offset + size]

    def xattrs_in(self, tree: Within) -> Mapping[str, bytes]:
        return self.xattrs


@dataclass(frozen=True)
class ShardDir(FolderNode):
    shard: int          # the shard's number in the record store
    mtime_ns: int

    def stat(self) -> Stat:
        # 1 ("unknown"): counting subfolders would parse records, and ls -l or find on a shard
        # folder must not parse every record.
        return Stat(True, 0, self.mtime_ns, 1)

    def stat_in(self, tree: Within) -> Stat:
        return self.stat()

    def child(self, tree: Within, name: str) -> "Node":
        return tree.record_entry(self, name)

    def names(self, tree: Within) -> Iterator[tuple[str, bool]]:
        return ((name, folder) for _, name, folder in tree.shard_names(self.shard))

    def entries(self, tree: Within, start: int = 0) -> Iterator[tuple[int, str, "Node"]]:
        return ((pos, name, tree.record_entry(self, name)) for pos, name, _ in tree.shard_names(self.shard, start))

    def xattrs_in(self, tree: Within) -> Mapping[str, bytes]:
        return tree.shard_xattrs(self.shard)


@dataclass(frozen=True)
class RecordDir(FolderNode):
    shard: int
    rid: RecordId
    mtime_ns: int

    def stat(self) -> Stat:
        return Stat(True, 0, self.mtime_ns, 1)   # as a shard folder's: its record is not parsed for it

    def stat_in(self, tree: Within) -> Stat:
        return self.stat()

    # What is inside is its record's view (``Tree.record_root``: EIO for a damaged record).
    def child(self, tree: Within, name: str) -> "Node":
        return tree.record_root(self).child(tree, name)

    def names(self, tree: Within) -> Iterator[tuple[str, bool]]:
        return tree.record_root(self).names(tree)

    def entries(self, tree: Within, start: int = 0) -> Iterator[tuple[int, str, "Node"]]:
        return tree.record_root(self).entries(tree, start)

    def xattrs_in(self, tree: Within) -> Mapping[str, bytes]:
        return tree.record_xattrs(self.shard, self.rid)


@dataclass(frozen=True)
class RecordBin(FileNode):
    """A record shown as its raw bytes (raw shards, and records that do not parse)."""

    shard: int
    rid: RecordId
    size: int
    mtime_ns: int
    damaged: str | None = None   # an empty record whose data checksum fails (SPEC 6): no byte to
                                 # fail a read on, so its stat fails with EIO

    def stat(self) -> Stat:
        if self.damaged:
            raise DataLoss(self.damaged)
        return Stat(False, self.size, self.mtime_ns)

    def open(self, tree: Within) -> "ReadHandle":
        data, damaged = tree.store.record_bytes(self.shard, self.rid)
        if damaged:
            raise DataLoss(damaged)
        return ReadHandle(data)

    def serve(self, tree: Within, size: int, offset: int) -> Served:
        data, damaged = tree.store.bin_content(self.shard, self.rid)
        if damaged:
            raise DataLoss(damaged)
        return data[offset:offset + size]

    def xattrs_in(self, tree: Within) -> Mapping[str, bytes]:
        return tree.record_xattrs(self.shard, self.rid)


@dataclass(frozen=True)
class ScratchFile(FileNode):
    """A user's scratch file (editor swap or backup) in a writable mount: a real file."""

    path: str

    def stat(self) -> Stat:
        st = os.stat(self.path)
        return Stat(False, st.st_size, st.st_mtime_ns)

    def open(self, tree: Within) -> "ReadHandle":
        return ReadHandle(fd=os.open(self.path, os.O_RDONLY))

    def serve(self, tree: Within, size: int, offset: int) -> Served:
        raise IsADir("is a folder")   # scratch files exist only in writable mounts, which read through handles


@dataclass(frozen=True)
class PlainFile(FileNode):
    """A file of SOURCE that is not a shard, shown as it is."""

    path: str          # relative to SOURCE
    size: int
    mtime_ns: int

    def stat(self) -> Stat:
        return Stat(False, self.size, self.mtime_ns)

    def open(self, tree: Within) -> "ReadHandle":
        return ReadHandle(fd=os.open(tree.plain_path(self.path), os.O_RDONLY))

    def serve(self, tree: Within, size: int, offset: int) -> Served:
        # Its bytes, not where they lie: the descriptor may be closed (and its number given to
        # another file) once another thread's read needs the room, before libfuse reads it.
        return tree.plain_read(self.path, max(0, min(size, self.size - offset)), offset)


@dataclass(frozen=True)
class MetaFile(FileNode):
    """A file under ``.tfrfs/`` whose content is made when it is looked at."""

    name: str
    render: Callable[[], bytes]

    def stat_in(self, tree: Within) -> Stat:
        # Made when looked at: its size is its content's now, its time the folder's.
        return Stat(False, len(self.render()), tree.meta_mtime_ns)

    def open(self, tree: Within) -> "ReadHandle":
        return ReadHandle(self.render())

    def serve(self, tree: Within, size: int, offset: int) -> Served:
        return self.render()[offset:offset + size]


Node = Union[Dir, DataFile, ShardDir, RecordDir, RecordBin, PlainFile, MetaFile, ScratchFile]
FILE_NODES = (DataFile, RecordBin, PlainFile, MetaFile, ScratchFile)
DIR_NODES = (Dir, ShardDir, RecordDir)


def is_dir(node: Node) -> bool:
    return node.folder


def as_bytes(served: Served) -> bytes:
    """What ``serve`` answered, as bytes (reading them where they lie when it said where)."""
    if isinstance(served, tuple):
        fd, pos, count = served
        return os.pread(fd, count, pos) if count else b""
    return bytes(served)


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
