"""What every edit of a writable mount shares: finding what a path inside a record stands for,
and staging a changed record durably so that the mount shows it at once, with stable names.

The three editors (``edit`` for feature files, ``folders`` for mkdir/rmdir, ``rename``) each
hold one ``Stager``. A record is always staged whole: its new serialized bytes, through the
journal (``staging``); a change that touches more than one journal file is one ``Intent``,
published by a single durable rename.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

from tfrfs.format import codec
from tfrfs.storage import durable
from tfrfs.edit import mutate
from tfrfs.format import names
from tfrfs.errors import Invalid
from tfrfs.edit.largevalue import Spliced
from tfrfs.edit.mutate import Target, item_count
from tfrfs.view.nodes import Dir, Node, RecordDir, RecordId, record_name_width
from tfrfs.view.pins import NamePin, SubNames, feature_digest
from tfrfs.edit.journal import Intent, ShardChanges
from tfrfs.edit.overlay import EditSession
from tfrfs.view.tree import Tree

# Temporary names that common tools create beside the file they rewrite, which carry no
# suffix from SPEC 3.2: sed -i (sedXXXXXX) and vim's write probe (4913). They are treated as
# scratch files, or those tools could not edit a feature file at all.
_TOOL_TEMP = re.compile(r"^(sed[A-Za-z0-9]{6}|4913|\d+\.tmp)$")
_EAGER_VIEW_BYTES = 1 << 20   # records up to this size are shown (and their pin shrunk) right after a change


def is_scratch(name: str) -> bool:
    return names.is_scratch(name) or bool(_TOOL_TEMP.match(name))


def is_scratch_path(inner: tuple[str, ...]) -> bool:
    """A path inside a record that is the user's own: a scratch name, or anything below a folder
    whose name starts with a dot (a tool's work folder: .git, a build's, fsstress's). Only the dot
    counts for folders: a key's folder never starts with one (SPEC 3.1), but may end with "~"."""
    return bool(inner) and (is_scratch(inner[-1]) or any(c.startswith(".") for c in inner[:-1]))


def split_path(path: str) -> tuple[str, str]:
    parent, _, name = path.rstrip("/").rpartition("/")
    return parent or "/", name


class Stager:
    def __init__(self, tree: Tree, session: EditSession) -> None:
        self.tree = tree
        self.store = tree.store
        self.session = session   # the overlay the store reads through: pins and invalidation
        self.staging = session.staging

    @property
    def root(self) -> str:
        return self.tree.discovery.root

    def changes(self, shard: int) -> ShardChanges:
        """The shard's staged changes, made (durably) if it has none yet."""
        idx = self.store.shards[shard]
        return self.staging.shard(idx.shard.relpath, compression=idx.shard.compression,
                                  kind=self.store.kinds[shard],
                                  base={"size": idx.shard.size, "mtime_ns": idx.shard.mtime_ns,
                                        "identity": idx.shard.identity})

    def dataset_kind_near(self, shard: int) -> Any:
        """``mutate.DatasetKind`` for a record of ``shard``: the dataset's kind of a key, and whether
        it is raw pixels as the records nearest to the shard show it."""
        schema = self.tree.schema

        def kind(key: str, section: str) -> tuple[str | None, bool]:
            found, raw = schema.dataset_kind(key, section)
            if raw:
                nearby = schema.raw_nearby(shard, key, section)
                raw = raw if nearby is None else nearby
            return found, raw
        return kind

    def dataset_newline(self, key: str, section: str) -> bool:
        """``mutate.DatasetNewline``: whether a value of the key in the dataset ends in a newline."""
        return self.tree.schema.ends_in_newline(key, section)

    def learn(self, msg: Any, section: str, key: str, record: RecordDir) -> None:
        """The dataset now holds ``key`` as ``msg`` (``record``'s, staged) has it: its kind is the
        dataset's from now on, also after the value goes (an editor's rename-away-and-write save).

        ``[]`` tells no kind (SPEC 7): the records that got one for a key with no kind yet take
        the first kind the key gets, here, when this value gives it one."""
        schema = self.tree.schema
        waiting = section != "feature_lists" and schema.dataset_kind(key, section)[0] is None
        schema.learn(msg, section, key, (record.shard, record.rid))
        if waiting:
            kind = schema.dataset_kind(key, section)[0]
            if kind in ("int64_list", "float_list"):
                for shard, rid in sorted(schema.take_waiting(section, key), key=str):
                    self.give_kind(shard, rid, key, kind)

    def give_kind(self, shard: int, rid: RecordId, key: str, kind: str) -> bool:
        """Make the record's empty bytes_list of ``key`` an empty list of ``kind``, staged; False
        (nothing done) when the record no longer holds such a value. Raises OSError."""
        try:
            msg = self.store.message(shard, rid)
        except Exception:  # noqa: BLE001 - deleted, moved away or unparsable since: no such value
            return False
        feats = mutate.features_of(msg, "context" if self.store.kinds[shard] == "sequence" else "")
        if not mutate.retype_empty(feats, key, kind, only=("bytes_list",)):
            return False
        self.stage_record(shard, rid, msg.SerializeToString(deterministic=True))
        return True

    def fail(self, record: RecordDir, inner: tuple[str, ...] | str, reason: str) -> Invalid:
        """Report content refused for a record (to ``.tfrfs/errors`` and the log) and say why."""
        where = inner if isinstance(inner, str) else "/".join(inner)
        rid = record.rid if isinstance(record.rid, int) else None
        shard = self.store.relpath(record.shard)
        self.tree.errors.add(shard, rid, None, f"{where}: {reason}; the old value stays",
                             record=str(record.rid), path=where)
        name = record.rid if rid is None else f"{rid:0{record_name_width(self.store.shards[record.shard].count)}d}"
        self.tree.errors.reject(f"{shard}/{name}/{where}", reason)
        return Invalid(f"{where}: {reason}")

    # -- staging a record -----------------------------------------------------------

    def stage_record(self, shard: int, rid: RecordId, data: bytes | Spliced, pin: NamePin | None = None) -> None:
        """Stage a record's new bytes. ``pin``: the names its features keep (by default, as they
        are shown now): until a commit a change renames no feature it leaves alone (SPEC 7)."""
        pin = pin if pin is not None else self.session.names_shown(shard, rid)
        ch = self.changes(shard)
        try:
            if isinstance(rid, str):
                self.staging.put_added(ch, rid, data)
            else:
                self.staging.put_edit(ch, rid, data)
        except BaseException:
            # Even when staging failed part way, show what is on disk now: what the next mount shows.
            self.session.invalidate(shard, rid)
            if self._staged_now(shard, rid, data):
                self.session.pin_names(shard, rid, pin)
            raise
        self.session.pin_names(shard, rid, pin, build=len(data) <= _EAGER_VIEW_BYTES)

    def _staged_now(self, shard: int, rid: RecordId, data: bytes | Spliced) -> bool:
        """Whether ``data`` is what is staged for the record (a failed call may have got that far)."""
        if not isinstance(data, bytes):
            return False   # a large value is not read back to compare: its names follow the rules
        try:
            return self.store.record_bytes(shard, rid)[0] == data
        except (OSError, KeyError):
            return False

    def intend_record(self, intent: Intent, shard: int, rid: RecordId, msg: Any) -> None:
        data = msg.SerializeToString(deterministic=True)
        if isinstance(rid, str):
            intent.add(self.changes(shard), rid, data)
        else:
            intent.edit(self.changes(shard), rid, data)

    def run_intent(self, intent: Intent, touched: dict[tuple[int, RecordId], NamePin | None]) -> None:
        """Stage ``intent``, then show the records it changed as they are now: a record changed in
        place with the names it showed (``touched`` gives its pin), a deleted or moved-in one afresh.
        Shown so also when the call happened but failed part way, and when a later change finishes it."""
        def show() -> None:
            for (shard, rid), pin in touched.items():
                if not intent.published:
                    self.session.invalidate(shard, rid)
                elif pin is not None:
                    self.session.pin_names(shard, rid, pin)
                else:
                    self.session.unpin(shard, rid)
                    self.session.invalidate(shard, rid)
        intent.after = show
        try:
            self.staging.run(intent)
        finally:
            show()

    def delete_record(self, shard: int, rid: RecordId) -> None:
        ch = self.changes(shard)
        try:
            if isinstance(rid, str):
                self.staging.remove_added(ch, rid)
            else:
                self.staging.delete_record(ch, rid)
            self.session.unpin(shard, rid)   # an added record's name may be given to a new record
            scratch = self.tree.scratch_root(shard, rid)
            if os.path.isdir(scratch):
                shutil.rmtree(scratch)
        finally:
            self.session.invalidate(shard, rid)

    # -- the user's own folders -------------------------------------------------------

    def scratch_path(self, record: RecordDir | None, inner: tuple[str, ...]) -> str:
        if record is None:
            raise Invalid("scratch files can only be made inside a record folder")
        return os.path.join(self.tree.scratch_root(record.shard, record.rid), *inner)

    def keep_folders(self, record: RecordDir, folder: tuple[str, ...]) -> None:
        """Keep ``folder`` (inside the record) shown even when no feature is left in it: as on any
        file system, a folder stays until rmdir."""
        if not folder:
            return
        real = self.scratch_path(record, folder)
        if not os.path.isdir(real):
            os.makedirs(real, exist_ok=True)
            durable.fsync_dir(os.path.dirname(real))

    def make_real_folder(self, path: str) -> None:
        """Make a folder under the staging folder (and the ones above it) durably, before an intent
        names it. Folders of a record that it already shows, so making them changes no view."""
        missing = []
        while not os.path.isdir(path):
            missing.append(path)
            path = os.path.dirname(path)
        for folder in reversed(missing):
            os.makedirs(folder, exist_ok=True)
            durable.fsync_dir(os.path.dirname(folder))

    # -- what a path inside a record stands for ----------------------------------------------

    def target(self, record: RecordDir, inner: tuple[str, ...], *, pin: NamePin | None = None,
               msg: Any = None) -> Target:
        """What a (possibly new) file at ``inner`` inside ``record`` stands for.

        A file of a .list/ or .steps/ folder (or of a step's own N.list/ in .steps/) is an item
        found by its number among the items shown there: an existing number is that item, a new
        one goes in among the others in number order. ``pin`` and ``msg``: the names and the
        message to place it by, when a change is under way (by default, the record as shown)."""
        section, rest = self.section_of(record, inner)
        for j, comp in enumerate(rest[:-1]):
            if names.split_suffix(comp)[1] in (".list", ".steps"):
                return self._item_target(record, section, rest, j, inner, pin, msg)
        key, suffix = names.path_to_key(rest, lambda: self.tree.schema.keys(section))
        if suffix is None or suffix not in codec.SUFFIXES:
            raise Invalid(f"{rest[-1]}: a feature file needs a suffix from .json .txt .bin .jpg .png .gif .bmp "
                          f".webp .tif .wav .flac .mp3 .ogg (names starting with '.' or ending with '~' are "
                          f"scratch files)")
        return Target(section, key, suffix)

    def feature_key(self, record: RecordDir, inner: tuple[str, ...]) -> tuple[str, str, str | None]:
        """(section, key, suffix) of a feature's entry (a file, or a .list/ or .steps/ folder) at
        ``inner``, shown there or not."""
        section, rest = self.section_of(record, inner)
        key, suffix = names.path_to_key(rest, lambda: self.tree.schema.keys(section))
        return section, key, suffix

    def section_of(self, record: RecordDir, inner: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
        """(section, path inside the section's folder) of a path inside a record."""
        if self.store.kinds[record.shard] != "sequence":
            return "", inner
        if len(inner) < 2 or inner[0] not in ("context", "feature_lists"):
            raise Invalid("in a SequenceExample record, features live in context/ or feature_lists/")
        return inner[0], inner[1:]

    def _item_target(self, record: RecordDir, section: str, rest: tuple[str, ...], j: int,
                     inner: tuple[str, ...], pin: NamePin | None, msg: Any) -> Target:
        folder_suffix = names.split_suffix(rest[j])[1]
        tail = rest[j + 1:]
        if folder_suffix == ".steps" and section != "feature_lists":
            raise Invalid(".steps/ folders belong in feature_lists/")
        if len(tail) > 2 or (len(tail) == 2 and not (folder_suffix == ".steps" and is_step_folder(tail[0]))):
            raise Invalid("folders cannot be made inside a .list/ folder, nor inside .steps/ other than a "
                          "step's own N.list/")
        folder = self._feature_folder(record, inner[:len(inner) - len(tail)])
        # A folder shown for a feature stands for that feature's key, whatever its name. A shortened
        # name stands for the dataset key it was made from (SPEC 3.1), so a record copied out
        # without xattrs and back in gets its keys, not the names they were shown as.
        key = folder.loc.key if folder is not None and folder.loc is not None \
            else names.path_to_key(rest[:j + 1], lambda: self.tree.schema.keys(section))[0]
        stem, suffix = names.split_suffix(tail[-1])
        if suffix not in codec.SUFFIXES or not _is_number(stem):
            raise Invalid(f"{tail[-1]}: files in {rest[-2]}/ are named by their index and a suffix, e.g. 0.jpg")
        assert suffix is not None
        msg = msg if msg is not None else self.store.message(record.shard, record.rid)
        items, subs = self._names_of(record, section, key, pin, msg)
        where = rest[:j + 1]
        if len(tail) == 1:
            at, insert, after = _place(items, stem)
            # An item written as one file is no longer a step's N.list/ folder.
            return Target(section, key, suffix, at, insert=insert, item_names=after, folder=where,
                          sub_names=tuple(s for s in subs if s[0] != stem))
        step = names.split_suffix(tail[0])[0]
        at, insert, after = _place(items, step)
        values = () if insert else dict(subs).get(step)
        if values is None:   # a step shown as one file: its values numbered as the rules would
            values = tuple(codec.index_names(len(msg.feature_lists.feature_list[key].feature[at].bytes_list.value)))
        sub, sub_insert, values_after = _place(values, stem)
        return Target(section, key, suffix, at, insert=insert, item_names=after, folder=where, sub=sub,
                      sub_insert=sub_insert, sub_names=tuple(s for s in subs if s[0] != step) + ((step, values_after),))

    def _feature_folder(self, record: RecordDir, folder: tuple[str, ...]) -> Dir | None:
        """The .list/ or .steps/ folder shown at ``folder`` for a feature, if there is one now."""
        node: Node = self.tree.record_root(record)
        for comp in folder:
            if not isinstance(node, Dir) or comp not in node.children:
                return None
            node = node.children[comp]
        if isinstance(node, Dir) and node.loc is not None and node.loc.item is None:
            return node
        return None

    def _names_of(self, record: RecordDir, section: str, key: str, pin: NamePin | None,
                  msg: Any) -> tuple[tuple[str, ...], SubNames]:
        """The names (without suffix) of ``key``'s items as shown now, by position, and those inside
        its steps' N.list/ folders: those of its folder, or for a key shown as one file the numbers
        the rules would give its items."""
        shown = pin.get(section, key) if pin is not None else \
            self.store.view(record.shard, record.rid).shown.get((section, key))
        if shown is not None and shown.item_names is not None:
            return shown.item_names, shown.sub_names
        return tuple(codec.index_names(item_count(msg, section, key))), ()

    def pin_items(self, pin: NamePin, msg: Any, target: Target) -> None:
        """After content was written through ``target`` into ``msg``: a feature written into a .list/
        or .steps/ folder is shown as that folder, its items under the names they had and this one
        under the name it was written to."""
        if target.item_names is not None:
            pin.set_item_names(target.section, target.key, target.item_names,
                               feature_digest(msg, target.section, target.key), folder=target.folder,
                               sub_names=target.sub_names)


def is_step_folder(name: str) -> bool:
    """A step's own N.list/ folder inside a .steps/ folder: a step of several values."""
    stem, suffix = names.split_suffix(name)
    return suffix == ".list" and _is_number(stem)


def _is_number(stem: str) -> bool:
    return stem.isdigit() and stem.isascii()


def _place(names_now: tuple[str, ...], stem: str) -> tuple[int, bool, tuple[str, ...]]:
    """Where the item named ``stem`` (an index) is among items named ``names_now``: (its position,
    whether it is new there, the names after). A new one goes in among the others in number
    order, with no empty values made up for gaps: items removed before a commit keep the numbers
    of the others (SPEC 7), and a folder shows the values of its files in name order."""
    numbers = [int(n) for n in names_now]
    number = int(stem)
    if number in numbers:
        return numbers.index(number), False, names_now
    at = sum(1 for n in numbers if n < number)
    return at, True, names_now[:at] + (stem,) + names_now[at:]
