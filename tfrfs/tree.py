"""The filesystem model: path -> node, and what each node lists, holds and says.

This module knows nothing of FUSE. ``Tree.lookup`` resolves a path to a node
once; ``Tree.stat``, ``Tree.list``, ``Tree.open`` and ``Tree.xattrs`` answer
for that node. Shard folders are listed from the index alone; a record is
parsed only when something inside it is looked at, and parsed records are
kept in an LRU within a memory budget.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Union

from . import codec, names, proto, tfrecord
from .errors import DataLoss, IsADir, NotADir, NotFound, NameTooLong
from .index import Discovery, ShardIndex

log = logging.getLogger("tfrfs")

DEFAULT_CACHE_BYTES = 256 << 20
_ROOT_META = ".tfrfs"


# --- nodes -------------------------------------------------------------------

@dataclass(frozen=True)
class Stat:
    is_dir: bool
    size: int
    mtime_ns: int
    nlink: int = 1


@dataclass(eq=False)
class Dir:
    """A folder whose children are known: the mirror of SOURCE, or inside a record."""

    children: dict[str, "Node"] = field(default_factory=dict)
    mtime_ns: int = 0
    xattrs: Mapping[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class DataFile:
    """A file whose bytes are known (a feature value as shown)."""

    data: bytes
    mtime_ns: int
    xattrs: Mapping[str, bytes]
    damaged: str | None = None   # reason reads fail with EIO


@dataclass(frozen=True)
class ShardDir:
    shard: int          # position in Tree.shards
    mtime_ns: int


@dataclass(frozen=True)
class RecordDir:
    shard: int
    index: int
    mtime_ns: int


@dataclass(frozen=True)
class RecordBin:
    """A record shown as its raw bytes (raw shards, and records that do not parse)."""

    shard: int
    index: int
    size: int
    mtime_ns: int


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


Node = Union[Dir, DataFile, ShardDir, RecordDir, RecordBin, PlainFile, MetaFile]
FILE_NODES = (DataFile, RecordBin, PlainFile, MetaFile)


@dataclass
class RecordView:
    root: Dir
    cost: int


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
    """The read side of a mount: every path's node, listing, content and xattrs."""

    def __init__(self, discovery: Discovery, indexes: list[ShardIndex], *, records: str | None = None,
                 decode_raw: bool = True, writable: bool = False, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 errors: ErrorLog | None = None) -> None:
        self.discovery = discovery
        self.shards = indexes
        self.decode_raw = decode_raw
        self.writable = writable
        self.errors = errors or ErrorLog()
        self.kinds = [records or idx.detected_kind for idx in indexes]
        self.uid = os.getuid()
        self.gid = os.getgid()
        self.file_mode = 0o644 if writable else 0o444
        self.dir_mode = 0o755 if writable else 0o555
        self._fds: list[int | None] = [None] * len(indexes)
        self._cache: OrderedDict[tuple[int, int], RecordView] = OrderedDict()
        self._cache_cost = 0
        self._cache_budget = cache_bytes
        self._lock = threading.RLock()
        self._schema: bytes | None = None
        self.meta = Dir(mtime_ns=0)
        self.root = self._build_static()
        for n, idx in enumerate(indexes):
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
        dirs: dict[str, Dir] = {"": root}
        for rel in d.dirs:
            if rel:
                parent = dirs[os.path.dirname(rel)]
                sub = Dir(mtime_ns=_mtime_ns(os.path.join(d.root, rel)))
                parent.children[os.path.basename(rel)] = sub
                dirs[rel] = sub
        for rel in d.plain_files:
            full = os.path.join(d.root, rel)
            st = os.stat(full)
            dirs[os.path.dirname(rel)].children[os.path.basename(rel)] = PlainFile(full, st.st_size, st.st_mtime_ns)
        for n, idx in enumerate(self.shards):
            rel = idx.shard.relpath
            parent = dirs.get(os.path.dirname(rel), root)
            parent.children[os.path.basename(rel)] = ShardDir(n, idx.shard.mtime_ns)
        return root

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
            return self.child(self.record_view(node.shard, node.index).root, name)
        raise NotADir(name)

    def _record_entry(self, node: ShardDir, name: str) -> Node:
        idx = self.shards[node.shard]
        stem, dot, ext = name.partition(".")
        if (dot and ext != "bin") or not stem.isdigit() or not stem.isascii():
            raise NotFound(name)
        width = record_name_width(idx.count)
        i = int(stem)
        if len(stem) != width or i >= idx.count:
            raise NotFound(name)
        if self.kinds[node.shard] == "raw" or (dot and self._is_bad(node.shard, i)):
            if not dot:
                raise NotFound(name)
            _, length = idx.span(i)
            return RecordBin(node.shard, i, length, node.mtime_ns)
        if dot or self._is_bad(node.shard, i):
            raise NotFound(name)
        return RecordDir(node.shard, i, node.mtime_ns)

    def _is_bad(self, shard: int, index: int) -> bool:
        """Whether record ``index`` does not parse (parsing it now if that is not yet known)."""
        idx = self.shards[shard]
        if index in idx.bad:
            return True
        self.record_view(shard, index)
        return index in idx.bad

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
            root = self.record_view(node.shard, node.index).root
            return Stat(True, 0, node.mtime_ns, self.stat(root).nlink)
        if isinstance(node, MetaFile):
            return Stat(False, len(node.render()), self.meta.mtime_ns)
        raise NotFound(str(node))

    def list(self, node: Node) -> Iterable[tuple[str, bool]]:
        """(name, is_dir) of every entry of a folder node."""
        if isinstance(node, Dir):
            return [(n, _is_dir(c)) for n, c in node.children.items()]
        if isinstance(node, ShardDir):
            return self._list_shard(node.shard)
        if isinstance(node, RecordDir):
            return self.list(self.record_view(node.shard, node.index).root)
        raise NotADir("not a folder")

    def _list_shard(self, shard: int) -> Iterable[tuple[str, bool]]:
        idx = self.shards[shard]
        width = record_name_width(idx.count)
        if self.kinds[shard] == "raw":
            return ((f"{i:0{width}d}.bin", False) for i in range(idx.count))
        bad = idx.bad
        return ((f"{i:0{width}d}.bin", False) if i in bad else (f"{i:0{width}d}", True)
                for i in range(idx.count))

    # -- content ------------------------------------------------------------

    def open(self, node: Node) -> Handle:
        if isinstance(node, DataFile):
            return Handle(node.data, damaged=node.damaged)
        if isinstance(node, RecordBin):
            idx = self.shards[node.shard]
            offset, length = idx.span(node.index)
            try:
                return Handle(tfrecord.read_record(self._fd(node.shard), offset, length))
            except DataLoss as exc:
                self.errors.add(idx.shard.relpath, node.index, offset, str(exc))
                return Handle(damaged=str(exc))
        if isinstance(node, PlainFile):
            return Handle(fd=os.open(node.path, os.O_RDONLY))
        if isinstance(node, MetaFile):
            return Handle(node.render())
        raise IsADir("is a folder")

    def xattrs(self, node: Node) -> Mapping[str, bytes]:
        if isinstance(node, (Dir, DataFile)):
            return node.xattrs
        if isinstance(node, RecordDir):
            return self._record_xattrs(node.shard, node.index)
        if isinstance(node, RecordBin):
            return self._record_xattrs(node.shard, node.index)
        if isinstance(node, ShardDir):
            idx = self.shards[node.shard]
            return {"user.tfrfs.shard": idx.shard.relpath.encode(),
                    "user.tfrfs.count": str(idx.count).encode(),
                    "user.tfrfs.records": self.kinds[node.shard].encode(),
                    "user.tfrfs.compression": idx.shard.compression.encode()}
        return {}

    def _record_xattrs(self, shard: int, index: int) -> dict[str, bytes]:
        idx = self.shards[shard]
        offset, length = idx.span(index)
        return {"user.tfrfs.shard": idx.shard.relpath.encode(), "user.tfrfs.index": str(index).encode(),
                "user.tfrfs.offset": str(offset).encode(), "user.tfrfs.length": str(length).encode()}

    # -- records ------------------------------------------------------------

    def _fd(self, shard: int) -> int:
        fd = self._fds[shard]
        if fd is None:
            fd = self._fds[shard] = self.shards[shard].open()
        return fd

    def read_record(self, shard: int, index: int) -> tuple[bytes, str | None]:
        """A record's bytes, and the reason they cannot be trusted (data checksum), if any."""
        idx = self.shards[shard]
        offset, length = idx.span(index)
        try:
            return tfrecord.read_record(self._fd(shard), offset, length), None
        except DataLoss as exc:
            self.errors.add(idx.shard.relpath, index, offset, str(exc))
            try:
                return tfrecord.read_record(self._fd(shard), offset, length, verify=False), str(exc)
            except DataLoss:
                return b"", str(exc)

    def record_view(self, shard: int, index: int) -> RecordView:
        key = (shard, index)
        with self._lock:
            view = self._cache.get(key)
            if view is not None:
                self._cache.move_to_end(key)
                return view
        data, damaged = self.read_record(shard, index)
        view = self._build_view(shard, index, data, damaged)
        with self._lock:
            self._cache[key] = view
            self._cache_cost += view.cost
            while self._cache_cost > self._cache_budget and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._cache_cost -= old.cost
        return view

    def _build_view(self, shard: int, index: int, data: bytes, damaged: str | None) -> RecordView:
        idx = self.shards[shard]
        mtime = idx.shard.mtime_ns
        try:
            if self.kinds[shard] == "sequence":
                msg = proto.SequenceExample.FromString(data)
                root = Dir(mtime_ns=mtime)
                root.children["context"] = self._features_dir(msg.context.feature, mtime, damaged)
                root.children["feature_lists"] = self._feature_lists_dir(msg.feature_lists.feature_list, mtime, damaged)
            else:
                msg = proto.Example.FromString(data)
                root = self._features_dir(msg.features.feature, mtime, damaged)
        except Exception as exc:  # noqa: BLE001 - any parse failure means "show it raw"
            idx.bad.add(index)
            offset, _ = idx.span(index)
            self.errors.add(idx.shard.relpath, index, offset,
                            f"record does not parse as {'SequenceExample' if self.kinds[shard] == 'sequence' else 'Example'}: {exc or type(exc).__name__}")
            return RecordView(Dir(mtime_ns=mtime), 64)
        if damaged:
            idx.bad.discard(index)
        return RecordView(root, 256 + len(data) * 2)

    def _features_dir(self, features: Mapping, mtime: int, damaged: str | None) -> Dir:
        values = {key: codec.value_from_proto(feat) for key, feat in features.items()}
        shapes = codec.raw_shapes(values) if self.decode_raw else {}
        views = {key: codec.render(v, shapes.get(key)) for key, v in values.items()}
        return self._place(views, {k: v.kind for k, v in values.items()}, mtime, damaged)

    def _feature_lists_dir(self, lists: Mapping, mtime: int, damaged: str | None) -> Dir:
        views: dict[str, codec.View] = {}
        kinds: dict[str, str] = {}
        for key, flist in lists.items():
            steps = [codec.value_from_proto(f) for f in flist.feature]
            views[key] = codec.render_feature_list(steps)
            step_kinds = {s.kind for s in steps}
            kinds[key] = step_kinds.pop() if len(step_kinds) == 1 else "feature_list"
        return self._place(views, kinds, mtime, damaged)

    def _place(self, views: Mapping[str, codec.View], kinds: Mapping[str, str], mtime: int,
               damaged: str | None) -> Dir:
        """Lay the features of one folder out by the key -> path rules."""
        root = Dir(mtime_ns=mtime)
        paths = names.layout([(key, view.suffix) for key, view in views.items()])
        for key, comps in paths.items():
            parent = root
            for depth, comp in enumerate(comps[:-1]):
                nxt = parent.children.get(comp)
                if not isinstance(nxt, Dir):
                    part = "/".join(key.split("/")[:depth + 1]) if len(comps) > 1 else key
                    nxt = Dir(mtime_ns=mtime, xattrs={"user.tfrfs.key": _xkey(part)})
                    parent.children[comp] = nxt
                parent = nxt
            xattrs = {"user.tfrfs.key": _xkey(key), "user.tfrfs.kind": kinds[key].encode()}
            parent.children[comps[-1]] = self._view_node(views[key], xattrs, mtime, damaged)
        return root

    def _view_node(self, view: codec.View, xattrs: Mapping[str, bytes], mtime: int,
                   damaged: str | None) -> Node:
        if isinstance(view, codec.FileView):
            return DataFile(view.data, mtime, xattrs, damaged)
        d = Dir(mtime_ns=mtime, xattrs=xattrs)
        for name, item in view.items:
            d.children[name + item.suffix] = self._view_node(item, xattrs, mtime, damaged)
        return d

    # -- schema -------------------------------------------------------------

    def schema(self) -> dict:
        """Per feature key: kind, records holding it, min/max value counts, how it is shown."""
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
        out: dict = {"shards": shards, "features": _finish(features)}
        if lists:
            out["feature_lists"] = _finish(lists)
        return out

    def schema_bytes(self) -> bytes:
        if self._schema is None:
            self._schema = (json.dumps(self.schema(), ensure_ascii=False, indent=2, sort_keys=True) + "\n").encode()
        return self._schema

    def close(self) -> None:
        for n, fd in enumerate(self._fds):
            if fd is not None:
                os.close(fd)
                self._fds[n] = None


def _tally(acc: dict[str, dict], features: Mapping, decode_raw: bool) -> None:
    values = {key: codec.value_from_proto(feat) for key, feat in features.items()}
    shapes = codec.raw_shapes(values) if decode_raw else {}
    for key, value in values.items():
        entry = acc.setdefault(key, {"kinds": {}, "records": 0, "min_values": None, "max_values": None,
                                     "shown": {}})
        shown = "raw pixels .png" if key in shapes else codec.render(value).suffix
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


def _is_dir(node: Node) -> bool:
    return isinstance(node, (Dir, ShardDir, RecordDir))


def _mtime_ns(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0
