"""The write side of a writable mount: turning file operations into staged edits.

``Editor`` takes what ordinary tools do — write and close a feature file,
create one, ``rm``, ``mkdir``, ``mv`` — checks it against the dataset's kinds
(SPEC 7) and stages the result durably through ``Staging``. A record is
always staged whole: its new serialized bytes. The user's own folders and
scratch files live as real files under the staging folder and are merged
into the record's view by the tree.

Content written to a file collects in a temporary file and is judged only
when the file is flushed (``close``), never on an intermediate state such as
the truncation that precedes new content.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from typing import Any

from . import codec, durable, names, proto, repack, tfrecord
from .errors import (Exists, Invalid, IsADir, NotADir, NotEmpty, NotFound, NotPermitted, ReadOnly)
from .index import IndexCache, ShardFile, ShardIndex
from .staging import Intent, ShardChanges, Staging
from .tree import (DataFile, Dir, Loc, MetaFile, NamePin, Node, PlainFile, RecordBin, RecordDir, RecordId,
                   ScratchFile, ShardDir, Tree)

log = logging.getLogger("tfrfs")

# Temporary names that common tools create beside the file they rewrite, which carry no
# suffix from SPEC 3.2: sed -i (sedXXXXXX) and vim's write probe (4913). They are treated as
# scratch files, or those tools could not edit a feature file at all.
_TOOL_TEMP = re.compile(r"^(sed[A-Za-z0-9]{6}|4913|\d+\.tmp)$")
_EAGER_VIEW_BYTES = 1 << 20   # records up to this size get their view (and smaller pin) right after a change


def is_scratch(name: str) -> bool:
    return names.is_scratch(name) or bool(_TOOL_TEMP.match(name))


@dataclass
class Target:
    """Where content written inside a record goes."""

    section: str               # "", "context" or "feature_lists"
    key: str
    suffix: str
    item: int | None = None    # a value's index in a .list/ folder or a step's in .steps/
    raw: bool = False          # the file is a PNG of a key shown as raw pixels
    insert: bool = False       # a new item goes in before ``item`` (the others keep their values)
    stems: tuple[str, ...] | None = None   # an item's folder: the names of its items after this write
    folder: tuple[str, ...] = ()           # an item's folder: its path inside the section


class WriteHandle:
    """A file open for writing: content collects in a staging temp file until flush."""

    def __init__(self, editor: "Editor", path: str, fd: int, tmp: str, *, new: bool) -> None:
        self.editor = editor
        self.path = path
        self.fd = fd
        self.tmp = tmp
        self.new = new          # created by this open: the file exists only once flushed
        self.dirty = new        # content differs from what is staged
        self.written = False    # data was written since the last flush (a bare truncate is not enough)

    def read(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def write(self, data: bytes, offset: int) -> int:
        n = durable.pwrite(self.fd, data, offset, self.tmp)
        self.dirty = self.written = True
        return n

    def truncate(self, length: int) -> None:
        os.ftruncate(self.fd, length)
        self.dirty = True
        # Only a truncate to zero can be the step before new content; `truncate -s N` to any
        # other length is the change itself, judged at the next close so that close can fail.
        if length:
            self.written = True

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def content(self) -> bytes:
        size = self.size()
        return os.pread(self.fd, size, 0) if size else b""

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass


class ScratchHandle:
    """A scratch file open for reading and writing: a plain real file."""

    def __init__(self, path: str, flags: int) -> None:
        self.path = path
        self.fd = os.open(path, flags & ~(os.O_CREAT | os.O_EXCL))
        self.dirty = False

    def read(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def write(self, data: bytes, offset: int) -> int:
        self.dirty = True
        return durable.pwrite(self.fd, data, offset, self.path)

    def truncate(self, length: int) -> None:
        os.ftruncate(self.fd, length)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Editor:
    """Staged edits of one writable mount."""

    def __init__(self, tree: Tree, staging: Staging, cache: IndexCache) -> None:
        self.tree = tree
        self.staging = staging
        self.cache = cache
        self.pending: dict[str, WriteHandle] = {}   # path -> handle of a file created and not yet flushed
        self.last_commit: dict = {}
        self._raw_tallies: dict[tuple[int, str], dict[str, tuple[int, int]]] = {}
        self._show_staged_shards()
        self.install_meta()

    # -- helpers --------------------------------------------------------------

    @property
    def root(self) -> str:
        return self.tree.discovery.root

    def _changes(self, shard: int) -> ShardChanges:
        idx = self.tree.shards[shard]
        return self.staging.shard(idx.shard.relpath, compression=idx.shard.compression, kind=self.tree.kinds[shard],
                                  base={"size": idx.shard.size, "mtime_ns": idx.shard.mtime_ns})

    def _show_staged_shards(self) -> None:
        """Make the tree show new and removed shards staged by an earlier mount."""
        for relpath, ch in self.staging.shards.items():
            n = self.tree.shard_number(relpath)
            if n is None and not ch.removed:
                self.tree.add_shard(_empty_index(self.root, relpath, ch.compression), ch.kind)
            elif n is not None and ch.removed:
                self.tree.hide_shard(n)

    def _stage_record(self, shard: int, rid: RecordId, data: bytes, shown: NamePin | None = None) -> None:
        """Stage a record's new bytes. ``shown``: the names its features keep (by default, as they
        are shown now): until a commit a change renames no feature it leaves alone (SPEC 7)."""
        pin = shown if shown is not None else self.tree.names_shown(shard, rid)
        ch = self._changes(shard)
        try:
            if isinstance(rid, str):
                self.staging.put_added(ch, rid, data)
            else:
                self.staging.put_edit(ch, rid, data)
        except BaseException:
            # Even when staging failed part way, show what is on disk now: what the next mount shows.
            self.tree.invalidate(shard, rid)
            if self._staged_now(shard, rid, data):
                self.tree.pin_names(shard, rid, pin)
            raise
        self.tree.pin_names(shard, rid, pin, build=len(data) <= _EAGER_VIEW_BYTES)

    def _staged_now(self, shard: int, rid: RecordId, data: bytes) -> bool:
        """Whether ``data`` is what is staged for the record (a failed call may have got that far)."""
        try:
            return self.tree.record_bytes(shard, rid)[0] == data
        except (OSError, KeyError):
            return False

    def _split(self, path: str) -> tuple[str, str]:
        parent, _, name = path.rstrip("/").rpartition("/")
        return parent or "/", name

    def _fail(self, record: RecordDir, inner: tuple[str, ...] | str, reason: str) -> Invalid:
        where = inner if isinstance(inner, str) else "/".join(inner)
        relpath = self.tree.shards[record.shard].shard.relpath
        rid = record.rid if isinstance(record.rid, int) else None
        self.tree.errors.add(relpath, rid, None, f"{where}: {reason}; the old value stays",
                             record=str(record.rid), path=where)
        return Invalid(f"{where}: {reason}")

    def dataset_kind(self, key: str, section: str) -> tuple[str | None, bool]:
        """(kind, shown as raw pixels) of ``key`` across the dataset, or (None, False) if it is new."""
        schema = self.tree.schema()
        table = schema.get("feature_lists" if section == "feature_lists" else "features", {})
        entry = table.get(key)
        if not entry:
            return None, False
        kind = entry["kind"] if isinstance(entry["kind"], str) else entry["kind"][0]
        raw = any("raw" in s for s in entry.get("shown_as", ()))
        return (None if kind in ("mixed", "empty", "feature_list") else kind), raw

    def _raw_nearby(self, shard: int, key: str, section: str) -> bool | None:
        """Whether the records nearest to ``shard`` show ``key`` as raw pixels: its own shard's
        records if any hold the key as one bytes value, else those of the shards in its folder;
        None if none of them hold it.

        One key can be raw pixels in one shard and an encoded PNG in another (the sample's
        ``image/encoded``). The dataset-wide answer would decode every PNG copied into a new
        record, so ``cp -r`` of an Object Detection record would store raw pixels where its PNG
        bytes were. A record copied in arrives a file at a time, height and width perhaps after
        the image, so its neighbours are the only evidence at hand.
        """
        folder = os.path.dirname(self.tree.shards[shard].shard.relpath)
        tiers = ([shard], [n for n, idx in enumerate(self.tree.shards)
                           if os.path.dirname(idx.shard.relpath) == folder])
        for tier in tiers:
            raw = plain = 0
            for n in tier:
                r, p = self._raw_tally(n, section).get(key, (0, 0))
                raw, plain = raw + r, plain + p
            if raw or plain:
                return raw >= plain
        return None

    def _raw_tally(self, shard: int, section: str) -> dict[str, tuple[int, int]]:
        """Per key: (records showing it as raw pixels, records holding it as another one bytes value),
        over the shard's original records (computed once per shard; commit forgets them)."""
        cache_key = (shard, section)
        tally = self._raw_tallies.get(cache_key)
        if tally is not None:
            return tally
        tally = {}
        idx = self.tree.shards[shard]
        kind = self.tree.kinds[shard]
        if self.tree.decode_raw and kind != "raw" and idx.count and self.tree.shard_fd(shard) is not None:
            for i in range(idx.count):
                if i in idx.bad:
                    continue
                data, _ = self.tree.read_record(shard, i)
                try:
                    if kind == "sequence":
                        feats = proto.SequenceExample.FromString(data).context.feature if section == "context" else {}
                    else:
                        feats = proto.Example.FromString(data).features.feature
                except Exception:  # noqa: BLE001 - unparsable records are reported when opened
                    continue
                values = {k: codec.value_from_proto(f) for k, f in feats.items()}
                shapes = codec.raw_shapes(values)
                for k, v in values.items():
                    if v.kind == "bytes_list" and len(v.values) == 1:
                        r, p = tally.get(k, (0, 0))
                        tally[k] = (r + 1, p) if k in shapes else (r, p + 1)
        self._raw_tallies[cache_key] = tally
        return tally

    def install_meta(self) -> None:
        """``.tfrfs/status`` (pending changes) and ``.tfrfs/commit`` (write to it to commit)."""
        import json
        self.tree.meta.children["status"] = MetaFile(
            "status", lambda: (json.dumps(self.status(), indent=2, ensure_ascii=False) + "\n").encode())
        self.tree.meta.children["commit"] = MetaFile(
            "commit", lambda: (json.dumps(self.last_commit, ensure_ascii=False) + "\n").encode())

    def truncate_path(self, path: str, length: int) -> None:
        """truncate(2) by path, with no open file: a whole change, judged at once."""
        node, record, inner = self.tree.locate(path)
        if isinstance(node, ScratchFile):
            os.truncate(node.path, length)
            return
        if isinstance(node, MetaFile) and node.name == "commit":
            return
        if record is None or not isinstance(node, DataFile):
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
                os.utime(node.path, ns=tuple(int(t) for t in times))

    # -- getattr of files being written -----------------------------------------

    def pending_size(self, path: str) -> int | None:
        h = self.pending.get(path)
        return h.size() if h is not None else None

    # -- open / create / flush ------------------------------------------------------

    def open(self, path: str, flags: int) -> WriteHandle | ScratchHandle:
        node, record, inner = self.tree.locate(path)
        if isinstance(node, ScratchFile):
            return ScratchHandle(node.path, flags)
        if isinstance(node, (PlainFile, MetaFile)) and not (isinstance(node, MetaFile) and node.name == "commit"):
            raise ReadOnly(f"{path}: only records can be changed")
        if isinstance(node, (Dir, ShardDir, RecordDir)):
            raise IsADir(path)
        fd, tmp = self.staging.tmp_file()
        if not flags & os.O_TRUNC:
            current = self.tree.open(node).read(1 << 62, 0) if not isinstance(node, MetaFile) else b""
            os.write(fd, current)
        handle = WriteHandle(self, path, fd, tmp, new=False)
        # O_TRUNC emptied the file: that is a change, judged at the last close even if nothing
        # is written (`: > f`, `cp /dev/null f`), or the old value would silently stay.
        handle.dirty = bool(flags & os.O_TRUNC)
        return handle

    def create(self, path: str, flags: int) -> WriteHandle | ScratchHandle:
        parent_path, name = self._split(path)
        parent, record, inner = self.tree.locate(parent_path)
        if record is None and isinstance(parent, (Dir, ShardDir)) and not isinstance(parent, RecordDir):
            raise Invalid(f"{path}: new files can only be made inside a record folder")
        if is_scratch(name):
            real = self._scratch_path(record, inner + (name,))
            os.makedirs(os.path.dirname(real), exist_ok=True)
            fd = os.open(real, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            os.close(fd)
            durable.fsync_dir(os.path.dirname(real))
            self.tree.invalidate(record.shard, record.rid)
            return ScratchHandle(real, os.O_RDWR)
        self._target(record, inner + (name,), create=True)   # refuse names that cannot be features now
        fd, tmp = self.staging.tmp_file()
        handle = WriteHandle(self, path, fd, tmp, new=True)
        self.pending[path] = handle
        return handle

    def flush(self, handle: WriteHandle | ScratchHandle, *, final: bool = False) -> None:
        """Judge and stage what was written. Until the last close (``final``), a file that was only
        truncated is an intermediate state (``> file`` closes once before it writes) and waits."""
        if isinstance(handle, ScratchHandle):
            if handle.dirty:
                durable.fsync(handle.fd, handle.path)
                handle.dirty = False
            return
        if not handle.dirty or not (handle.written or final):
            return
        handle.dirty = handle.written = False
        try:
            node, record, inner = self._locate_for_write(handle.path)
            if isinstance(node, MetaFile) and node.name == "commit":
                self.commit()
                return
            self.write_content(record, inner, handle.content(), existing=node)
        finally:
            if handle.new:
                self.pending.pop(handle.path, None)
                handle.new = False

    def release(self, handle: WriteHandle | ScratchHandle) -> None:
        if isinstance(handle, WriteHandle):
            if self.pending.get(handle.path) is handle:
                self.pending.pop(handle.path)
        handle.close()

    def _locate_for_write(self, path: str) -> tuple[Node | None, RecordDir, tuple[str, ...]]:
        parent_path, name = self._split(path)
        try:
            node, record, inner = self.tree.locate(path)
        except NotFound:
            parent, record, inner = self.tree.locate(parent_path)
            inner = inner + (name,)
            node = None
        if isinstance(node, MetaFile):
            return node, None, ()  # type: ignore[return-value]
        if record is None:
            raise ReadOnly(f"{path}: only records can be changed")
        return node, record, inner

    # -- mapping a path inside a record to a feature ----------------------------------

    def _scratch_path(self, record: RecordDir | None, inner: tuple[str, ...]) -> str:
        if record is None:
            raise Invalid("scratch files can only be made inside a record folder")
        return os.path.join(self.tree.scratch_root(record.shard, record.rid), *inner)

    def _target(self, record: RecordDir, inner: tuple[str, ...], *, create: bool = False,
                by_name: bool = False) -> Target:
        """What a (possibly new) file at ``inner`` inside ``record`` stands for.

        ``by_name``: a file of a .list/ or .steps/ folder goes among the items shown there in the
        order of their numbers (for content written to it); otherwise its number is its index."""
        section = ""
        rest = inner
        if self.tree.kinds[record.shard] == "sequence":
            if len(inner) < 2 or inner[0] not in ("context", "feature_lists"):
                raise Invalid("in a SequenceExample record, features live in context/ or feature_lists/")
            section, rest = inner[0], inner[1:]
        # A file inside a .list/ or .steps/ folder is one value of that feature.
        for j, comp in enumerate(rest[:-1]):
            stem, suffix = names.split_suffix(comp)
            if suffix in (".list", ".steps"):
                if j != len(rest) - 2:
                    raise Invalid("folders cannot be made inside a .list/ or .steps/ folder")
                folder = self._feature_folder(record, inner[:-1])
                # A folder shown for a feature stands for that feature's key, whatever its name.
                key = folder.loc.key if folder is not None and folder.loc is not None \
                    else names.path_to_key(rest[:j + 1])[0]
                item_stem, item_suffix = names.split_suffix(rest[-1])
                if item_suffix not in codec.SUFFIXES or not (item_stem.isdigit() and item_stem.isascii()):
                    raise Invalid(f"{rest[-1]}: files in {comp}/ are named by their index and a suffix, e.g. 0.jpg")
                if suffix == ".steps" and section != "feature_lists":
                    raise Invalid(".steps/ folders belong in feature_lists/")
                if not by_name:
                    return Target(section, key, item_suffix, int(item_stem))
                return self._item_target(record, section, key, item_suffix, item_stem, rest[:-1])
        key, suffix = names.path_to_key(rest)
        if suffix is None or suffix not in codec.SUFFIXES:
            raise Invalid(f"{rest[-1]}: a feature file needs a suffix from .json .txt .bin .jpg .png .gif .bmp "
                          f".webp .tif .wav .flac .mp3 .ogg (names starting with '.' or ending with '~' are "
                          f"scratch files)")
        return Target(section, key, suffix)

    def _feature_folder(self, record: RecordDir, folder: tuple[str, ...]) -> Dir | None:
        """The .list/ or .steps/ folder shown at ``folder`` for a feature, if there is one now."""
        node: Node = self.tree.record_view(record.shard, record.rid).root
        for comp in folder:
            if not isinstance(node, Dir) or comp not in node.children:
                return None
            node = node.children[comp]
        if isinstance(node, Dir) and node.loc is not None and node.loc.item is None:
            return node
        return None

    def _item_names(self, record: RecordDir, section: str, key: str) -> tuple[str, ...]:
        """The names (without suffix) of ``key``'s items as shown now, by position: those of its
        folder, or for a key shown as one file the numbers the rules would give its items."""
        shown = self.tree.record_view(record.shard, record.rid).shown.get((section, key))
        if shown is not None and shown.stems is not None:
            return shown.stems
        msg = self.tree.record_message(record.shard, record.rid)
        if section == "feature_lists":
            lists = msg.feature_lists.feature_list
            count = len(lists[key].feature) if key in lists else 0
        else:
            feats = self._features(msg, section)
            count = len(codec.value_from_proto(feats[key]).values) if key in feats else 0
        return tuple(codec.index_names(count))

    def _item_target(self, record: RecordDir, section: str, key: str, suffix: str, stem: str,
                     folder: tuple[str, ...]) -> Target:
        """Where content written to ``stem`` + ``suffix`` in ``key``'s .list/ or .steps/ folder goes.

        An existing number is that item; a new one goes among the others in number order, with
        no empty values made up for gaps: a folder shows the values of its files in name order
        (SPEC 7), also when its files arrive out of order or its numbers have gaps (items removed
        before a commit keep the numbers of the others)."""
        items = self._item_names(record, section, key)
        numbers = [int(n) for n in items]
        number = int(stem)
        if number in numbers:
            return Target(section, key, suffix, numbers.index(number), stems=items, folder=folder)
        at = sum(1 for n in numbers if n < number)
        return Target(section, key, suffix, at, insert=True, stems=items[:at] + (stem,) + items[at:],
                      folder=folder)

    # -- applying content ------------------------------------------------------------

    def write_content(self, record: RecordDir, inner: tuple[str, ...], content: bytes,
                      existing: Node | None = None) -> None:
        """Check ``content`` for the file at ``inner`` and stage the record with it."""
        if isinstance(existing, ScratchFile):
            return
        if isinstance(existing, DataFile) and existing.loc is not None:
            loc = existing.loc
            suffix = names.split_suffix(inner[-1])[1] or ".bin"
            stems = self._item_names(record, loc.section, loc.key) if loc.item is not None else None
            target = Target(loc.section, loc.key, suffix, loc.item, loc.raw, stems=stems)
        else:
            target = self._target(record, inner, by_name=True)
        msg = self.tree.record_message(record.shard, record.rid)
        try:
            self._apply(msg, target, content, record.shard)
        except Invalid as exc:
            raise self._fail(record, inner, str(exc)) from None
        shown = None
        if target.stems is not None:
            # Written into a .list/ or .steps/ folder: the feature is shown as that folder, its
            # items under the names they had and this one under the name it was written to.
            shown = self.tree.names_shown(record.shard, record.rid)
            shown.keep_items(target.section, target.key, target.stems,
                             self.tree.feature_digest(msg, target.section, target.key), folder=target.folder)
        self._stage_record(record.shard, record.rid, msg.SerializeToString(deterministic=True), shown)

    def _features(self, msg: Any, section: str) -> Any:
        if section == "context":
            return msg.context.feature
        return msg.features.feature

    def _apply(self, msg: Any, t: Target, content: bytes, shard: int) -> None:
        if t.section == "feature_lists":
            self._apply_list(msg, t, content)
            return
        feats = self._features(msg, t.section)
        if t.item is not None:
            values = list(codec.value_from_proto(feats[t.key]).values) if t.key in feats else []
            if t.key in feats and feats[t.key].WhichOneof("kind") not in ("bytes_list", None):
                raise Invalid(f"{t.key} is not a bytes feature")
            if t.insert:
                values.insert(t.item, content)
            else:
                while len(values) <= t.item:
                    values.append(b"")   # a later file of a .list/ copied before an earlier one
                values[t.item] = content
            codec.value_to_proto(codec.Value("bytes_list", tuple(values)), _reset(feats, t.key))
            return
        present = t.key in feats
        kind: str | None = codec.value_from_proto(feats[t.key]).kind if present else None
        raw = t.raw
        if not present:
            kind, raw = self.dataset_kind(t.key, t.section)
            if raw:
                nearby = self._raw_nearby(shard, t.key, t.section)
                raw = raw if nearby is None else nearby
        if kind == "none":
            kind = None
        if raw and t.suffix == ".png" and self.tree.decode_raw:
            pixels, shape = codec.parse_raw_png(content)
            codec.value_to_proto(codec.Value("bytes_list", (pixels,)), _reset(feats, t.key))
            prefix = t.key[:t.key.rfind("/") + 1]
            sizes = {"height": shape.height, "width": shape.width, "depth": shape.channels,
                     "channels": shape.channels}
            for name, n in sizes.items():
                k = prefix + name
                if k in feats and feats[k].WhichOneof("kind") == "int64_list":
                    codec.value_to_proto(codec.Value("int64_list", (n,)), _reset(feats, k))
            return
        value = codec.parse(t.suffix, content, kind)
        codec.value_to_proto(value, _reset(feats, t.key))

    def _apply_list(self, msg: Any, t: Target, content: bytes) -> None:
        lists = msg.feature_lists.feature_list
        if t.item is None:
            steps = codec.parse_feature_list(content, self._step_kind(lists, t.key))
            flist = lists[t.key]
            del flist.feature[:]
            for step in steps:
                codec.value_to_proto(step, flist.feature.add())
            return
        flist = lists[t.key]
        kinds = {f.WhichOneof("kind") for f in flist.feature if f.WhichOneof("kind")}
        step_kind = kinds.pop() if len(kinds) == 1 else None
        if t.insert:
            flist.feature.add()
            for i in range(len(flist.feature) - 1, t.item, -1):   # repeated messages have no insert
                flist.feature[i].CopyFrom(flist.feature[i - 1])
        while len(flist.feature) <= t.item:
            flist.feature.add()
        step = flist.feature[t.item]
        step.Clear()
        codec.value_to_proto(codec.parse(t.suffix, content, step_kind), step)

    def _step_kind(self, lists: Any, key: str) -> str | None:
        if key in lists:
            kinds = {f.WhichOneof("kind") for f in lists[key].feature if f.WhichOneof("kind")}
            if len(kinds) == 1:
                return kinds.pop()
        kind, _ = self.dataset_kind(key, "feature_lists")
        return kind

    def _remove(self, msg: Any, loc: Loc) -> bool:
        """Remove what ``loc`` stands for; returns whether the feature itself is gone."""
        if loc.section == "feature_lists":
            lists = msg.feature_lists.feature_list
            if loc.item is None:
                del lists[loc.key]
                return True
            del lists[loc.key].feature[loc.item]
            if not lists[loc.key].feature:
                del lists[loc.key]
                return True
            return False
        feats = self._features(msg, loc.section)
        if loc.item is None:
            del feats[loc.key]
            return True
        values = list(feats[loc.key].bytes_list.value)
        del values[loc.item]
        if not values:
            del feats[loc.key]
            return True
        codec.value_to_proto(codec.Value("bytes_list", tuple(values)), _reset(feats, loc.key))
        return False

    # -- unlink / mkdir / rmdir ----------------------------------------------------------

    def unlink(self, path: str) -> None:
        node, record, inner = self.tree.locate(path)
        if isinstance(node, ScratchFile):
            durable.unlink(node.path)
            self.tree.invalidate(record.shard, record.rid)
            return
        if isinstance(node, RecordBin):
            self._delete_record(node.shard, node.rid)
            return
        if not isinstance(node, DataFile) or node.loc is None or record is None:
            if isinstance(node, (Dir, ShardDir, RecordDir)):
                raise IsADir(path)
            raise ReadOnly(f"{path}: only records can be changed")
        msg = self.tree.record_message(record.shard, record.rid)
        shown = self.tree.names_shown(record.shard, record.rid)
        if self._remove(msg, node.loc):
            # Folders that held only this feature (a .list/ or .steps/ folder included) stay until
            # rmdir, as on any filesystem.
            self._keep_folders(record, inner[:-1])
        elif node.loc.item is not None:
            self._drop_item_name(shown, node.loc, msg)
        self._stage_record(record.shard, record.rid, msg.SerializeToString(deterministic=True), shown)

    def _drop_item_name(self, shown: NamePin, loc: Loc, msg: Any) -> None:
        """After removing item ``loc.item`` of a .list/ or .steps/ folder, the items after it keep
        their names (``rm -r`` has listed them already): the folder shows the names it had, less one."""
        entry = shown.get(loc.section, loc.key)
        if entry is None or entry.stems is None or loc.item is None or loc.item >= len(entry.stems):
            return
        stems = entry.stems[:loc.item] + entry.stems[loc.item + 1:]
        shown.keep_items(loc.section, loc.key, stems, self.tree.feature_digest(msg, loc.section, loc.key))

    def _keep_folders(self, record: RecordDir, folder: tuple[str, ...]) -> None:
        if not folder:
            return
        real = self._scratch_path(record, folder)
        if not os.path.isdir(real):
            os.makedirs(real, exist_ok=True)
            durable.fsync_dir(os.path.dirname(real))

    def mkdir(self, path: str) -> None:
        parent_path, name = self._split(path)
        parent, record, inner = self.tree.locate(parent_path)
        try:
            self.tree.child(parent, name)
            raise Exists(path)
        except NotFound:
            pass
        if record is not None:
            if not is_scratch(name):
                stem, suffix = names.split_suffix(name)
                if inner and names.split_suffix(inner[-1])[1] in (".list", ".steps"):
                    raise Invalid("folders cannot be made inside a .list/ or .steps/ folder")
            try:
                self._keep_folders(record, inner + (name,))
            finally:
                self.tree.invalidate(record.shard, record.rid)
            return
        if isinstance(parent, ShardDir):
            self._add_record(parent.shard, name, self._empty_record(parent.shard))
            return
        if isinstance(parent, Dir) and parent in self.tree.dirs.values() and self.tree.discovery.mirrors_dir:
            self._add_shard(parent_path, name)
            return
        raise NotPermitted(f"{path}: folders can be made in record folders, shard folders and source folders")

    def _empty_record(self, shard: int) -> bytes:
        if self.tree.kinds[shard] == "sequence":
            seq = proto.SequenceExample()
            seq.context.SetInParent()
            seq.feature_lists.SetInParent()
            return seq.SerializeToString()
        return b""

    def _add_record(self, shard: int, name: str, data: bytes) -> None:
        if is_scratch(name) or not name:
            raise Invalid(f"{name}: record names may not start with '.' or end with '~'")
        if self.tree.kinds[shard] == "raw":
            raise Invalid("records of a raw shard are files; they cannot be added as folders")
        ch = self._changes(shard)
        try:
            self.staging.put_added(ch, name, data)
        finally:
            self.tree.invalidate(shard, name)

    def _add_shard(self, parent_path: str, name: str) -> None:
        rel_parent = parent_path.strip("/")
        relpath = os.path.join(rel_parent, name) if rel_parent else name
        if os.path.exists(os.path.join(self.root, relpath)) and self.tree.shard_number(relpath) is None:
            raise Exists(f"{relpath}: a file of that name exists in the source folder")
        lower = name.lower()
        compression = (tfrecord.GZIP if lower.endswith(".gz") else
                       tfrecord.ZLIB if lower.endswith(".zlib") else tfrecord.NONE)
        kinds = set(self.tree.kinds)
        kind = kinds.pop() if len(kinds) == 1 else "example"
        existing = self.tree.shard_number(relpath)
        ch = self.staging.shards.get(relpath)
        if existing is not None and ch is not None and ch.removed:
            # Removed and made again before a commit: an empty shard of the same name.
            for i in range(self.tree.shards[existing].count):
                if i not in ch.deleted:
                    self.staging.delete_record(ch, i)
            for added in list(ch.added):
                self.staging.remove_added(ch, added)
            self.staging.set_removed(ch, False)
            self.tree._place_shard(existing)
            return
        try:
            self.staging.shard(relpath, compression=compression, kind=kind, new=True)
        finally:
            if relpath in self.staging.shards:   # on disk, even if a later step of it failed
                self.tree.add_shard(_empty_index(self.root, relpath, compression), kind)

    def rmdir(self, path: str) -> None:
        node, record, inner = self.tree.locate(path)
        if isinstance(node, ShardDir):
            if any(True for _ in self.tree.list(node)):
                raise NotEmpty(path)
            ch = self._changes(node.shard)
            self.staging.set_removed(ch, True)
            self.tree.hide_shard(node.shard)
            return
        if isinstance(node, RecordDir):
            view = self.tree.record_view(node.shard, node.rid).root
            if _has_files(view):
                raise NotEmpty(path)
            self._delete_record(node.shard, node.rid)
            return
        if record is None or not isinstance(node, Dir):
            if isinstance(node, Dir):
                raise NotPermitted(f"{path}: source folders cannot be removed")
            raise NotADir(path)
        if node.children:
            if self.tree.kinds[record.shard] == "sequence" and inner in (("context",), ("feature_lists",)):
                raise NotEmpty(path)
            raise NotEmpty(path)
        try:
            if node.scratch:
                os.rmdir(node.scratch)
                durable.fsync_dir(os.path.dirname(node.scratch))
        finally:
            self.tree.invalidate(record.shard, record.rid)

    def _delete_record(self, shard: int, rid: RecordId) -> None:
        ch = self._changes(shard)
        try:
            if isinstance(rid, str):
                self.staging.remove_added(ch, rid)
            else:
                self.staging.delete_record(ch, rid)
            self.tree.unpin(shard, rid)   # an added record's name may be given to a new record
            scratch = self.tree.scratch_root(shard, rid)
            if os.path.isdir(scratch):
                shutil.rmtree(scratch)
        finally:
            self.tree.invalidate(shard, rid)

    # -- rename ----------------------------------------------------------------------------
    # A rename that changes more than one journal file — a record and a scratch file, or two records —
    # is staged as one Intent (staging.py): published by a single durable rename, so a crash or an I/O
    # error leaves the state before the call or after it, never a mix.

    def rename(self, old: str, new: str) -> None:
        node, record, inner = self.tree.locate(old)
        new_parent_path, new_name = self._split(new)
        new_parent, new_record, new_inner = self.tree.locate(new_parent_path)
        if isinstance(node, RecordDir):
            self._move_record(node, new_parent, new_name)
            return
        if record is None or new_record is None or (record.shard, record.rid) != (new_record.shard, new_record.rid):
            # Across records (or shards): mv falls back to copy and delete, which we support.
            raise _CrossDevice(f"{old} -> {new}")
        dest_inner = new_inner + (new_name,)
        try:
            dest = self.tree.child(new_parent, new_name)
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
        msg = self.tree.record_message(record.shard, record.rid)
        shown = self.tree.names_shown(record.shard, record.rid)
        intent = self.staging.intent()
        if is_scratch(dest_inner[-1]):
            # An editor's backup (mv label.json label.json~): the key goes, as with rm, and the
            # scratch file appears, in the same step.
            if self._remove(msg, node.loc):
                self._keep_folders(record, inner[:-1])
            elif node.loc.item is not None:
                self._drop_item_name(shown, node.loc, msg)
            real = self._scratch_path(record, dest_inner)
            self._make_real_folder(os.path.dirname(real))
            intent.write_file(real, content)
        else:
            self._remove(msg, node.loc)
            self._take_content(record, msg, shown, dest_inner, dest, content)
            self._keep_folders(record, inner[:-1])
        self._intend_record(intent, record.shard, record.rid, msg)
        self._run_intent(intent, {(record.shard, record.rid): shown})

    def _rename_scratch(self, record: RecordDir, node: ScratchFile, dest_inner: tuple[str, ...],
                        dest: Node | None) -> None:
        if is_scratch(dest_inner[-1]):
            real = self._scratch_path(record, dest_inner)
            self._make_real_folder(os.path.dirname(real))
            try:
                durable.rename(node.path, real)      # one rename: atomic as it is
                durable.fsync_dir(os.path.dirname(real))
            finally:
                self.tree.invalidate(record.shard, record.rid)
            return
        # A scratch file renamed over a feature (sed -i, rsync, an editor restoring its backup): the
        # record takes the content and the scratch file goes, in the same step.
        with open(node.path, "rb") as f:
            content = f.read()
        msg = self.tree.record_message(record.shard, record.rid)
        shown = self.tree.names_shown(record.shard, record.rid)
        self._take_content(record, msg, shown, dest_inner, dest, content)
        intent = self.staging.intent()
        intent.drop(node.path)
        self._intend_record(intent, record.shard, record.rid, msg)
        self._run_intent(intent, {(record.shard, record.rid): shown})

    def _take_content(self, record: RecordDir, msg: Any, shown: NamePin, dest_inner: tuple[str, ...],
                      dest: Node | None, content: bytes) -> None:
        """Put ``content`` into ``msg`` as the feature file at ``dest_inner`` (replacing ``dest``)."""
        if isinstance(dest, DataFile) and dest.loc is not None:
            self._remove(msg, dest.loc)
        target = self._target(record, dest_inner)
        try:
            self._apply(msg, target, content, record.shard)
        except Invalid as exc:
            raise self._fail(record, dest_inner, str(exc)) from None
        if target.stems is not None:
            shown.keep_items(target.section, target.key, target.stems,
                             self.tree.feature_digest(msg, target.section, target.key))

    def _rename_folder(self, record: RecordDir, node: Dir, inner: tuple[str, ...], dest: tuple[str, ...],
                       existing: Node | None) -> None:
        # As rename(2): a folder may only take the place of an empty folder.
        if existing is not None and not isinstance(existing, Dir):
            raise NotADir("/".join(dest))
        if isinstance(existing, Dir) and existing.children:
            raise NotEmpty("/".join(dest))
        files: list[tuple[tuple[str, ...], DataFile]] = []
        _walk_files(node, (), files)
        msg = self.tree.record_message(record.shard, record.rid)
        shown = self.tree.names_shown(record.shard, record.rid)
        removed: set[tuple[str, str]] = set()
        for _, f in files:
            if f.loc is not None and (f.loc.section, f.loc.key) not in removed:
                self._remove(msg, Loc(f.loc.section, f.loc.key))
                removed.add((f.loc.section, f.loc.key))
        try:
            for rel, f in sorted(files, key=lambda x: x[0]):
                self._apply(msg, self._target(record, dest + rel), f.data, record.shard)
        except Invalid as exc:
            raise self._fail(record, dest, str(exc)) from None
        intent = self.staging.intent()
        if node.scratch:
            # The user's own files in it move with the features, in the same step.
            real_dest = self._scratch_path(record, dest)
            self._make_real_folder(os.path.dirname(real_dest))
            intent.move(node.scratch, real_dest)
        self._keep_folders(record, inner[:-1])
        if files:
            self._intend_record(intent, record.shard, record.rid, msg)
        self._run_intent(intent, {(record.shard, record.rid): shown})

    def _move_record(self, node: RecordDir, new_parent: Node, new_name: str) -> None:
        """mv of a record folder into a shard folder (its own included: a new name). One step: the
        record is added there, deleted here, and the user's own files in it move along."""
        if not isinstance(new_parent, ShardDir):
            raise _CrossDevice("records can only be moved into shard folders")
        if self.tree.kinds[new_parent.shard] != self.tree.kinds[node.shard]:
            raise Invalid("a record can only move to a shard of the same record kind")
        if is_scratch(new_name) or not new_name:
            raise Invalid(f"{new_name}: record names may not start with '.' or end with '~'")
        shard = new_parent.shard
        try:
            existing = self.tree.child(new_parent, new_name)
        except NotFound:
            existing = None
        if isinstance(existing, RecordDir) and (existing.shard, existing.rid) == (node.shard, node.rid):
            return
        if existing is not None and (not isinstance(existing, RecordDir) or _has_files(
                self.tree.record_view(existing.shard, existing.rid).root)):
            raise Exists(new_name)
        data, _ = self.tree.record_bytes(node.shard, node.rid)
        src_ch, dst_ch = self._changes(node.shard), self._changes(shard)
        intent = self.staging.intent()
        touched: dict[tuple[int, RecordId], NamePin | None] = {(node.shard, node.rid): None, (shard, new_name): None}
        if existing is not None and isinstance(existing.rid, int):
            # An empty original record of that name goes; an added one is replaced by the add below.
            intent.delete(dst_ch, existing.rid)
            intent.drop(self.tree.scratch_root(shard, existing.rid))
            touched[(shard, existing.rid)] = None
        intent.add(dst_ch, new_name, data)
        intent.delete(src_ch, node.rid)
        src_scratch, dst_scratch = self.tree.scratch_root(node.shard, node.rid), self.tree.scratch_root(shard, new_name)
        if os.path.isdir(src_scratch):
            self._make_real_folder(os.path.dirname(dst_scratch))
            intent.move(src_scratch, dst_scratch)
        else:
            intent.drop(dst_scratch)     # left by the record of that name that was here
        self._run_intent(intent, touched)

    def _intend_record(self, intent: Intent, shard: int, rid: RecordId, msg: Any) -> None:
        data = msg.SerializeToString(deterministic=True)
        if isinstance(rid, str):
            intent.add(self._changes(shard), rid, data)
        else:
            intent.edit(self._changes(shard), rid, data)

    def _run_intent(self, intent: Intent, touched: dict[tuple[int, RecordId], NamePin | None]) -> None:
        """Stage ``intent``, then show the records it changed as they are now: a record changed in
        place with the names it showed (``touched`` gives its pin), a deleted or moved-in one afresh.
        Shown so also when the call happened but failed part way, and when a later change finishes it."""
        def show() -> None:
            for (shard, rid), pin in touched.items():
                if not intent.published:
                    self.tree.invalidate(shard, rid)
                elif pin is not None:
                    self.tree.pin_names(shard, rid, pin)
                else:
                    self.tree.unpin(shard, rid)
                    self.tree.invalidate(shard, rid)
        intent.after = show
        try:
            self.staging.run(intent)
        finally:
            show()

    def _make_real_folder(self, path: str) -> None:
        """Make a folder under the staging folder (and the ones above it) durably, before an intent
        names it. Folders of a record that it already shows, so making them changes no view."""
        missing = []
        while not os.path.isdir(path):
            missing.append(path)
            path = os.path.dirname(path)
        for folder in reversed(missing):
            os.makedirs(folder, exist_ok=True)
            durable.fsync_dir(os.path.dirname(folder))

    # -- commit ------------------------------------------------------------------------------

    def status(self) -> dict:
        shards = []
        for relpath, ch in sorted(self.staging.shards.items()):
            shards.append({"shard": relpath, "new": ch.new, "removed": ch.removed, "edited": len(ch.edited),
                           "deleted": len(ch.deleted), "added": len(ch.added)})
        return {"pending": [s for s in shards if s["new"] or s["removed"] or s["edited"] or s["deleted"]
                            or s["added"]], "last_commit": self.last_commit}

    def commit(self) -> list[repack.ShardResult]:
        """Write every changed shard anew. Raises CommitFailed; what finished before stays committed."""
        results = []
        started = time.monotonic()
        self._raw_tallies.clear()   # the shards are about to change
        for relpath, ch in sorted(self.staging.shards.items()):
            if ch.empty:
                self.staging.drop_shard(relpath)
                continue
            n = self.tree.shard_number(relpath)
            idx = self.tree.shards[n] if n is not None else None
            src_fd = self.tree.shard_fd(n) if n is not None else None
            log.info("committing %s (%d edited, %d deleted, %d added%s)", relpath, len(ch.edited), len(ch.deleted),
                     len(ch.added), ", removed" if ch.removed else ", new" if ch.new else "")
            try:
                result = repack.commit_shard(self.root, ch, idx, src_fd, self.staging)
            except repack.CommitFailed as exc:
                log.error("%s", exc)
                self.last_commit = {"ok": False, "error": str(exc), "done": [r.relpath for r in results]}
                raise
            results.append(result)
            if n is not None:
                if result.action == "removed":
                    self.tree.hide_shard(n)
                else:
                    self._reload(n, relpath)
            log.info("committed %s: %s, %d records, %d bytes", relpath, result.action, result.records,
                     result.bytes)
        self.last_commit = {"ok": True, "shards": [r.__dict__ for r in results],
                            "seconds": round(time.monotonic() - started, 3)}
        return results

    def _reload(self, n: int, relpath: str) -> None:
        path = os.path.join(self.root, relpath)
        st = os.stat(path)
        old = self.tree.shards[n].shard
        shard = ShardFile(path=os.path.abspath(path), relpath=relpath, compression=old.compression, size=st.st_size,
                          mtime_ns=st.st_mtime_ns)
        idx, _ = self.cache.get(shard)
        self.tree.replace_shard(n, idx)


class _CrossDevice(OSError):
    """rename across records: mv then copies and deletes, which the mount supports."""

    def __init__(self, message: str) -> None:
        import errno
        super().__init__(errno.EXDEV, message)


def _reset(feats: Any, key: str) -> Any:
    feats[key].Clear()
    return feats[key]


def _has_files(d: Dir) -> bool:
    for c in d.children.values():
        if isinstance(c, Dir):
            if _has_files(c):
                return True
        else:
            return True
    return False


def _walk_files(d: Dir, prefix: tuple[str, ...], out: list) -> None:
    for name, c in d.children.items():
        if isinstance(c, Dir):
            _walk_files(c, prefix + (name,), out)
        elif isinstance(c, DataFile):
            out.append((prefix + (name,), c))


def _empty_index(root: str, relpath: str, compression: str) -> ShardIndex:
    from array import array
    path = os.path.join(root, relpath)
    shard = ShardFile(path=os.path.abspath(path), relpath=relpath, compression=compression, size=0,
                      mtime_ns=time.time_ns())
    return ShardIndex(shard, os.devnull, array("Q", [0]), "example")
