"""The filesystem model: path -> node, and what each node lists, holds and says.

This module knows nothing of FUSE. ``Tree.lookup`` resolves a path to a node
once; ``Tree.stat``, ``Tree.list``, ``Tree.open`` and ``Tree.xattrs`` answer
for that node. Shard folders are listed from the index alone; a record is
parsed only when something inside it is looked at, and parsed records are
kept in an LRU within a memory budget.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import logging
import os
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Callable, Iterable, Iterator, Mapping, Union

from . import codec, names, proto, tfrecord, wire
from .readahead import MAX_AHEAD, ReadAhead, Record
from .errors import DataLoss, IsADir, NotADir, NotFound, NameTooLong
from .index import Discovery, ShardIndex
from .tfrecord import Problem
from .staging import ShardChanges, Staging

log = logging.getLogger("tfrfs")

DEFAULT_CACHE_BYTES = 256 << 20
_BIN_CACHE_BYTES = 32 << 20   # recent .bin records, read by path in 128 KiB pieces
_PLAIN_FDS = 64               # plain files kept open for reads by path
_IN_PLACE = 64 << 10          # an image this large is read from its shard when shown (read-only mounts)
_SCRATCH_MAX = 64 << 20       # the buffer such records are read into is kept up to this size
_HELD = 2                     # records read ahead kept in memory to serve their images from
_ROOT_META = ".tfrfs"


# --- nodes -------------------------------------------------------------------

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


@dataclass(eq=False)
class Dir:
    """A folder whose children are known: the mirror of SOURCE, or inside a record."""

    children: dict[str, "Node"] = field(default_factory=dict)
    mtime_ns: int = 0
    xattrs: Mapping[str, bytes] = field(default_factory=dict)
    loc: Loc | None = None        # set for a .list/ or .steps/ folder
    scratch: str | None = None    # real folder behind it, when the user made it (writable mounts)


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


@dataclass(frozen=True)
class ShardDir:
    shard: int          # position in Tree.shards
    mtime_ns: int


RecordId = Union[int, str]   # an original record's index, or the name of a record added since


@dataclass(frozen=True)
class RecordDir:
    shard: int
    rid: RecordId
    mtime_ns: int


@dataclass(frozen=True)
class RecordBin:
    """A record shown as its raw bytes (raw shards, and records that do not parse)."""

    shard: int
    rid: RecordId
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class ScratchFile:
    """A user's scratch file (editor swap or backup) in a writable mount: a real file."""

    path: str


@dataclass(frozen=True)
class PlainFile:
    path: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class MetaFile:
    """A file under ``.tfrfs/`` whose content is made when it is looked at."""

    name: str
    render: Callable[[], bytes]


Node = Union[Dir, DataFile, ShardDir, RecordDir, RecordBin, PlainFile, MetaFile, ScratchFile]
FILE_NODES = (DataFile, RecordBin, PlainFile, MetaFile, ScratchFile)


PinKey = tuple[str, str]   # (section, key) of one feature of a record


@dataclass(frozen=True)
class Shown:
    """How one feature of a record is shown: the parts of its name and look that can depend on more
    than its own value (SPEC 3.1 clashes, 3.2 item numbering, 3.3 raw pixels, 4 steps)."""

    folders: tuple[str, ...]                 # the folders above its entry, inside its section's folder
    stem: str                                # its entry's name without the suffix
    shape: codec.Shape | None = None         # shown as a PNG of raw pixels of this shape
    stems: tuple[str, ...] | None = None     # a .list/ or .steps/ folder: its items' names, by position
    kept: bool = False                       # shown otherwise than the SPEC rules show its value now
    digest: bytes = b""                      # in a pin: the value it was shown for


class NamePin:
    """The names a changed record's features keep until a commit (SPEC 7: names stay stable).

    Taken from the record as it was shown just before a change. An entry holds while its feature
    still has the value it was shown for, so removing a feature, a step or a list item never
    renames the others: a raw pixel array whose height went keeps its ``.png``, the items after a
    removed one keep their numbers, a ``.list/`` left with one value stays a folder. A feature
    whose value a write changed is shown by the SPEC rules again (its item names excepted, which
    the editor carries over itself with ``keep_items``). Pins live in memory only: a commit, or
    the next mount, shows every record by the rules.
    """

    def __init__(self, entries: dict[PinKey, Shown] | None = None) -> None:
        self.entries: dict[PinKey, Shown] = entries or {}

    def get(self, section: str, key: str) -> Shown | None:
        return self.entries.get((section, key))

    def keep_items(self, section: str, key: str, stems: tuple[str, ...], digest: bytes,
                   folder: tuple[str, ...] = ()) -> None:
        """Show ``key`` for its new value (``digest``) as a .list/ or .steps/ folder with these item
        names: where it is shown now, or for a key not shown yet at ``folder`` (its path in the section)."""
        shown = self.entries.get((section, key))
        if shown is not None:
            self.entries[(section, key)] = replace(shown, shape=None, stems=stems, digest=digest)
        elif folder:
            stem, _ = names.split_suffix(folder[-1])
            self.entries[(section, key)] = Shown(folder[:-1], stem, None, stems, False, digest)

    def only(self, keys: set[PinKey]) -> "NamePin":
        return NamePin({k: v for k, v in self.entries.items() if k in keys})


def value_digest(message: Any) -> bytes:
    """Identifies a Feature's (or a FeatureList's) value, so a pin knows whether it changed."""
    return hashlib.blake2b(message.SerializeToString(deterministic=True), digest_size=16).digest()


@dataclass
class _Naming:
    """What building one record's view needs to keep its names stable, and what it finds."""

    pin: NamePin | None
    shown: dict[PinKey, Shown] | None    # filled in writable mounts: how every feature is shown
    kept: set[PinKey] = field(default_factory=set)   # pin entries that changed what is shown

    def held(self, section: str, features: Mapping[str, Any]) -> dict[str, Shown]:
        """Pin entries of ``section`` whose feature still has the value it was shown for."""
        if self.pin is None:
            return {}
        out = {}
        for key, message in features.items():
            shown = self.pin.get(section, key)
            if shown is not None and shown.digest == value_digest(message):
                out[key] = shown
        return out


