"""The namespace of a mount: path -> node, and what each node lists, holds and says.

This module knows nothing of FUSE. ``Tree.lookup`` resolves a path to a node once; ``stat``,
``names``, ``entries``, ``open``, ``serve`` and ``xattrs`` answer for that node. The mirror of
SOURCE (folders, plain files, shard folders) is built at start; shard folders are listed from the
index alone; what is inside a record folder is the record store's view of that record, to which
a writable mount adds the user's own folders and scratch files (real files under the staging
folder).
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Iterator, Mapping

from tfrfs.format import names
from tfrfs.errors import DataLoss, NameTooLong, NotFound
from tfrfs.index.shard_index import ShardIndex
from tfrfs.index.discovery import Discovery
from tfrfs.view.nodes import Dir, MetaFile, Node, PlainFile, ReadHandle, RecordBin, RecordDir, RecordId, ScratchFile, ShardDir, Stat, as_bytes, record_name_width
from tfrfs.storage.open_files import OpenFiles
from tfrfs.storage.readers import Served
from tfrfs.view.records import RecordStore
from tfrfs.view.schema import Schema

META = ".tfrfs"       # the hidden metadata folder at the root
_PLAIN_FDS = 64       # plain files kept open for reads by path
_KNOWN = 4096         # shard and record folders a read-only mount remembers by path (see lookup)


class Tree:
    """Every path's node, listing, content and xattrs."""

    def __init__(self, discovery: Discovery, store: RecordStore, schema: Schema) -> None:
        self.discovery = discovery
        self.store = store
        self.schema = schema
        self.errors = store.errors
        self.writable = store.writable
        self._plain = OpenFiles(discovery.access.plain_path, _PLAIN_FDS)
        self.meta = Dir(mtime_ns=0)
        self.dirs: dict[str, Dir] = {}
        self._known: dict[str, Node] = {}   # path -> shard or record folder (read-only mounts; see lookup)
        # Folders shown as a manifest says, to compare with the disk when first visited (SPEC 1.2).
        self._unchecked: dict[int, str] = {}
        self._check: Callable[[str], None] | None = None
        # One check at a time: a check may add, replace or hide shards, which the whole tree shares.
        self._checking = threading.RLock()
        self.root = self._build_static()
        store.note_problems()
        self.meta.children["schema.json"] = MetaFile("schema.json", self.schema.as_json)
        self.meta.children["errors"] = MetaFile("errors", self.errors.render)
        if store.overlay is not None:
            store.on_view = self._add_scratch_entries

    # -- the mirror of SOURCE ------------------------------------------------------

    def _build_static(self) -> Dir:
        d = self.discovery
        files = d.access
        root_mtime = files.dir_mtime_ns("")
        root = Dir(mtime_ns=root_mtime)
        self.meta.mtime_ns = root_mtime
        self.dirs = {"": root}
        for rel in d.dirs:
            if rel:
                parent = self.dirs[os.path.dirname(rel)]
                sub = Dir(mtime_ns=files.dir_mtime_ns(rel))
                parent.children[os.path.basename(rel)] = sub
                self.dirs[rel] = sub
        for rel in d.plain_files:
            size, mtime_ns = files.plain_stat(rel)
            self.dirs[os.path.dirname(rel)].children[os.path.basename(rel)] = PlainFile(rel, size, mtime_ns)
        for n in range(len(self.store.shards)):
            self.show_shard(n)
        return root

    def show_shard(self, n: int) -> None:
        """Show shard ``n``'s folder where its path says (again, after it was hidden)."""
        self._known.clear()
        idx = self.store.shards[n]
        rel = idx.shard.relpath
        parent = self.dirs.get(os.path.dirname(rel), self.dirs[""])
        parent.children[os.path.basename(rel)] = ShardDir(n, idx.shard.mtime_ns)

    def hide_shard(self, n: int) -> None:
        self._known.clear()
        rel = self.store.relpath(n)
        parent = self.dirs.get(os.path.dirname(rel), self.dirs[""])
        parent.children.pop(os.path.basename(rel), None)
        self.store.forget_shard(n)

    def add_shard(self, idx: ShardIndex, kind: str) -> int:
        """Show a shard that is not among the source's files yet (a new shard of a writable mount)."""
        n = self.store.add_shard(idx, kind)
        self.show_shard(n)
        return n

    def replace_shard(self, n: int, idx: ShardIndex) -> None:
        """Serve shard ``n`` from a new file and index (after a commit): records are renumbered."""
        self.store.replace_shard(n, idx)
        self.show_shard(n)
        self.schema.forget()

    def check_folders(self, check: Callable[[str], None]) -> None:
        """Every mirrored folder is shown as a manifest says until first visited: then
        ``check(relpath)`` compares it with the disk (and may change what it holds)."""
        self._check = check
        self._unchecked = {id(d): rel for rel, d in self.dirs.items()}

    def settle(self, node: Node) -> None:
        """Compare a folder with the disk before its first use (see ``check_folders``). A thread
        that asks while another compares it waits until that is done: it is marked checked only
        then, so that no one lists a folder half changed."""
        if not self._unchecked or id(node) not in self._unchecked:   # (GIL-atomic look-ups)
            return
        with self._checking:
            rel = self._unchecked.get(id(node))
            if rel is None:
                return
            try:
                if self._check is not None and self.dirs.get(rel) is node:
                    self._check(rel)
            finally:
                self._unchecked.pop(id(node), None)

    @property
    def meta_mtime_ns(self) -> int:
        """The time of ``.tfrfs/`` and of the files in it."""
        return self.meta.mtime_ns

    def is_source_folder(self, node: Node) -> bool:
        """A folder that mirrors one of SOURCE's folders (new shards can be made in it)."""
        return self.discovery.mirrors_dir and any(node is d for d in self.dirs.values())

    # -- lookup --------------------------------------------------------------------

    def lookup(self, path: str) -> Node:
        """The node at ``path`` ("/" separated, from the mount's root).

        A read-only mount remembers the last ``_KNOWN`` shard and record folders it found: each
        request names its node by path, and finding a record folder means reading its name
        against the shard's index, once per request for every file in it.
        """
        node: Node = self.root
        if path in ("/", ""):
            return node
        if not self.writable:
            known = self._known.get(path)   # (a dict read: safe without the lock)
            if known is not None:
                return known
            # the nearest folder above it that is known: a file deep in a record is found from
            # its record's folder, whose name is not read against the index again
            head, below = path, []
            while True:
                head, _, name = head.rpartition("/")
                below.append(name)
                if not head:
                    break
                above = self._known.get(head)
                if above is not None:
                    node = above
                    for name in reversed(below):
                        node = self.child(node, name)
                    self._remember(path, node)
                    return node
        comps = path.strip("/").split("/")
        if comps[0] == META:
            # Reachable by name but never listed, so cp -r, rsync and find leave it alone
            # (and ls -lR does not make schema.json parse the whole dataset).
            node = self.meta
            comps = comps[1:]
        for comp in comps:
            node = self.child(node, comp)
        if not self.writable:
            self._remember("/" + path.strip("/"), node)
        return node

    def _remember(self, path: str, node: Node) -> None:
        if isinstance(node, (ShardDir, RecordDir)):
            known = self._known
            if len(known) >= _KNOWN:
                known.clear()   # (cheaper than keeping an order; most lookups are of the last few)
            known[path] = node

    def locate(self, path: str) -> tuple[Node, RecordDir | None, tuple[str, ...]]:
        """The node at ``path``, the record folder it is in (if any) and its path inside that record."""
        comps = [c for c in path.strip("/").split("/") if c]
        node: Node = self.root
        record: RecordDir | None = None
        inner: list[str] = []
        if comps and comps[0] == META:
            node, comps = self.meta, comps[1:]
        for comp in comps:
            node = self.child(node, comp)
            if record is not None:
                inner.append(comp)
            elif isinstance(node, RecordDir):
                record = node
        return node, record, tuple(inner)

    def child(self, node: Node, name: str) -> Node:
        # (a name of at most NAME_MAX / 4 characters cannot be longer than NAME_MAX bytes)
        if len(name) > names.NAME_MAX // 4 and len(name.encode("utf-8", "surrogateescape")) > names.NAME_MAX:
            raise NameTooLong(f"{name[:40]}...: name longer than {names.NAME_MAX} bytes")
        return node.child(self, name)

    def record_root(self, record: RecordDir) -> Dir:
        """The folder a record folder shows: its features (and the user's own entries). Raises
        DataLoss (EIO) for a record whose data checksum fails: its names cannot be trusted."""
        view = self.store.view(record.shard, record.rid)
        if view.damaged:
            raise DataLoss(view.damaged)
        return view.root

    def is_damaged(self, record: RecordDir) -> bool:
        return self.store.view(record.shard, record.rid).damaged is not None

    def record_entry(self, node: ShardDir, name: str) -> Node:
        """The node of entry ``name`` of a shard folder: a record folder or ``.bin``."""
        store = self.store
        raw_shard = store.kinds[node.shard] == "raw"
        ch = store.layer(node.shard)
        if ch is not None and name in ch.added:
            if raw_shard:
                raise NotFound(name)
            return RecordDir(node.shard, name, node.mtime_ns)
        idx = store.shards[node.shard]
        stem, dot, ext = name.partition(".")
        if (dot and ext != "bin") or not stem.isdigit() or not stem.isascii():
            raise NotFound(name)
        i = int(stem)
        if len(stem) != record_name_width(idx.count) or i >= idx.count or (ch is not None and i in ch.deleted):
            raise NotFound(name)
        if raw_shard or (dot and store.is_bad(node.shard, i)):
            if not dot:
                raise NotFound(name)
            size = len(store.record_bytes(node.shard, i)[0]) if ch is not None and i in ch.edited else idx.span(i)[1]
            # A read of an empty file never reaches the daemon: an empty record's checksum (four
            # bytes to read) is checked here, so that its damage is seen.
            damaged = store.record_bytes(node.shard, i)[1] if size == 0 else None
            return RecordBin(node.shard, i, size, node.mtime_ns, damaged)
        if dot:
            raise NotFound(name)
        # A record found not to parse only now was listed as a folder (listings come from the
        # index alone): its folder stays reachable, empty, and later listings show NNNNNN.bin.
        return RecordDir(node.shard, i, node.mtime_ns)

    # -- stat / list ---------------------------------------------------------------

    def stat(self, node: Node) -> Stat:
        return node.stat_in(self)

    def names(self, node: Node) -> Iterator[tuple[str, bool]]:
        """(name, is_dir) of every entry of a folder node."""
        return node.names(self)

    def entries(self, node: Node, start: int = 0) -> Iterator[tuple[int, str, Node]]:
        """(position, name, node) of a folder's entries from position ``start`` on.

        The names and order are ``names``'. Positions grow, stay the same while the folder does
        and may skip (a shard folder's are its record numbers), so a listing can resume at any
        of them. Each node is cheap to ``stat``: a shard folder's come from its index, unparsed.
        """
        return node.entries(self, start)

    def shard_listing(self, node: ShardDir, start: int = 0) -> Iterator[tuple[int, str, bool, int]]:
        """(position, name, is_dir, size) of a read-only mount's shard folder's entries, what
        ``entries`` gives without a node each: a record folder's size is 0, a ``.bin``'s its
        record's length. A listing of millions of records is made as it is read."""
        assert not self.writable
        idx = self.store.shards[node.shard]
        for pos, name, folder in self.shard_names(node.shard, start):
            yield pos, name, folder, 0 if folder else idx.span(pos)[1]

    def record_names(self, node: ShardDir) -> Iterator[tuple[RecordId, str, bool]]:
        """(record id, name, is_dir) of a shard folder's entries, in ``names``' order: an
        original record's id is its index, an added record's its name."""
        count = self.store.shards[node.shard].count
        return ((pos if pos < count else name, name, folder) for pos, name, folder in self.shard_names(node.shard))

    def shard_names(self, shard: int, start: int = 0) -> Iterator[tuple[int, str, bool]]:
        """(position, name, is_dir) of a shard folder's entries: record i at position i,
        records added in --rw after the last one."""
        store = self.store
        idx = store.shards[shard]
        width = record_name_width(idx.count)
        raw = store.kinds[shard] == "raw"
        ch = store.layer(shard)
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

    # -- content -------------------------------------------------------------------

    def open(self, node: Node) -> ReadHandle:
        """A handle to read ``node``; a file of a record whose data checksum fails raises
        DataLoss (EIO) at once."""
        return node.open(self)

    def serve(self, node: Node, size: int, offset: int) -> Served:
        """``size`` bytes of a file at ``offset``, with no open handle (read-only mounts).

        A read-only mount answers reads by path (the kernel is told that open is not
        implemented, which saves an open and a release per file), so what a handle would hold
        is kept here instead: recent ``.bin`` records (in the store) and plain files'
        descriptors. Nothing changes under a read-only mount, so neither needs invalidating.
        Large images are answered with where their bytes lie (see ``Served``: the shard's
        descriptor stays open while mounted), plain files with their bytes.

        Several threads may ask at once (as may they ``lookup``, ``stat``, list and ask
        ``xattrs``): what is shared below is guarded where it is kept (the record store's
        caches, each shard's index, the readers, the plain files' descriptors).
        """
        assert not self.writable, "a writable mount reads through handles"
        return node.serve(self, size, offset)

    def read(self, node: Node, size: int, offset: int) -> bytes:
        """``serve``, as bytes."""
        return as_bytes(self.serve(node, size, offset))

    def plain_path(self, path: str) -> str:
        """A local path of plain file ``path`` (relative to SOURCE; a remote one is fetched)."""
        return self.discovery.access.plain_path(path)

    def plain_read(self, path: str, size: int, offset: int) -> bytes:
        """``size`` bytes at ``offset`` of the plain file at ``path`` (relative to SOURCE), through
        a descriptor kept open for the next reads (a remote file is fetched on first use)."""
        return self._plain.pread(path, size, offset)

    def xattrs(self, node: Node) -> Mapping[str, bytes]:
        return node.xattrs_in(self)

    def shard_xattrs(self, shard: int) -> dict[str, bytes]:
        idx = self.store.shards[shard]
        return {"user.tfrfs.shard": idx.shard.relpath.encode(),
                "user.tfrfs.count": str(idx.count).encode(),
                "user.tfrfs.records": self.store.kinds[shard].encode(),
                "user.tfrfs.compression": idx.shard.compression.encode()}

    def record_xattrs(self, shard: int, rid: RecordId) -> dict[str, bytes]:
        idx = self.store.shards[shard]
        out = {"user.tfrfs.shard": idx.shard.relpath.encode()}
        if isinstance(rid, int):
            offset, length = idx.span(rid)
            out.update({"user.tfrfs.index": str(rid).encode(), "user.tfrfs.offset": str(offset).encode(),
                        "user.tfrfs.length": str(length).encode()})
        return out

    # -- the user's own entries in records (writable mounts) ---------------------------

    def scratch_root(self, shard: int, rid: RecordId) -> str:
        """The real folder that holds the user's own folders and scratch files of a record."""
        overlay = self.store.overlay
        assert overlay is not None
        return overlay.scratch_dir(self.store.relpath(shard), rid)

    def _add_scratch_entries(self, root: Dir, shard: int, rid: RecordId) -> None:
        _merge_scratch(root, self.scratch_root(shard, rid))

    def close(self) -> None:
        self.schema.close()   # before the readers it may be reading through
        self.store.close()
        self._plain.close()


def _merge_scratch(root: Dir, real: str) -> None:
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
            _merge_scratch(sub, e.path)
        elif e.name not in root.children:
            root.children[e.name] = ScratchFile(e.path)
