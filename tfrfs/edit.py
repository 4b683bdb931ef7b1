"""Feature files of a writable mount: open, create, write, truncate, close and rm (SPEC 7).

Content written to a file collects in a temporary file (``handles.WriteHandle``) and is judged
only when the file is flushed (closed), never on an intermediate state such as the truncation
that precedes new content; what fits is put into the record (``mutate``) and the record staged
(``stager``).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from . import durable, mutate, names
from .errors import Invalid, IsADir, ReadOnly
from .handles import ScratchHandle, WriteHandle
from .mutate import Target
from .nodes import (DataFile, Dir, MetaFile, Node, PlainFile, RecordBin, RecordDir, ScratchFile, ShardDir)
from .pins import NamePin, feature_digest
from .stager import Stager, is_scratch, split_path


class FileEditor:
    """Feature files: their content, their creation and removal."""

    def __init__(self, stager: Stager, commit: Callable[[bytes], Any]) -> None:
        self.stager = stager
        self.tree = stager.tree
        self.store = stager.store
        self.commit = commit   # writing to .tfrfs/commit runs it, with what was written
        self.pending: dict[str, WriteHandle] = {}   # path -> handle of a file created and not yet flushed

    def pending_size(self, path: str) -> int | None:
        """The size of a file being created (no feature behind it yet), or None."""
        h = self.pending.get(path)
        return h.size() if h is not None else None

    # -- open / create / flush -----------------------------------------------------

    def open(self, path: str, flags: int) -> WriteHandle | ScratchHandle:
        node, record, inner = self.tree.locate(path)
        if isinstance(node, ScratchFile):
            return ScratchHandle(node.path, flags)
        if isinstance(node, (PlainFile, MetaFile)) and not _is_commit_file(node):
            raise ReadOnly(f"{path}: only records can be changed")
        if isinstance(node, (Dir, ShardDir, RecordDir)):
            raise IsADir(path)
        fd, tmp = self.stager.staging.tmp_file()
        if not flags & os.O_TRUNC and not isinstance(node, MetaFile):
            os.write(fd, self.tree.open(node).read(1 << 62, 0))
        handle = WriteHandle(self, path, fd, tmp, new=False)
        # O_TRUNC emptied the file: that is a change, judged at the last close even if nothing
        # is written (`: > f`, `cp /dev/null f`), or the old value would silently stay.
        handle.dirty = bool(flags & os.O_TRUNC)
        return handle

    def create(self, path: str, flags: int) -> WriteHandle | ScratchHandle:
        parent_path, name = split_path(path)
        parent, record, inner = self.tree.locate(parent_path)
        if record is None:
            raise Invalid(f"{path}: new files can only be made inside a record folder")
        if is_scratch(name):
            real = self.stager.scratch_path(record, inner + (name,))
            os.makedirs(os.path.dirname(real), exist_ok=True)
            os.close(os.open(real, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644))
            durable.fsync_dir(os.path.dirname(real))
            self.store.invalidate(record.shard, record.rid)
            return ScratchHandle(real, os.O_RDWR)
        self.stager.target(record, inner + (name,))   # refuse names that cannot be features now
        fd, tmp = self.stager.staging.tmp_file()
        handle = WriteHandle(self, path, fd, tmp, new=True)
        self.pending[path] = handle
        return handle

    def flush(self, handle: WriteHandle, *, final: bool = False) -> None:
        """Judge and stage what was written. Until the last close (``final``), a file that was only
        truncated is an intermediate state (``> file`` closes once before it writes) and waits."""
        if not handle.dirty or not (handle.written or final):
            return
        handle.dirty = handle.written = False
        try:
            node, record, inner = self._locate_for_write(handle.path)
            if isinstance(node, MetaFile):
                self.commit(handle.content())
                return
            assert record is not None
            self.write_content(record, inner, handle.content(), existing=node)
        finally:
            if handle.new:
                self.pending.pop(handle.path, None)
                handle.new = False

    def release(self, handle: WriteHandle) -> None:
        if self.pending.get(handle.path) is handle:
            self.pending.pop(handle.path)
        handle.discard()

    def _locate_for_write(self, path: str) -> tuple[Node | None, RecordDir | None, tuple[str, ...]]:
        parent_path, name = split_path(path)
        try:
            node, record, inner = self.tree.locate(path)
        except FileNotFoundError:
            _, record, inner = self.tree.locate(parent_path)
            inner = inner + (name,)
            node = None
        if _is_commit_file(node):
            return node, None, ()
        if record is None:
            raise ReadOnly(f"{path}: only records can be changed")
        return node, record, inner

    def truncate_path(self, path: str, length: int) -> None:
        """truncate(2) by path, with no open file: a whole change, judged at once."""
        node, record, inner = self.tree.locate(path)
        if isinstance(node, ScratchFile):
            os.truncate(node.path, length)
            return
        if _is_commit_file(node):
            return
        if record is None or not isinstance(node, DataFile) or not isinstance(node.data, bytes):
            raise ReadOnly(f"{path}: only records can be changed")
        data = node.data[:length] + b"\0" * max(0, length - len(node.data))
        self.write_content(record, inner, data, existing=node)

    def touch(self, path: str, times: Any) -> None:
        if path in self.pending:
            return
        node = self.tree.lookup(path)
        if isinstance(node, ScratchFile):
            if times is None:
                os.utime(node.path)
            else:
                os.utime(node.path, ns=(int(times[0]), int(times[1])))

    # -- content ---------------------------------------------------------------------

    def write_content(self, record: RecordDir, inner: tuple[str, ...], content: bytes,
                      existing: Node | None = None) -> None:
        """Check ``content`` for the file at ``inner`` and stage the record with it."""
        if isinstance(existing, ScratchFile):
            return
        stager = self.stager
        if isinstance(existing, DataFile) and existing.loc is not None:
            loc = existing.loc
            suffix = names.split_suffix(inner[-1])[1] or ".bin"
            item_names = stager.item_names(record, loc.section, loc.key) if loc.item is not None else None
            target = Target(loc.section, loc.key, suffix, loc.item, loc.raw, item_names=item_names)
        else:
            target = stager.target(record, inner, by_name=True)
        msg = self.store.message(record.shard, record.rid)
        try:
            mutate.apply(msg, target, content, stager.dataset_kind_near(record.shard),
                         decode_raw=self.store.decode_raw, dataset_newline=stager.dataset_newline)
        except Invalid as exc:
            raise stager.fail(record, inner, str(exc)) from None
        pin = None
        if target.item_names is not None:
            # Written into a .list/ or .steps/ folder: the feature is shown as that folder, its
            # items under the names they had and this one under the name it was written to.
            pin = self.store.names_shown(record.shard, record.rid)
            pin.set_item_names(target.section, target.key, target.item_names,
                               feature_digest(msg, target.section, target.key), folder=target.folder)
        stager.stage_record(record.shard, record.rid, msg.SerializeToString(deterministic=True), pin)
        stager.learn(msg, target.section, target.key)

    def unlink(self, path: str) -> None:
        node, record, inner = self.tree.locate(path)
        if isinstance(node, ScratchFile):
            assert record is not None
            durable.unlink(node.path)
            self.store.invalidate(record.shard, record.rid)
            return
        if isinstance(node, RecordBin):
            self.stager.delete_record(node.shard, node.rid)
            return
        if not isinstance(node, DataFile) or node.loc is None or record is None:
            if isinstance(node, (Dir, ShardDir, RecordDir)):
                raise IsADir(path)
            raise ReadOnly(f"{path}: only records can be changed")
        msg = self.store.message(record.shard, record.rid)
        pin = self.store.names_shown(record.shard, record.rid)
        remove_feature(self.stager, record, msg, pin, node, inner)
        self.stager.stage_record(record.shard, record.rid, msg.SerializeToString(deterministic=True), pin)


def remove_feature(stager: Stager, record: RecordDir, msg: Any, pin: NamePin, node: DataFile,
                   inner: tuple[str, ...]) -> None:
    """Remove what a feature file stands for from ``msg``; the names of the rest stay in ``pin``.
    Folders that held only this feature (a .list/ or .steps/ folder included) stay until rmdir,
    as on any file system."""
    loc = node.loc
    assert loc is not None
    if mutate.remove(msg, loc):
        stager.keep_folders(record, inner[:-1])
    elif loc.item is not None:
        pin.drop_item_name(loc.section, loc.key, loc.item, feature_digest(msg, loc.section, loc.key))


def _is_commit_file(node: Node | None) -> bool:
    return isinstance(node, MetaFile) and node.name == "commit"