@dataclass
class RecordView:
    root: Dir
    cost: int
    shown: dict[PinKey, Shown] = field(default_factory=dict)   # writable mounts only


class Handle:
    """An open file: reads come from here, so an evicted record stays readable."""

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

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# --- problems ------------------------------------------------------------------

class ErrorLog:
    """Problems found in the data: logged once each and listed in ``.tfrfs/errors``."""

    def __init__(self) -> None:
        self._lines: list[bytes] = []
        self._seen: set[tuple] = set()
        self._lock = threading.Lock()
        self.on_change: Callable[[], None] | None = None   # the adapter tells the kernel the file grew

    def add(self, shard: str | None, index: int | None, offset: int | None, reason: str, **extra: object) -> None:
        key = (shard, index, offset, reason)
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
            entry = {"shard": shard, "index": index, "offset": offset, "reason": reason, **extra}
            self._lines.append((json.dumps(entry, ensure_ascii=False) + "\n").encode())
        where = f"{shard}" + (f" record {index}" if index is not None else "") + \
                (f" at offset {offset}" if offset is not None else "")
        log.warning("%s: %s", where, reason)
        if self.on_change is not None:
            self.on_change()

    def render(self) -> bytes:
        with self._lock:
            return b"".join(self._lines)

    def __len__(self) -> int:
        return len(self._lines)


# --- the tree ------------------------------------------------------------------

def _xkey(key: str) -> bytes:
    return key.encode("utf-8", "surrogatepass")


def record_name_width(count: int) -> int:
    return max(6, len(str(count - 1)))


