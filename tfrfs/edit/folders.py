"""Folders of a writable mount (SPEC 7): mkdir and rmdir of records, shards, and folders inside
a record (nested keys, ``.list/`` and ``.steps/``, the user's own folders)."""

from __future__ import annotations

import os
import time
from array import array

from tfrfs.storage import durable
from tfrfs.format import names
from tfrfs.format import tfrecord
from tfrfs.errors import Exists, Invalid, NotADir, NotEmpty, NotFound, NotPermitted
from tfrfs.index.shard_index import ShardIndex
from tfrfs.index.discovery import ShardFile
from tfrfs.view.nodes import Dir, RecordDir, ShardDir
from tfrfs.edit.stager import Stager, is_scratch, is_scratch_path, is_step_folder, split_path

SECTIONS = ("context", "feature_lists")   # the two folders of a SequenceExample record (SPEC 4)


class FolderEditor:
    def __init__(self, stager: Stager) -> None:
        self.stager = stager
        self.tree = stager.tree
        self.store = stager.store
        self.session = stager.session
        self.staging = stager.staging
        self._show_staged_shards()

    def _show_staged_shards(self) -> None:
        """Show new and removed shards staged by an earlier mount."""
        for relpath, ch in self.staging.shards.items():
            n = self.store.shard_number(relpath)
            if n is None and not ch.removed:
                self.tree.add_shard(empty_index(self.stager.root, relpath, ch.compression), ch.kind)
            elif n is not None and ch.removed:
                self.tree.hide_shard(n)

    def mkdir(self, path: str) -> None:
        parent_path, name = split_path(path)
        parent, record, inner = self.tree.locate(parent_path)
        try:
            self.tree.child(parent, name)
            raise Exists(path)
        except NotFound:
            pass
        if record is not None:
            if not inner and name in SECTIONS and self.store.kinds[record.shard] == "sequence":
                self._make_section(record, name)
                return
            if not is_scratch_path(inner + (name,)) and _inside_items(inner, name):
                raise Invalid("folders cannot be made inside a .list/ folder, nor inside .steps/ other than a "
                              "step's own N.list/ (a step of several values)")
            try:
                self.stager.keep_folders(record, inner + (name,))
            finally:
                self.session.invalidate(record.shard, record.rid)
            return
        if isinstance(parent, ShardDir):
            self.add_record(parent.shard, name, self._empty_record(parent.shard))
            return
        if self.tree.is_source_folder(parent):
            self._add_shard(parent_path, name)
            return
        raise NotPermitted(f"{path}: folders can be made in record folders, shard folders and source folders")

    def _empty_record(self, shard: int) -> bytes:
        # An empty Example and an empty SequenceExample are both no bytes: a new record of a
        # sequence shard starts with neither context/ nor feature_lists/ (SPEC 4).
        return b""

    def _make_section(self, record: RecordDir, name: str) -> None:
        """mkdir context/ or feature_lists/ in a SequenceExample record made in this mount: the
        record holds that part from now on (empty)."""
        msg = self.store.message(record.shard, record.rid)
        getattr(msg, name).SetInParent()
        self.stager.stage_record(record.shard, record.rid, msg.SerializeToString(deterministic=True))

    def _remove_section(self, record: RecordDir, name: str) -> None:
        msg = self.store.message(record.shard, record.rid)
        msg.ClearField(name)
        self.stager.stage_record(record.shard, record.rid, msg.SerializeToString(deterministic=True))

    def add_record(self, shard: int, name: str, data: bytes) -> None:
        if is_scratch(name) or not name:
            raise Invalid(f"{name}: record names may not start with '.' or end with '~'")
        if self.store.kinds[shard] == "raw":
            raise Invalid("records of a raw shard are files; they cannot be added as folders")
        ch = self.stager.changes(shard)
        try:
            self.staging.put_added(ch, name, data)
        finally:
            self.session.invalidate(shard, name)

    def _add_shard(self, parent_path: str, name: str) -> None:
        rel_parent = parent_path.strip("/")
        relpath = os.path.join(rel_parent, name) if rel_parent else name
        existing = self.store.shard_number(relpath)
        if os.path.exists(os.path.join(self.stager.root, relpath)) and existing is None:
            raise Exists(f"{relpath}: a file of that name exists in the source folder")
        lower = name.lower()
        compression = (tfrecord.GZIP if lower.endswith(".gz") else
                       tfrecord.ZLIB if lower.endswith(".zlib") else tfrecord.NONE)
        kinds = set(self.store.kinds)
        kind = kinds.pop() if len(kinds) == 1 else "example"
        ch = self.staging.shards.get(relpath)
        if existing is not None and ch is not None and ch.removed:
            # Removed and made again before a commit: an empty shard of the same name.
            for i in range(self.store.shards[existing].count):
                if i not in ch.deleted:
                    self.staging.delete_record(ch, i)
            for added in list(ch.added):
                self.staging.remove_added(ch, added)
            self.staging.set_removed(ch, False)
            self.tree.show_shard(existing)
            return
        try:
            self.staging.shard(relpath, compression=compression, kind=kind, new=True)
        finally:
            if relpath in self.staging.shards:   # on disk, even if a later step of it failed
                self.tree.add_shard(empty_index(self.stager.root, relpath, compression), kind)

    def rmdir(self, path: str) -> None:
        node, record, inner = self.tree.locate(path)
        if isinstance(node, ShardDir):
            if any(True for _ in self.tree.names(node)):
                raise NotEmpty(path)
            self.staging.set_removed(self.stager.changes(node.shard), True)
            self.tree.hide_shard(node.shard)
            return
        if isinstance(node, RecordDir):
            # A damaged record cannot be listed, so nothing can be removed from it first: rmdir
            # drops it whole.
            if not self.tree.is_damaged(node) and has_files(self.tree.record_root(node)):
                raise NotEmpty(path)
            self.stager.delete_record(node.shard, node.rid)
            return
        if record is None or not isinstance(node, Dir):
            if isinstance(node, Dir):
                raise NotPermitted(f"{path}: source folders cannot be removed")
            raise NotADir(path)
        if node.children:
            raise NotEmpty(path)
        if inner in (("context",), ("feature_lists",)) and isinstance(record.rid, str) and \
                self.store.kinds[record.shard] == "sequence":
            # Made in this mount, it can go again, as cp -r's undo (rm -r) expects.
            self._remove_section(record, inner[0])
        try:
            if node.scratch:
                os.rmdir(node.scratch)
                durable.fsync_dir(os.path.dirname(node.scratch))
        finally:
            self.session.invalidate(record.shard, record.rid)


def _inside_items(inner: tuple[str, ...], name: str) -> bool:
    """Whether folder ``name`` in ``inner`` would be inside a .list/ or .steps/ folder, where only
    a step's own N.list/ folder (in .steps/) may be made (SPEC 4: a step is shown like a value)."""
    if any(names.split_suffix(c)[1] in (".list", ".steps") for c in inner[:-1]):
        return True
    if not inner:
        return False
    suffix = names.split_suffix(inner[-1])[1]
    return suffix == ".list" or (suffix == ".steps" and not is_step_folder(name))


def has_files(d: Dir) -> bool:
    for c in d.children.values():
        if not isinstance(c, Dir) or has_files(c):
            return True
    return False


def empty_index(root: str, relpath: str, compression: str) -> ShardIndex:
    """The index of a shard that has no file yet (made in the mount, not committed)."""
    path = os.path.join(root, relpath)
    shard = ShardFile(path=os.path.abspath(path), relpath=relpath, compression=compression, size=0,
                      mtime_ns=time.time_ns())
    return ShardIndex(shard, os.devnull, array("Q", [0]), "example")
