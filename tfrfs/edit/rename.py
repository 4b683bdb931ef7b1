"""rename(2) in a writable mount (SPEC 7): a feature within its record, a folder of features, a
scratch file, a record into another shard (or to a new name in its own).

A rename that changes more than one journal file — a record and a scratch file, or two records —
is staged as one ``Intent``: published by a single durable rename, so a crash or an I/O error
leaves the state before the call or after it, never a mix.
"""

from __future__ import annotations

import errno
import os
from dataclasses import replace
from typing import Any

from tfrfs.format import codec
from tfrfs.storage import durable
from tfrfs.edit import mutate
from tfrfs.format import names
from tfrfs.edit.feature_files import remove_feature
from tfrfs.errors import Exists, Invalid, IsADir, NotADir, NotEmpty, NotFound, NotPermitted
from tfrfs.edit.folders import has_files
from tfrfs.view.nodes import DataFile, Dir, Loc, Node, RecordDir, RecordId, ScratchFile, ShardDir
from tfrfs.edit.mutate import Target
from tfrfs.view.pins import NamePin
from tfrfs.edit.stager import Stager, is_scratch, is_scratch_path, is_step_folder, split_path


class CrossDevice(OSError):
    """rename across records: mv then copies and deletes, which the mount supports."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EXDEV, message)


class Renamer:
    def __init__(self, stager: Stager) -> None:
        self.stager = stager
        self.tree = stager.tree
        self.store = stager.store
        self.session = stager.session
        self.staging = stager.staging

    def rename(self, old: str, new: str) -> None:
        node, record, inner = self.tree.locate(old)
        new_parent_path, new_name = split_path(new)
        new_parent, new_record, new_inner = self.tree.locate(new_parent_path)
        if isinstance(node, RecordDir):
            self._move_record(node, new_parent, new_name)
            return
        if record is None or new_record is None or (record.shard, record.rid) != (new_record.shard, new_record.rid):
            # Across records (or shards): mv falls back to copy and delete, which we support.
            raise CrossDevice(f"{old} -> {new}")
        dest_inner = new_inner + (new_name,)
        try:
            dest: Node | None = self.tree.child(new_parent, new_name)
        except NotFound:
            dest = None
        if isinstance(node, Dir):
            self._rename_folder(record, node, inner, dest_inner, dest)
            return
        if isinstance(dest, Dir):
            raise IsADir(new)
        if isinstance(node, ScratchFile):
            self._rename_scratch(record, node, dest_inner, dest)
        elif isinstance(node, DataFile) and node.loc is not None:
            self._rename_feature(record, node, inner, dest_inner, dest)
        else:
            raise NotPermitted(f"{old}: cannot be renamed")

    def _rename_feature(self, record: RecordDir, node: DataFile, inner: tuple[str, ...],
                        dest_inner: tuple[str, ...], dest: Node | None) -> None:
        assert node.loc is not None
        content = self.tree.open(node).read(1 << 62, 0)
        msg = self.store.message(record.shard, record.rid)
        pin = self.session.names_shown(record.shard, record.rid)
        intent = self.staging.intent()
        # The file goes as with rm (the items beside it keep their names), and appears where it
        # goes: an editor's backup (mv label.json label.json~) as a scratch file, in the same step.
        remove_feature(self.stager, record, msg, pin, node, inner)
        if is_scratch_path(dest_inner):
            real = self.stager.scratch_path(record, dest_inner)
            self.stager.make_real_folder(os.path.dirname(real))
            intent.write_file(real, content)
            target = None
        else:
            target = self._take_content(record, msg, pin, dest_inner, dest, content, moved=True)
            self.stager.keep_folders(record, inner[:-1])
        self.stager.intend_record(intent, record.shard, record.rid, msg)
        self.stager.run_intent(intent, {(record.shard, record.rid): pin})
        if target is not None:
            self.stager.learn(msg, target.section, target.key, record)

    def _rename_scratch(self, record: RecordDir, node: ScratchFile, dest_inner: tuple[str, ...],
                        dest: Node | None) -> None:
        if is_scratch_path(dest_inner):
            real = self.stager.scratch_path(record, dest_inner)
            self.stager.make_real_folder(os.path.dirname(real))
            try:
                durable.rename(node.path, real)      # one rename: atomic as it is
                durable.fsync_dir(os.path.dirname(real))
            finally:
                self.session.invalidate(record.shard, record.rid)
            return
        # A scratch file renamed over a feature (sed -i, rsync, an editor restoring its backup): the
        # record takes the content and the scratch file goes, in the same step.
        with open(node.path, "rb") as f:
            content = f.read()
        msg = self.store.message(record.shard, record.rid)
        pin = self.session.names_shown(record.shard, record.rid)
        target = self._take_content(record, msg, pin, dest_inner, dest, content)
        intent = self.staging.intent()
        intent.drop(node.path)
        self.stager.intend_record(intent, record.shard, record.rid, msg)
        self.stager.run_intent(intent, {(record.shard, record.rid): pin})
        self.stager.learn(msg, target.section, target.key, record)

    def _take_content(self, record: RecordDir, msg: Any, pin: NamePin, dest_inner: tuple[str, ...],
                      dest: Node | None, content: bytes, *, moved: bool = False) -> Target:
        """Put ``content`` into ``msg`` as the feature file at ``dest_inner`` (replacing ``dest``).
        ``moved``: it is a feature's value moving to another name, kept exactly (SPEC 7 "Text"
        is about content written)."""
        target = self.stager.target(record, dest_inner, pin=pin, msg=msg)
        if isinstance(dest, DataFile) and dest.loc is not None and target.item is None:
            loc = dest.loc
            # A file renamed over a feature's own file (sed -i, an editor's write-and-rename) is
            # a new value of that feature, as writing the file is: it keeps the value's kind and
            # judges a .txt's newline against it. Anything else there goes first. (An item
            # there is the target's own: found by its number, it takes the content.)
            if loc.raw or (loc.section, loc.key) != (target.section, target.key):
                mutate.remove(msg, loc)
        try:
            mutate.apply(msg, target, content, self.stager.dataset_kind_near(record.shard),
                         decode_raw=self.store.decode_raw,
                         dataset_newline=_keep_newline if moved else self.stager.dataset_newline)
        except Invalid as exc:
            raise self.stager.fail(record, dest_inner, str(exc)) from None
        self.stager.pin_items(pin, msg, target)
        return target

    def _rename_folder(self, record: RecordDir, node: Dir, inner: tuple[str, ...], dest: tuple[str, ...],
                       existing: Node | None) -> None:
        """mv of a folder inside a record: the features in it move, values as they are. A .list/ or
        .steps/ folder that keeps its suffix takes its values with the names they are shown by (a
        folder whose numbers have gaps keeps them: no value is made up); a step's own N.list/ goes
        to its new number; other files become the features their new paths stand for."""
        # As rename(2): a folder may only take the place of an empty folder.
        if existing is not None and not isinstance(existing, Dir):
            raise NotADir("/".join(dest))
        if isinstance(existing, Dir) and existing.children:
            raise NotEmpty("/".join(dest))
        msg = self.store.message(record.shard, record.rid)
        pin = self.session.names_shown(record.shard, record.rid)
        if node.loc is not None and node.loc.item is not None:
            key = self._move_step(record, msg, pin, node.loc, inner, dest)
            learned = [("feature_lists", key)]
        else:
            learned = self._move_features(record, msg, pin, node, inner, dest)
        intent = self.staging.intent()
        if node.scratch:
            # The user's own files in it move with the features, in the same step.
            real_dest = self.stager.scratch_path(record, dest)
            self.stager.make_real_folder(os.path.dirname(real_dest))
            intent.move(node.scratch, real_dest)
        self.stager.keep_folders(record, inner[:-1])
        if learned:
            self.stager.intend_record(intent, record.shard, record.rid, msg)
        self.stager.run_intent(intent, {(record.shard, record.rid): pin})
        for section, key in learned:
            self.stager.learn(msg, section, key, record)

    def _move_features(self, record: RecordDir, msg: Any, pin: NamePin, node: Dir, inner: tuple[str, ...],
                       dest: tuple[str, ...]) -> list[tuple[str, str]]:
        """Move the features in folder ``node`` (at ``inner``) to ``dest``, in ``msg`` and ``pin``;
        returns the (section, key) of each where it went."""
        whole: list[tuple[tuple[str, ...], Loc]] = []       # feature folders that move as values
        files: list[tuple[tuple[str, ...], DataFile]] = []   # files that become features where they go
        _walk_features(node, (), inner[-1], dest[-1], whole, files)
        moved = []
        for rel, loc in whole:
            section, key, _ = self.stager.feature_key(record, dest + rel)
            if section != loc.section:
                raise Invalid(f"{'/'.join(dest)}: features cannot move between context/ and feature_lists/")
            moved.append((section, loc.key, key, self.stager.section_of(record, dest + rel)[1],
                          mutate.take(msg, section, loc.key)))
        for section, key in sorted({(f.loc.section, f.loc.key) for _, f in files if f.loc is not None}):
            pin.drop(Loc(section, key), mutate.remove(msg, Loc(section, key)), b"")
        out = []
        for section, key, new_key, path, value in moved:
            if mutate.holds(msg, section, new_key):
                raise Exists(f"{'/'.join(dest)}: {new_key} has a value already; remove it first")
            mutate.put(msg, section, new_key, value)
            pin.move(section, key, new_key, path)
            out.append((section, new_key))
        kind = self.stager.dataset_kind_near(record.shard)
        try:
            for rel, f in sorted(files, key=lambda x: x[0]):
                assert isinstance(f.data, bytes)
                target = self.stager.target(record, dest + rel, pin=pin, msg=msg)
                # The files move as they are: their values, not a newline less.
                mutate.apply(msg, target, f.data, kind, decode_raw=self.store.decode_raw,
                             dataset_newline=_keep_newline)
                self.stager.pin_items(pin, msg, target)
                out.append((target.section, target.key))
        except Invalid as exc:
            raise self.stager.fail(record, dest, str(exc)) from None
        return out

    def _move_step(self, record: RecordDir, msg: Any, pin: NamePin, loc: Loc, inner: tuple[str, ...],
                   dest: tuple[str, ...]) -> str:
        """mv of a step's own N.list/ folder to another number in a .steps/ folder: the step moves
        as it is, its values keeping their names; the other steps keep theirs. Returns the key."""
        assert loc.item is not None
        if len(dest) < 2 or not is_step_folder(dest[-1]) or names.split_suffix(dest[-2])[1] != ".steps":
            raise Invalid(f"{'/'.join(dest)}: a step's folder moves to another N.list/ in a .steps/ folder")
        step = mutate.take_step(msg, loc.key, loc.item)
        shown = pin.get(loc.section, loc.key)
        values = dict(shown.sub_names).get(inner[-1][:-len(".list")]) if shown is not None else None
        if values is None:
            values = tuple(codec.index_names(len(step.bytes_list.value)))
        pin.drop(Loc(loc.section, loc.key, loc.item), mutate.remove(msg, Loc(loc.section, loc.key, loc.item)),
                 b"")
        # Where a file of it would go is where the step goes (found by number among the steps there).
        where = self.stager.target(record, dest + ("0.bin",), pin=pin, msg=msg)
        mutate.put_step(msg, where, step)
        number = dest[-1][:-len(".list")]
        subs = tuple(s for s in where.sub_names if s[0] != number) + ((number, values),)
        self.stager.pin_items(pin, msg, replace(where, sub_names=subs))
        return where.key

    def _move_record(self, node: RecordDir, new_parent: Node, new_name: str) -> None:
        """mv of a record folder into a shard folder (its own included: a new name). One step: the
        record is added there, deleted here, and the user's own files in it move along."""
        if not isinstance(new_parent, ShardDir):
            raise CrossDevice("records can only be moved into shard folders")
        if self.store.kinds[new_parent.shard] != self.store.kinds[node.shard]:
            raise Invalid("a record can only move to a shard of the same record kind")
        if is_scratch(new_name) or not new_name:
            raise Invalid(f"{new_name}: record names may not start with '.' or end with '~'")
        shard = new_parent.shard
        try:
            existing: Node | None = self.tree.child(new_parent, new_name)
        except NotFound:
            existing = None
        if isinstance(existing, RecordDir) and (existing.shard, existing.rid) == (node.shard, node.rid):
            return
        if existing is not None and (not isinstance(existing, RecordDir) or has_files(self.tree.record_root(existing))):
            raise Exists(new_name)
        data, _ = self.store.record_bytes(node.shard, node.rid)
        if isinstance(node.rid, int) and self.store.kinds[shard] == "sequence":
            # Shown with context/ and feature_lists/ (as stored), it keeps them where it goes,
            # where records made in the mount show only the parts they hold.
            data = mutate.with_both_parts(data)
        src_ch, dst_ch = self.stager.changes(node.shard), self.stager.changes(shard)
        intent = self.staging.intent()
        # Where it goes it keeps the names it shows (SPEC 7: until a commit, names stay stable):
        # the items after one removed keep their numbers there too.
        touched: dict[tuple[int, RecordId], NamePin | None] = {
            (node.shard, node.rid): None, (shard, new_name): self.session.names_shown(node.shard, node.rid)}
        if isinstance(existing, RecordDir) and isinstance(existing.rid, int):
            # An empty original record of that name goes; an added one is replaced by the add below.
            intent.delete(dst_ch, existing.rid)
            intent.drop(self.tree.scratch_root(shard, existing.rid))
            touched[(shard, existing.rid)] = None
        intent.add(dst_ch, new_name, data)
        intent.delete(src_ch, node.rid)
        src_scratch, dst_scratch = self.tree.scratch_root(node.shard, node.rid), self.tree.scratch_root(shard, new_name)
        if os.path.isdir(src_scratch):
            self.stager.make_real_folder(os.path.dirname(dst_scratch))
            intent.move(src_scratch, dst_scratch)
        else:
            intent.drop(dst_scratch)     # left by the record of that name that was here
        self.stager.run_intent(intent, touched)


def _walk_features(d: Dir, rel: tuple[str, ...], name: str, new_name: str,
                   whole: list[tuple[tuple[str, ...], Loc]], files: list[tuple[tuple[str, ...], DataFile]]) -> None:
    """The features under folder ``d`` (at ``rel`` in the folder moved, named ``name`` there and
    ``new_name`` where it goes): .list/ and .steps/ folders that keep their suffix (``whole``),
    and every other feature file (``files``)."""
    if d.loc is not None and d.loc.item is None and names.split_suffix(name)[1] == names.split_suffix(new_name)[1]:
        whole.append((rel, d.loc))
        return
    for child_name, c in d.children.items():
        if isinstance(c, Dir):
            _walk_features(c, rel + (child_name,), child_name, child_name, whole, files)
        elif isinstance(c, DataFile) and c.loc is not None:
            files.append((rel + (child_name,), c))


def _keep_newline(key: str, section: str) -> bool:
    """A value moved to another name keeps its bytes, trailing newline included."""
    return True