class Tree:
    """The read side of a mount: every path's node, listing, content and xattrs.

    In a writable mount the tree also shows what is staged: ``changes`` per
    shard (records edited, deleted and added; new and removed shards) and,
    per record, the user's own folders and scratch files, kept as a real
    folder tree under the staging folder and merged into the record's view.
    """

    def __init__(self, discovery: Discovery, indexes: list[ShardIndex], *, records: str | None = None,
                 decode_raw: bool = True, writable: bool = False, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 errors: ErrorLog | None = None, staging: Staging | None = None,
                 on_bad: Callable[[ShardIndex], None] | None = None) -> None:
        self.discovery = discovery
        self.shards = indexes
        self.records_override = records
        self.decode_raw = decode_raw
        self.writable = writable
        self.staging = staging
        self.on_bad = on_bad   # persists a newly found unparsable record, so the next mount lists it right
        self.errors = errors or ErrorLog()
        self.kinds = [records or idx.detected_kind for idx in indexes]
        self.uid = os.getuid()
        self.gid = os.getgid()
        self.file_mode = 0o644 if writable else 0o444
        self.dir_mode = 0o755 if writable else 0o555
        # Every shard is opened now and read through that descriptor for the mount's life, so a
        # shard file replaced by another process never mixes our offsets with its bytes.
        self._fds: list[int | None] = [idx.open() if idx.count else None for idx in indexes]
        self._cache: OrderedDict[tuple[int, RecordId], RecordView] = OrderedDict()
        self._cache_cost = 0
        self._cache_budget = cache_bytes
        self._bins: OrderedDict[tuple[int, RecordId], tuple[bytes, str | None]] = OrderedDict()
        self._bins_cost = 0
        self._plain_fds: OrderedDict[str, int] = OrderedDict()
        self._scratch = threading.local()   # .buf: the buffer _view_in_place reads records into
        self._ahead = ReadAhead()           # the next large records, when they are read in order
        self._last_in_place: dict[int, int] = {}   # shard -> the record _view_in_place read last
        # Records read ahead whose images are served from memory: (shard, record) -> (where its
        # data starts in the shard, the record). The last _HELD taken, in the order taken.
        self._held: OrderedDict[tuple[int, int], tuple[int, Record]] = OrderedDict()
        # Names that changed records keep until their shard is committed (see NamePin).
        self._pins: dict[tuple[int, RecordId], NamePin] = {}
        self._lock = threading.RLock()
        self._schema: dict | None = None
        self.meta = Dir(mtime_ns=0)
        self.dirs: dict[str, Dir] = {}
        self.root = self._build_static()
        for idx in indexes:
            for p in idx.problems:
                self.errors.add(idx.shard.relpath, p.index, p.offset, p.reason)
        self.meta.children["schema.json"] = MetaFile("schema.json", self.schema_bytes)
        self.meta.children["errors"] = MetaFile("errors", self.errors.render)

    # -- static part --------------------------------------------------------

    def _build_static(self) -> Dir:
        d = self.discovery
        root_mtime = _mtime_ns(d.root)
        root = Dir(mtime_ns=root_mtime)
        self.meta.mtime_ns = root_mtime
        self.dirs = {"": root}
        for rel in d.dirs:
            if rel:
                parent = self.dirs[os.path.dirname(rel)]
                sub = Dir(mtime_ns=_mtime_ns(os.path.join(d.root, rel)))
                parent.children[os.path.basename(rel)] = sub
                self.dirs[rel] = sub
        for rel in d.plain_files:
            full = os.path.join(d.root, rel)
            st = os.stat(full)
            self.dirs[os.path.dirname(rel)].children[os.path.basename(rel)] = PlainFile(full, st.st_size, st.st_mtime_ns)
        for n, idx in enumerate(self.shards):
            self._place_shard(n)
        return root

    def _place_shard(self, n: int) -> None:
        rel = self.shards[n].shard.relpath
        parent = self.dirs.get(os.path.dirname(rel), self.dirs[""])
        parent.children[os.path.basename(rel)] = ShardDir(n, self.shards[n].shard.mtime_ns)

    def shard_number(self, relpath: str) -> int | None:
        for n, idx in enumerate(self.shards):
            if idx.shard.relpath == relpath:
                return n
        return None

    def add_shard(self, idx: ShardIndex, kind: str) -> int:
        """Show a shard that is not among the source's files yet (a new shard of a writable mount)."""
        self.shards.append(idx)
        self.kinds.append(self.records_override or kind)
        self._fds.append(idx.open() if idx.count else None)
        n = len(self.shards) - 1
        self._place_shard(n)
        return n

    def replace_shard(self, n: int, idx: ShardIndex) -> None:
        """Serve shard ``n`` from a new file and index (after a commit): records are renumbered."""
        old = self._fds[n]
        self._fds[n] = idx.open() if idx.count else None
        if old is not None:
            os.close(old)
        self.shards[n] = idx
        self._place_shard(n)
        self.forget_shard(n)
        self._schema = None

    def hide_shard(self, n: int) -> None:
        rel = self.shards[n].shard.relpath
        parent = self.dirs.get(os.path.dirname(rel), self.dirs[""])
        parent.children.pop(os.path.basename(rel), None)
        self.forget_shard(n)

    def forget_shard(self, n: int) -> None:
        with self._lock:
            for key in [k for k in self._cache if k[0] == n]:
                self._cache_cost -= self._cache.pop(key).cost
            for key in [k for k in self._pins if k[0] == n]:
                del self._pins[key]

    # -- lookup -------------------------------------------------------------

    def lookup(self, path: str) -> Node:
        """The node at ``path`` ("/" separated, from the mount's root)."""
        node: Node = self.root
        if path in ("/", ""):
            return node
        comps = path.strip("/").split("/")
        if comps[0] == _ROOT_META:
            # Reachable by name but never listed, so cp -r, rsync and find leave it alone
            # (and ls -lR does not make schema.json parse the whole dataset).
            node = self.meta
            comps = comps[1:]
        for comp in comps:
            node = self.child(node, comp)
        return node

    def locate(self, path: str) -> tuple[Node, RecordDir | None, tuple[str, ...]]:
        """The node at ``path``, the record folder it is in (if any) and its path inside that record."""
        comps = [c for c in path.strip("/").split("/") if c]
        node: Node = self.root
        record: RecordDir | None = None
        inner: list[str] = []
        if comps and comps[0] == _ROOT_META:
            node, comps = self.meta, comps[1:]
        for comp in comps:
            node = self.child(node, comp)
            if record is not None:
                inner.append(comp)
            elif isinstance(node, RecordDir):
                record = node
        return node, record, tuple(inner)

    def child(self, node: Node, name: str) -> Node:
        if len(name.encode("utf-8", "surrogateescape")) > names.NAME_MAX:
            raise NameTooLong(f"{name[:40]}...: name longer than {names.NAME_MAX} bytes")
        if isinstance(node, Dir):
            try:
                return node.children[name]
            except KeyError:
                raise NotFound(name) from None
        if isinstance(node, ShardDir):
            return self._record_entry(node, name)
        if isinstance(node, RecordDir):
            return self.child(self.record_view(node.shard, node.rid).root, name)
        raise NotADir(name)

    def _record_entry(self, node: ShardDir, name: str) -> Node:
        ch = self.changes(node.shard)
        if ch is not None and name in ch.added:
            if self.kinds[node.shard] == "raw":
                raise NotFound(name)
            return RecordDir(node.shard, name, node.mtime_ns)
        idx = self.shards[node.shard]
        stem, dot, ext = name.partition(".")
        if (dot and ext != "bin") or not stem.isdigit() or not stem.isascii():
            raise NotFound(name)
        width = record_name_width(idx.count)
        i = int(stem)
        if len(stem) != width or i >= idx.count or (ch is not None and i in ch.deleted):
            raise NotFound(name)
        if self.kinds[node.shard] == "raw" or (dot and self._is_bad(node.shard, i)):
            if not dot:
                raise NotFound(name)
            return RecordBin(node.shard, i, len(self.record_bytes(node.shard, i)[0])
                             if ch is not None and i in ch.edited else idx.span(i)[1], node.mtime_ns)
        if dot:
            raise NotFound(name)
        # A record found not to parse only now was listed as a folder (listings come from the
        # index alone): its folder stays reachable, empty, and later listings show NNNNNN.bin.
        return RecordDir(node.shard, i, node.mtime_ns)

    def _is_bad(self, shard: int, index: int) -> bool:
        """Whether record ``index`` does not parse (parsing it now if that is not yet known)."""
        idx = self.shards[shard]
        if index in idx.bad:
            return True
        self.record_view(shard, index)
        return index in idx.bad

    def changes(self, shard: int) -> ShardChanges | None:
        if self.staging is None:
            return None
        return self.staging.shards.get(self.shards[shard].shard.relpath)

    # -- stat / list --------------------------------------------------------

    def stat(self, node: Node) -> Stat:
        if isinstance(node, DataFile):
            return Stat(False, len(node.data), node.mtime_ns)
        if isinstance(node, Dir):
            return Stat(True, 0, node.mtime_ns, 2 + sum(1 for c in node.children.values() if _is_dir(c)))
        if isinstance(node, (RecordBin, PlainFile)):
            return Stat(False, node.size, node.mtime_ns)
        if isinstance(node, ShardDir):
            return Stat(True, 0, node.mtime_ns, 1)   # 1: subfolder count unknown without parsing
        if isinstance(node, RecordDir):
            # 1 ("unknown"), as for shard folders: counting subfolders would parse the record,
            # and ls -l or find on a shard folder must not parse every record.
            return Stat(True, 0, node.mtime_ns, 1)
        if isinstance(node, MetaFile):
            return Stat(False, len(node.render()), self.meta.mtime_ns)
        if isinstance(node, ScratchFile):
            st = os.stat(node.path)
            return Stat(False, st.st_size, st.st_mtime_ns)
        raise NotFound(str(node))

    def list(self, node: Node) -> Iterable[tuple[str, bool]]:
        """(name, is_dir) of every entry of a folder node."""
        if isinstance(node, Dir):
            return [(n, _is_dir(c)) for n, c in node.children.items()]
        if isinstance(node, ShardDir):
            return ((name, is_dir) for _, name, is_dir in self._shard_names(node.shard))
        if isinstance(node, RecordDir):
            return self.list(self.record_view(node.shard, node.rid).root)
        raise NotADir("not a folder")

    def entries(self, node: Node, start: int = 0) -> Iterator[tuple[int, str, Node]]:
        """(position, name, node) of a folder's entries from position ``start`` on.

        The names and order are ``list``'s. Positions grow, stay the same while the folder does
        and may skip (a shard folder's are its record numbers), so a listing can resume at any
        of them. Each node is cheap to ``stat``: a shard folder's come from its index, unparsed.
        """
        if isinstance(node, RecordDir):
            node = self.record_view(node.shard, node.rid).root
        if isinstance(node, Dir):
            rest = itertools.islice(node.children.items(), start, None)
            return ((pos, name, child) for pos, (name, child) in enumerate(rest, start))
        if isinstance(node, ShardDir):
            return ((pos, name, self._record_entry(node, name))
                    for pos, name, _ in self._shard_names(node.shard, start))
        raise NotADir("not a folder")

    def _shard_names(self, shard: int, start: int = 0) -> Iterator[tuple[int, str, bool]]:
        """(position, name, is_dir) of a shard folder's entries: record i at position i,
        records added in --rw after the last one."""
        idx = self.shards[shard]
        width = record_name_width(idx.count)
        raw = self.kinds[shard] == "raw"
        ch = self.changes(shard)
        deleted = ch.deleted if ch is not None else ()
        bad = idx.bad
        for i in range(start, idx.count):
            if i in deleted:
                continue
            if raw or i in bad:
                yield i, f"{i:0{width}d}.bin", False
            else:
                yield i, f"{i:0{width}d}", True
        if ch is not None and not raw:
            for j, name in enumerate(ch.added_names()):
                if idx.count + j >= start:
                    yield idx.count + j, name, True

    # -- content ------------------------------------------------------------

    def open(self, node: Node) -> Handle:
        if isinstance(node, DataFile):
            return Handle(node.data, damaged=node.damaged)
        if isinstance(node, RecordBin):
            data, damaged = self.record_bytes(node.shard, node.rid)
            return Handle(data, damaged=damaged)
        if isinstance(node, PlainFile):
            return Handle(fd=os.open(node.path, os.O_RDONLY))
        if isinstance(node, ScratchFile):
            return Handle(fd=os.open(node.path, os.O_RDONLY))
        if isinstance(node, MetaFile):
            return Handle(node.render())
        raise IsADir("is a folder")

    def read(self, node: Node, size: int, offset: int) -> bytes:
        """``size`` bytes of a file at ``offset``, with no open handle (read-only mounts).

        A read-only mount answers reads by path (the kernel is told that open is not
        implemented, which saves an open and a release per file), so what a handle would hold
        is kept here instead: recent ``.bin`` records and plain files' descriptors. Nothing
        changes under a read-only mount, so neither needs invalidating.
        """
        assert not self.writable, "a writable mount reads through handles"
        if isinstance(node, DataFile):
            if node.damaged:
                raise DataLoss(node.damaged)
            if isinstance(node.data, InShard):
                fd, pos, count = self._in_shard(node.data, size, offset)
                return os.pread(fd, count, pos) if count else b""
            return node.data[offset:offset + size]
        if isinstance(node, RecordBin):
            data, damaged = self._bin_content(node)
            if damaged:
                raise DataLoss(damaged)
            return data[offset:offset + size]
        if isinstance(node, PlainFile):
            return os.pread(self._plain_fd(node.path), size, offset)
        if isinstance(node, MetaFile):
            return node.render()[offset:offset + size]
        raise IsADir("is a folder")   # scratch files exist only in writable mounts

    def read_place(self, node: Node, size: int, offset: int) -> tuple[int, int, int] | None:
        """Where ``size`` bytes of a file at ``offset`` lie in a file the tree holds open, as
        (descriptor, position, count), when they lie in one; else None (use ``read``).

        Large images of read-only mounts and plain files do: the FUSE adapter hands such a read
        to libfuse, which copies the bytes from there without passing them through Python.
        """
        if isinstance(node, DataFile) and isinstance(node.data, InShard) and not node.damaged:
            return self._in_shard(node.data, size, offset)
        if isinstance(node, PlainFile) and not self.writable:
            return self._plain_fd(node.path), offset, max(0, min(size, node.size - offset))
        return None

    def _in_shard(self, where: InShard, size: int, offset: int) -> tuple[int, int, int]:
        fd = self._fds[where.shard]
        assert fd is not None
        return fd, where.offset + offset, max(0, min(size, where.length - offset))

    def _bin_content(self, node: RecordBin) -> tuple[bytes, str | None]:
        key = (node.shard, node.rid)
        with self._lock:
            hit = self._bins.get(key)
            if hit is not None:
                self._bins.move_to_end(key)
                return hit
        got = self.record_bytes(node.shard, node.rid)
        with self._lock:
            self._bins[key] = got
            self._bins_cost += len(got[0])
            while self._bins_cost > _BIN_CACHE_BYTES and len(self._bins) > 1:
                _, old = self._bins.popitem(last=False)
                self._bins_cost -= len(old[0])
        return got

    def _plain_fd(self, path: str) -> int:
        with self._lock:
            fd = self._plain_fds.get(path)
            if fd is not None:
                self._plain_fds.move_to_end(path)
                return fd
            fd = os.open(path, os.O_RDONLY)
            self._plain_fds[path] = fd
            while len(self._plain_fds) > _PLAIN_FDS:
                os.close(self._plain_fds.popitem(last=False)[1])
            return fd

    def xattrs(self, node: Node) -> Mapping[str, bytes]:
        if isinstance(node, (Dir, DataFile)):
            return node.xattrs
        if isinstance(node, (RecordDir, RecordBin)):
            return self._record_xattrs(node.shard, node.rid)
        if isinstance(node, ShardDir):
            idx = self.shards[node.shard]
            return {"user.tfrfs.shard": idx.shard.relpath.encode(),
                    "user.tfrfs.count": str(idx.count).encode(),
                    "user.tfrfs.records": self.kinds[node.shard].encode(),
                    "user.tfrfs.compression": idx.shard.compression.encode()}
        return {}

    def _record_xattrs(self, shard: int, rid: RecordId) -> dict[str, bytes]:
        idx = self.shards[shard]
        out = {"user.tfrfs.shard": idx.shard.relpath.encode()}
        if isinstance(rid, int):
            offset, length = idx.span(rid)
            out.update({"user.tfrfs.index": str(rid).encode(), "user.tfrfs.offset": str(offset).encode(),
                        "user.tfrfs.length": str(length).encode()})
        return out

    # -- records ------------------------------------------------------------

    def shard_fd(self, shard: int) -> int | None:
        return self._fds[shard]

    def read_record(self, shard: int, index: int) -> tuple[bytes, str | None]:
        """An original record's bytes, and why they cannot be trusted (data checksum), if so."""
        idx = self.shards[shard]
        offset, length = idx.span(index)
        fd = self._fds[shard]
        assert fd is not None
        try:
            return tfrecord.read_record(fd, offset, length), None
        except DataLoss as exc:
            self.errors.add(idx.shard.relpath, index, offset, str(exc))
            try:
                return tfrecord.read_record(fd, offset, length, verify=False), str(exc)
            except DataLoss:
                return b"", str(exc)

    def record_bytes(self, shard: int, rid: RecordId) -> tuple[bytes, str | None]:
        """A record's current bytes: staged if it was edited or added, else the original."""
        ch = self.changes(shard)
        if ch is not None and self.staging is not None:
            if isinstance(rid, str):
                return self.staging.get_added(ch, rid), None
            if rid in ch.edited:
                return self.staging.get_edit(ch, rid), None
        assert isinstance(rid, int)
        return self.read_record(shard, rid)

    def invalidate(self, shard: int, rid: RecordId) -> None:
        with self._lock:
            view = self._cache.pop((shard, rid), None)
            if view is not None:
                self._cache_cost -= view.cost

    def record_view(self, shard: int, rid: RecordId) -> RecordView:
        key = (shard, rid)
        with self._lock:
            view = self._cache.get(key)
            if view is not None:
                self._cache.move_to_end(key)
                return view
        naming = _Naming(self._pins.get(key), {} if self.writable else None)
        view = None if self.writable else self._view_in_place(shard, rid, naming)
        if view is None:
            data, damaged = self.record_bytes(shard, rid)
            view = self._build_view(shard, rid, data, damaged, naming)
        if naming.pin is not None:
            # Keep only the entries that made a difference: the rest the rules show alike, and
            # the next change takes its snapshot from what is shown, not from the pin.
            with self._lock:
                if naming.kept:
                    self._pins[key] = naming.pin.only(naming.kept)
                else:
                    self._pins.pop(key, None)
        if self.staging is not None:
            self._merge_scratch(view.root, self.scratch_root(shard, rid))
        with self._lock:
            self._cache[key] = view
            self._cache_cost += view.cost
            while self._cache_cost > self._cache_budget and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._cache_cost -= old.cost
        return view

    # -- stable names (writable mounts) ---------------------------------------

    def names_shown(self, shard: int, rid: RecordId) -> NamePin:
        """How the record's features are shown now, with their values' digests: the pin a change
        to the record starts from (writable mounts)."""
        view = self.record_view(shard, rid)
        data, damaged = self.record_bytes(shard, rid)
        if damaged or not view.shown:
            return NamePin()
        try:
            digests = _value_digests(self._parse(shard, data))
        except Exception:  # noqa: BLE001 - a record that does not parse shows no features to keep
            return NamePin()
        return NamePin({k: replace(s, digest=digests[k]) for k, s in view.shown.items() if k in digests})

    def pin_names(self, shard: int, rid: RecordId, pin: NamePin, *, build: bool = True) -> None:
        """Show the record (whose staged content just changed) with the names of ``pin`` where they
        hold. ``build=False`` leaves building its view to the next lookup (a large record: the
        writer still holds its content, and a second copy of it is not worth a smaller pin)."""
        key = (shard, rid)
        with self._lock:
            self._pins[key] = pin
        self.invalidate(shard, rid)
        if not build:
            return
        try:
            # Built now, so the pin shrinks at once to what it changes (memory stays small when a
            # script edits many records), instead of at the record's next lookup.
            self.record_view(shard, rid)
        except OSError:
            pass   # the next lookup reports it

    def unpin(self, shard: int, rid: RecordId) -> None:
        """Forget the names kept for a record (deleted, or its name given to another record)."""
        with self._lock:
            self._pins.pop((shard, rid), None)

    def feature_digest(self, message: Any, section: str, key: str) -> bytes:
        """The digest of feature ``key`` of ``section`` in a record message (b"" if it has none)."""
        if section == "feature_lists":
            container = message.feature_lists.feature_list
        else:
            container = message.context.feature if section == "context" else message.features.feature
        return value_digest(container[key]) if key in container else b""

    def _parse(self, shard: int, data: bytes) -> Any:
        cls = proto.SequenceExample if self.kinds[shard] == "sequence" else proto.Example
        return cls.FromString(data)

    def scratch_root(self, shard: int, rid: RecordId) -> str:
        assert self.staging is not None
        tag = f"#{rid}" if isinstance(rid, int) else f"+{rid}"
        return str(self.staging.scratch_dir(self.shards[shard].shard.relpath, tag))

    def _merge_scratch(self, root: Dir, real: str) -> None:
        """Show the user's own folders and scratch files of a record beside its features."""
        try:
            entries = list(os.scandir(real))
        except FileNotFoundError:
            return
        root.scratch = real
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                sub = root.children.get(e.name)
                if not isinstance(sub, Dir):
                    sub = Dir(mtime_ns=root.mtime_ns)
                    root.children[e.name] = sub
                self._merge_scratch(sub, e.path)
            elif e.name not in root.children:
                root.children[e.name] = ScratchFile(e.path)

    def record_message(self, shard: int, rid: RecordId) -> Any:
        """The record's current content as a mutable message (writable mounts)."""
        data, damaged = self.record_bytes(shard, rid)
        if damaged:
            raise DataLoss(damaged)
        return self._parse(shard, data)

    def _view_in_place(self, shard: int, rid: RecordId, naming: _Naming) -> RecordView | None:
        """The view of a large Example whose large images stay in the shard (read-only mounts).

        The record is read into a buffer kept for the purpose and its checksum checked. Each
        image or sound of at least ``_IN_PLACE`` bytes is shown as an ``InShard``, read from
        the shard when it is read; every other feature is parsed from its own bytes. So a 2 MB
        JPEG is neither copied into a message nor out of it, nor held in the record cache.
        None when the record is not such a record, is damaged, or is not in the usual encoding
        (see ``wire``): then ``_build_view`` shows it, and reports what is wrong with it.
        """
        if not isinstance(rid, int) or self.kinds[shard] != "example":
            return None
        idx = self.shards[shard]
        offset, length = idx.span(rid)
        fd = self._fds[shard]
        if length < _IN_PLACE or fd is None or rid in idx.bad:
            return None
        ahead = self._ahead.take((shard, rid))
        try:
            if ahead is None:
                try:
                    data = self._read_into_scratch(fd, offset, length)
                except DataLoss:
                    return None
            self._read_ahead(shard, rid, ahead is not None)
            if ahead is not None and ahead.prepared is not None and naming.pin is None:
                view = ahead.prepared[0]   # built on the worker, after the read (see _prepare)
            else:
                if ahead is not None:
                    data = ahead.data()
                view = self._in_place_view(shard, rid, offset, data, naming)
                data.release()
            if view is not None and ahead is not None:
                self._hold(shard, rid, offset + tfrecord.HEADER, ahead)
                ahead = None
            return view
        finally:
            if ahead is not None:
                self._ahead.give_back(ahead)

    def _read_into_scratch(self, fd: int, offset: int, length: int) -> memoryview:
        """The record's data, read and checked into this thread's reused buffer (a view of it,
        valid until the next such read); ``DataLoss`` if it is damaged."""
        buf = getattr(self._scratch, "buf", None)
        if buf is None or len(buf) < length + tfrecord.FOOTER:
            buf = bytearray(length + tfrecord.FOOTER)
            if len(buf) <= _SCRATCH_MAX:
                self._scratch.buf = buf
        return tfrecord.read_record_into(fd, offset, length, buf)

    def _hold(self, shard: int, rid: int, start: int, record: Record) -> None:
        """Serve the images of a record read ahead from its buffer (see ``read_held``)."""
        with self._lock:
            self._held[(shard, rid)] = (start, record)
            while len(self._held) > _HELD:
                self._ahead.give_back(self._held.popitem(last=False)[1][1])

    def read_held(self, node: Node, size: int, offset: int) -> memoryview | None:
        """``size`` bytes at ``offset`` of a large image whose record was read ahead and is
        still held in memory, as a view of that memory (valid until the next call into the
        tree); else None. Its bytes were read past the page cache, so reading them from the
        shard instead would go to the disk again."""
        if not (isinstance(node, DataFile) and isinstance(node.data, InShard)) or node.damaged:
            return None
        where = node.data
        with self._lock:
            for (shard, _rid), (start, record) in self._held.items():
                if shard == where.shard and start <= where.offset < start + record.length:
                    at = record.start + where.offset - start + offset
                    count = max(0, min(size, where.length - offset))
                    return memoryview(record.buf)[at:at + count]
        return None

    def _read_ahead(self, shard: int, rid: int, was_ahead: bool) -> None:
        """Start reading the records after ``rid`` (as many as ``MAX_AHEAD``) when the
        shard's large records are being read in order (this one was read ahead, or follows
        the last one read)."""
        previous = self._last_in_place.get(shard)
        self._last_in_place[shard] = rid
        if not (was_ahead or previous == rid - 1):
            return
        idx = self.shards[shard]
        fd = self._fds[shard]
        if fd is None:
            return
        for nxt in range(rid + 1, min(idx.count, rid + 1 + MAX_AHEAD)):
            if nxt in idx.bad:
                return
            offset, length = idx.span(nxt)
            if length < _IN_PLACE:
                return
            self._ahead.start((shard, nxt), fd, offset, length, functools.partial(self._prepare, shard, nxt, offset))

    def _prepare(self, shard: int, rid: int, offset: int, record: Record) -> tuple[RecordView | None]:
        """The view of a record read ahead, built on the read-ahead worker once the record is read
        and checked, so that looking the record up costs the main thread no parsing. (Read-only
        mounts: nothing it reads changes, and no names are pinned.) In a 1-tuple, as None is a
        view too: the record is not one ``_in_place_view`` shows."""
        data = record.data()
        try:
            return (self._in_place_view(shard, rid, offset, data, _Naming(None, None)),)
        finally:
            data.release()

    def _in_place_view(self, shard: int, rid: int, offset: int, data: memoryview,
                       naming: _Naming) -> RecordView | None:
        idx = self.shards[shard]
        spans = wire.feature_spans(data)
        if spans is None:
            return None
        values: dict[str, codec.Value] = {}
        in_place: dict[str, codec.FileView] = {}
        try:
            for key, (start, end) in spans.items():
                if end - start >= _IN_PLACE:
                    one = wire.single_bytes_value(data, start, end)
                    if one is not None:
                        piece = data[one[0]:one[1]]
                        suffix = codec.sniff_media(piece)
                        if suffix is not None:
                            values[key] = codec.Value("bytes_list", (piece,))
                            where = InShard(shard, offset + tfrecord.HEADER + one[0], len(piece))
                            in_place[key] = codec.FileView(suffix, where)   # type: ignore[arg-type]
                            continue
                values[key] = codec.value_from_proto(proto.Feature.FromString(data[start:end]))
            root = self._features_dir({}, "", idx.shard.mtime_ns, None, naming, values, in_place)
        except Exception:  # noqa: BLE001 - a feature that does not parse: the usual path reports it
            return None
        return RecordView(root, 256 + _held_bytes(root))

    def _build_view(self, shard: int, rid: RecordId, data: bytes, damaged: str | None,
                    naming: _Naming) -> RecordView:
        idx = self.shards[shard]
        mtime = idx.shard.mtime_ns
        try:
            if self.kinds[shard] == "sequence":
                msg = proto.SequenceExample.FromString(data)
                root = Dir(mtime_ns=mtime)
                root.children["context"] = self._features_dir(msg.context.feature, "context", mtime, damaged,
                                                              naming)
                root.children["feature_lists"] = self._feature_lists_dir(msg.feature_lists.feature_list, mtime,
                                                                         damaged, naming)
            else:
                msg = proto.Example.FromString(data)
                root = self._features_dir(msg.features.feature, "", mtime, damaged, naming)
        except Exception as exc:  # noqa: BLE001 - any parse failure means "show it raw"
            if isinstance(rid, int) and rid not in idx.bad:
                offset, _ = idx.span(rid)
                reason = (f"record does not parse as "
                          f"{'SequenceExample' if self.kinds[shard] == 'sequence' else 'Example'}: "
                          f"{exc or type(exc).__name__}")
                self.errors.add(idx.shard.relpath, rid, offset, reason)
                ch = self.changes(shard)
                if not (ch is not None and rid in ch.edited):
                    idx.bad.add(rid)
                    idx.problems.append(Problem(offset, reason, rid))
                    if self.on_bad is not None:
                        self.on_bad(idx)
            naming.kept.clear()
            return RecordView(Dir(mtime_ns=mtime), 64)
        shown = naming.shown or {}
        return RecordView(root, 256 + len(data) * 2 + 128 * len(shown), shown)

    def _features_dir(self, features: Mapping, section: str, mtime: int, damaged: str | None,
                      naming: _Naming, values: Mapping[str, codec.Value] | None = None,
                      in_place: Mapping[str, codec.FileView] | None = None) -> Dir:
        """The folder of a record's features (``values`` given: ``features`` is not read;
        ``in_place``: views of images left in the shard, unless they are raw pixel arrays)."""
        if values is None:
            values = {key: codec.value_from_proto(feat) for key, feat in features.items()}
        shapes = codec.raw_shapes(values) if self.decode_raw else {}
        held = naming.held(section, features)
        views: dict[str, codec.View] = {}
        for key, value in values.items():
            shown = held.get(key)
            shape = shapes.get(key)
            if shape is None and shown is not None and shown.shape is not None:
                # Its height, width or depth went or changed, its pixels did not: it stays the PNG
                # it was (same name, same picture) until a commit.
                shape = shown.shape
                naming.kept.add((section, key))
            views[key] = in_place[key] if in_place and key in in_place and shape is None \
                else codec.render(value, shape)
            if shown is not None and shown.stems is not None and value.kind == "bytes_list":
                items = [codec.render(codec.Value("bytes_list", (v,))) for v in value.values]
                views[key] = self._keep_items(views[key], shown.stems, ".list", items, (section, key), naming)
        return self._place(views, {k: v.kind for k, v in values.items()}, section, mtime, damaged, naming, held)

    def _feature_lists_dir(self, lists: Mapping, mtime: int, damaged: str | None, naming: _Naming) -> Dir:
        views: dict[str, codec.View] = {}
        kinds: dict[str, str] = {}
        held = naming.held("feature_lists", lists)
        for key, flist in lists.items():
            steps = [codec.value_from_proto(f) for f in flist.feature]
            views[key] = codec.render_feature_list(steps)
            shown = held.get(key)
            if shown is not None and shown.stems is not None:
                views[key] = self._keep_items(views[key], shown.stems, ".steps", [codec.render(s) for s in steps],
                                              ("feature_lists", key), naming)
            step_kinds = {s.kind for s in steps}
            kinds[key] = step_kinds.pop() if len(step_kinds) == 1 else "feature_list"
        return self._place(views, kinds, "feature_lists", mtime, damaged, naming, held)

    @staticmethod
    def _keep_items(rules: codec.View, stems: tuple[str, ...], suffix: str, items: list[codec.View],
                    where: PinKey, naming: _Naming) -> codec.View:
        """A .list/ or .steps/ folder shown with the item names it had: after an item was removed,
        the later ones keep their numbers, and one value or all-text steps left stay a folder."""
        if isinstance(rules, codec.DirView) and rules.suffix == suffix and \
                tuple(name for name, _ in rules.items) == stems:
            return rules
        if len(items) != len(stems):
            return rules    # the pin no longer matches the value: the rules decide
        naming.kept.add(where)
        return codec.DirView(suffix, tuple(zip(stems, items)))

    def _place(self, views: Mapping[str, codec.View], kinds: Mapping[str, str], section: str, mtime: int,
               damaged: str | None, naming: _Naming, held: Mapping[str, Shown]) -> Dir:
        """Lay the features of one folder out by the key -> path rules, features that a pin holds
        where they were."""
        root = Dir(mtime_ns=mtime)
        paths = names.layout([(key, view.suffix) for key, view in views.items()])
        if held:
            # A clash (SPEC 3.1) that a removed feature no longer makes must not rename the other one.
            wishes = {key: s.folders + (s.stem + views[key].suffix,) for key, s in held.items()}
            paths, moved = _settle(paths, wishes)
            naming.kept.update((section, key) for key in moved)
        for key, comps in paths.items():
            parent = root
            for depth, comp in enumerate(comps[:-1]):
                nxt = parent.children.get(comp)
                if not isinstance(nxt, Dir):
                    part = "/".join(key.split("/")[:depth + 1]) if len(comps) > 1 else key
                    nxt = Dir(mtime_ns=mtime, xattrs=_key_xattrs(part, None))
                    parent.children[comp] = nxt
                parent = nxt
            view = views[key]
            xattrs = _key_xattrs(key, kinds[key])
            raw = isinstance(view, codec.FileView) and view.raw_shape is not None
            parent.children[comps[-1]] = self._view_node(view, xattrs, mtime, damaged, Loc(section, key, None, raw))
            if naming.shown is not None:
                naming.shown[(section, key)] = _shown(view, comps, (section, key) in naming.kept)
        return root

    def _view_node(self, view: codec.View, xattrs: Mapping[str, bytes], mtime: int,
                   damaged: str | None, loc: Loc) -> Node:
        if isinstance(view, codec.FileView):
            return DataFile(view.data, mtime, xattrs, damaged, loc)
        d = Dir(mtime_ns=mtime, xattrs=xattrs, loc=loc)
        for i, (name, item) in enumerate(view.items):
            d.children[name + item.suffix] = self._view_node(item, xattrs, mtime, damaged,
                                                             Loc(loc.section, loc.key, i))
        return d

    # -- schema -------------------------------------------------------------

    def schema(self) -> dict:
        """Per feature key: kind, records holding it, min/max value counts, how it is shown."""
        if self._schema is not None:
            return self._schema
        started = time.monotonic()
        total = sum(idx.count for idx in self.shards)
        # It reads every record: say so, as the mount answers nothing else meanwhile.
        log.info("reading all %d records for the dataset's schema (.tfrfs/schema.json, kinds of keys)", total)
        features: dict[str, dict] = {}
        lists: dict[str, dict] = {}
        shards = []
        for n, idx in enumerate(self.shards):
            shards.append({"shard": idx.shard.relpath, "records": idx.count, "kind": self.kinds[n],
                           "compression": idx.shard.compression})
            if self.kinds[n] == "raw":
                continue
            for i in range(idx.count):
                if i in idx.bad:
                    continue
                data, _ = self.read_record(n, i)
                try:
                    if self.kinds[n] == "sequence":
                        msg = proto.SequenceExample.FromString(data)
                        _tally(features, msg.context.feature, self.decode_raw)
                        _tally_lists(lists, msg.feature_lists.feature_list)
                    else:
                        _tally(features, proto.Example.FromString(data).features.feature, self.decode_raw)
                except Exception:  # noqa: BLE001 - unparsable records are reported when opened
                    continue
        log.info("schema of %d records read in %.1fs", total, time.monotonic() - started)
        out: dict = {"shards": shards, "features": _finish(features)}
        if lists:
            out["feature_lists"] = _finish(lists)
        self._schema = out
        return out

    def schema_bytes(self) -> bytes:
        return (json.dumps(self.schema(), ensure_ascii=False, indent=2, sort_keys=True) + "\n").encode()

    def close(self) -> None:
        with self._lock:
            self._held.clear()
        self._ahead.close()
        for n, fd in enumerate(self._fds):
            if fd is not None:
                os.close(fd)
                self._fds[n] = None
        with self._lock:
            for fd in self._plain_fds.values():
                os.close(fd)
            self._plain_fds.clear()
            self._bins.clear()


def _tally(acc: dict[str, dict], features: Mapping, decode_raw: bool) -> None:
    values = {key: codec.value_from_proto(feat) for key, feat in features.items()}
    shapes = codec.raw_shapes(values) if decode_raw else {}
    for key, value in values.items():
        entry = acc.setdefault(key, {"kinds": {}, "records": 0, "min_values": None, "max_values": None,
                                     "shown": {}})
        shown = "raw pixels .png" if key in shapes else codec.suffix_of(value)
        _count(entry, value.kind, len(value.values), shown)


def _tally_lists(acc: dict[str, dict], lists: Mapping) -> None:
    for key, flist in lists.items():
        steps = [codec.value_from_proto(f) for f in flist.feature]
        kinds = {s.kind for s in steps}
        entry = acc.setdefault(key, {"kinds": {}, "records": 0, "min_values": None, "max_values": None,
                                     "shown": {}})
        _count(entry, kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "empty"), len(steps),
               codec.render_feature_list(steps).suffix)


def _count(entry: dict, kind: str, n: int, suffix: str) -> None:
    entry["records"] += 1
    entry["kinds"][kind] = entry["kinds"].get(kind, 0) + 1
    entry["shown"][suffix] = entry["shown"].get(suffix, 0) + 1
    entry["min_values"] = n if entry["min_values"] is None else min(entry["min_values"], n)
    entry["max_values"] = n if entry["max_values"] is None else max(entry["max_values"], n)


def _finish(acc: dict[str, dict]) -> dict[str, dict]:
    out = {}
    for key, e in acc.items():
        kinds = sorted(e["kinds"], key=lambda k: -e["kinds"][k])
        out[key] = {"kind": kinds[0] if len(kinds) == 1 else kinds, "records": e["records"],
                    "min_values": e["min_values"], "max_values": e["max_values"],
                    "shown_as": sorted(e["shown"], key=lambda s: -e["shown"][s])}
    return out


def _shown(view: codec.View, comps: tuple[str, ...], kept: bool) -> Shown:
    name = comps[-1]
    stem = name[:len(name) - len(view.suffix)]
    if isinstance(view, codec.FileView):
        return Shown(comps[:-1], stem, view.raw_shape, None, kept)
    return Shown(comps[:-1], stem, None, tuple(item for item, _ in view.items), kept)


def _settle(layout: Mapping[str, tuple[str, ...]], wishes: Mapping[str, tuple[str, ...]]
            ) -> tuple[Mapping[str, tuple[str, ...]], set[str]]:
    """The paths of ``layout`` with each feature moved to the path it wishes for, where that
    clashes with no other entry; and the keys moved."""
    moves = sorted((key, wish) for key, wish in wishes.items() if layout[key] != wish)
    if not moves:
        return layout, set()
    paths = dict(layout)
    files = {path: key for key, path in paths.items()}
    folders = Counter(path[:i] for path in paths.values() for i in range(1, len(path)))

    def count(path: tuple[str, ...], by: int) -> None:
        for i in range(1, len(path)):
            folders[path[:i]] += by

    moved = set()
    for key, wish in moves:
        old = paths[key]
        del files[old]
        count(old, -1)
        free = wish not in files and not folders[wish] and not any(wish[:i] in files for i in range(1, len(wish)))
        new = wish if free else old
        files[new] = key
        count(new, 1)
        paths[key] = new
        if free:
            moved.add(key)
    return paths, moved


def _value_digests(message: Any) -> dict[PinKey, bytes]:
    """The digest of every feature (and feature list) of a parsed record."""
    if isinstance(message, proto.SequenceExample):
        out = {("context", k): value_digest(f) for k, f in message.context.feature.items()}
        out.update({("feature_lists", k): value_digest(f) for k, f in message.feature_lists.feature_list.items()})
        return out
    return {("", k): value_digest(f) for k, f in message.features.feature.items()}


_XATTRS: dict[tuple[str, str | None], Mapping[str, bytes]] = {}


def _key_xattrs(key: str, kind: str | None) -> Mapping[str, bytes]:
    """The xattrs of a feature (key and kind) or of a nested-key folder (key): shared between
    records, as most records of a dataset have the same keys."""
    got = _XATTRS.get((key, kind))
    if got is None:
        attrs = {"user.tfrfs.key": _xkey(key)}
        if kind is not None:
            attrs["user.tfrfs.kind"] = kind.encode()
        if len(_XATTRS) >= 1 << 14:
            _XATTRS.clear()
        got = _XATTRS[(key, kind)] = MappingProxyType(attrs)
    return got


def _held_bytes(d: Dir) -> int:
    """The bytes a record's view holds (images left in the shard hold none)."""
    n = 0
    for child in d.children.values():
        if isinstance(child, Dir):
            n += 64 + _held_bytes(child)
        elif isinstance(child, DataFile) and isinstance(child.data, bytes):
            n += 64 + len(child.data)
    return n


def _is_dir(node: Node) -> bool:
    return isinstance(node, (Dir, ShardDir, RecordDir))


def _mtime_ns(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0
