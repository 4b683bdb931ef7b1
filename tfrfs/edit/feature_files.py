"""Feature files of a writable mount: open, create, write, truncate, fsync, close and rm (SPEC 7).

While a feature file is open, its descriptors share one content (``handles.OpenFile``, kept here
by path), which collects in a temporary file and is judged only when a descriptor opened for
writing is closed, or at fsync, never on an intermediate state such as the truncation that
precedes new content; what fits is put into the record (``mutate``) and the record staged
(``stager``).
"""

from __future__ import annotations

import errno
import os
import time
from typing import Any, Callable

from tfrfs.storage import durable
from tfrfs.edit import largevalue
from tfrfs.edit import mutate
from tfrfs.format import names
from tfrfs.errors import Busy, DataLoss, Invalid, IsADir, NoSpace, ReadOnly, TfrfsError, TooLarge
from tfrfs.edit.handles import OpenFile, ScratchHandle, WriteHandle
from tfrfs.edit.largevalue import LIMIT, Spliced, StandIn
from tfrfs.edit.mutate import Target
from tfrfs.view.nodes import DataFile, FileHandle, MetaFile, Node, PlainFile, RecordBin, RecordDir, ScratchFile
from tfrfs.view.pins import NamePin, feature_digest, pin_from_shown
from tfrfs.edit.stager import Stager, is_scratch, is_scratch_path, split_path


class FileEditor:
    """Feature files: their content, their creation and removal."""

    def __init__(self, stager: Stager, commit: Callable[[bytes], Any]) -> None:
        self.stager = stager
        self.tree = stager.tree
        self.store = stager.store
        self.session = stager.session
        self.commit = commit   # writing to .tfrfs/commit runs it, with what was written
        self.busy: Callable[[], str | None] = lambda: None   # why no change is staged now (a commit runs)
        # path -> the content of a feature file that some descriptor has open: every descriptor
        # of the file reads and writes it, and stat answers from it, until the last one is closed
        self.open_files: dict[str, OpenFile] = {}

    def open_stat(self, path: str) -> tuple[int, int] | None:
        """(size, mtime) of a feature file some descriptor has open (also one being created, with
        no feature behind it yet), or None."""
        f = self.open_files.get(path)
        return (f.size(), f.mtime_ns) if f is not None else None

    # -- open / create / flush -----------------------------------------------------

    def open(self, path: str, flags: int) -> FileHandle | None:
        """A handle for ``path``; None for a file opened only for reading that the tree's own
        handle serves (anything but a feature file)."""
        writer = flags & os.O_ACCMODE != os.O_RDONLY or bool(flags & os.O_TRUNC)
        if writer and path.endswith("/commit") and self._is_commit_path(path):
            # Each descriptor that writes .tfrfs/commit gives a word of its own, read at its close.
            # The kernel sends a descriptor's release after close() has returned, so the next
            # word (tfrfs umount's "keep" after its "discard") may come before the last one's
            # release: in a shared content it would be written over what is left of that one.
            return WriteHandle(self, OpenFile(path, b"", time.time_ns(), self.stager.staging.tmp_file, new=False),
                               writer=True)
        file = self.open_files.get(path)   # (never .tfrfs/commit's: read, it says what it says now)
        if file is None:
            node, record, inner = self.tree.locate(path)
            if isinstance(node, ScratchFile):
                return ScratchHandle(node.path, flags) if writer else None
            if not writer and not isinstance(node, DataFile):
                return None
            if isinstance(node, (PlainFile, MetaFile)) and not _is_commit_file(node):
                raise ReadOnly(f"{path}: only records can be changed")
            if node.folder:
                raise IsADir(path)
            if isinstance(node, DataFile) and node.damaged:
                raise DataLoss(node.damaged)
            if isinstance(node, DataFile) and isinstance(node.data, bytes):
                base = node.data   # shared, not copied: copied once, at the first change
            else:
                base = b"" if isinstance(node, MetaFile) else self.tree.open(node).read(1 << 62, 0)
            file = OpenFile(path, base, self.tree.stat(node).mtime_ns, self.stager.staging.tmp_file, new=False)
            self.open_files[path] = file
        handle = WriteHandle(self, file, writer=writer)
        if flags & os.O_TRUNC:
            # O_TRUNC emptied the file: that is a change, judged at the last close even if nothing
            # is written (`: > f`, `cp /dev/null f`), or the old value would silently stay.
            file.truncate(0)
        return handle

    def _is_commit_path(self, path: str) -> bool:
        try:
            return _is_commit_file(self.tree.lookup(path))
        except FileNotFoundError:
            return False

    def create(self, path: str, flags: int) -> FileHandle:
        if path in self.open_files:   # made by another descriptor and not closed yet
            handle = self.open(path, flags)
            assert handle is not None
            return handle
        parent_path, name = split_path(path)
        parent, record, inner = self.tree.locate(parent_path)
        if record is None:
            raise Invalid(f"{path}: new files can only be made inside a record folder")
        if is_scratch_path(inner + (name,)):
            real = self.stager.scratch_path(record, inner + (name,))
            os.makedirs(os.path.dirname(real), exist_ok=True)
            os.close(os.open(real, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644))
            durable.fsync_dir(os.path.dirname(real))
            self.session.invalidate(record.shard, record.rid)
            return ScratchHandle(real, os.O_RDWR)
        self.stager.target(record, inner + (name,))   # refuse names that cannot be features now
        file = OpenFile(path, b"", time.time_ns(), self.stager.staging.tmp_file, new=True)
        self.open_files[path] = file
        return WriteHandle(self, file, writer=True)

    def flush(self, handle: WriteHandle, *, final: bool = False) -> None:
        """Judge and stage what was written, at the close of a descriptor opened for writing
        (``final``: the release of one; the last one judges whatever is left). Until the last
        close, a file that was only truncated is an intermediate state (``> file`` closes once
        before it writes) and waits."""
        file = handle.file
        final = final and file.handles <= 1
        if not (handle.writer or final) or not file.dirty or not (file.written or final):
            return
        self._judge(file, report=True)

    def sync(self, handle: WriteHandle) -> None:
        """fsync: stage the file's content now if it is a valid value, the file staying open. Content
        that is not one yet (a .json half written) waits for close, where it is judged: a program
        that syncs as it writes is not failed mid-way, and the old value stays staged meanwhile."""
        if handle.file.dirty:
            try:
                self._judge(handle.file, report=False)
            except (Invalid, TooLarge):
                pass

    def _judge(self, file: OpenFile, *, report: bool) -> None:
        """Check the file's content for the feature its path stands for, and stage it. ``report``:
        refused content goes to .tfrfs/errors, and counts as judged."""
        if file.gone:
            return
        dirty, written = file.dirty, file.written
        file.dirty = file.written = False
        try:
            node, record, inner = self._locate_for_write(file.path)
            if isinstance(node, MetaFile):
                if report:
                    self.commit(file.content())   # .tfrfs/commit acts at close, not at fsync
                else:
                    file.dirty, file.written = dirty, written
                return
            reason = self.busy()
            if reason is not None:
                # The commit works from what was staged when it started: refused, as content that
                # does not fit is (the old value stays), and said where content refused is said.
                if report:
                    self.tree.errors.reject(file.path, reason)
                else:
                    file.dirty, file.written = dirty, written
                raise Busy(f"{file.path}: {reason}")
            if isinstance(node, ScratchFile):
                # Renamed to a scratch name while open (libfuse hides a removed open file so):
                # what was written since goes into that file.
                _overwrite(node.path, file.content())
                return
            assert record is not None
            self.write_content(record, inner, file, existing=node, report=report)
            file.new = False
        except (Invalid, TooLarge, NoSpace):
            if not report:
                file.dirty, file.written = dirty, written
            raise

    def release(self, handle: WriteHandle) -> None:
        file = handle.file
        file.handles -= 1
        if file.handles <= 0:
            if self.open_files.get(file.path) is file:
                del self.open_files[file.path]
            file.discard()

    def is_new(self, path: str) -> bool:
        """Whether ``path`` is a file being created: open, with no feature behind it yet."""
        f = self.open_files.get(path)
        return f is not None and f.new

    def moved(self, old: str, new: str) -> None:
        """A rename: open files at ``old`` (or below it) are now at ``new``; one open at ``new``
        was replaced, and what is written to it goes nowhere. A file being created that is given
        a scratch name (libfuse hides a removed open file so) will never be a feature."""
        for path in [p for p in self.open_files if p == new or p.startswith(new + "/")]:
            self.open_files.pop(path).gone = True
        for path in [p for p in self.open_files if p == old or p.startswith(old + "/")]:
            f = self.open_files.pop(path)
            f.path = new + path[len(old):]
            self.open_files[f.path] = f
            if f.new and is_scratch(split_path(f.path)[1]):
                f.gone = True

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
        """truncate(2) by path: a whole change, judged at once (also of a file open elsewhere)."""
        file = self.open_files.get(path)
        if file is not None:
            file.truncate(length)
            file.written = True
            self._judge(file, report=True)
            return
        node, record, inner = self.tree.locate(path)
        if isinstance(node, ScratchFile):
            os.truncate(node.path, length)
            return
        if _is_commit_file(node):
            return
        if record is None or not isinstance(node, DataFile) or not isinstance(node.data, bytes):
            raise ReadOnly(f"{path}: only records can be changed")
        # As if opened, truncated and closed: the content grows in a (sparse) temporary file, not
        # in memory, and a length no record can hold is refused before anything is written.
        file = OpenFile(path, node.data, self.tree.stat(node).mtime_ns, self.stager.staging.tmp_file, new=False)
        try:
            try:
                file.truncate(length)
            except OSError:
                pass   # remembered: refused (with its reason) as the close would be, below
            file.written = True
            self.write_content(record, inner, file, existing=node)
        finally:
            file.discard()

    def touch(self, path: str, times: Any) -> None:
        if path in self.open_files:
            return
        node = self.tree.lookup(path)
        if isinstance(node, ScratchFile):
            if times is None:
                os.utime(node.path)
            else:
                os.utime(node.path, ns=(int(times[0]), int(times[1])))

    # -- content ---------------------------------------------------------------------

    def write_content(self, record: RecordDir, inner: tuple[str, ...], content: bytes | OpenFile,
                      existing: Node | None = None, *, report: bool = True) -> None:
        """Check ``content`` (bytes, or an open feature file's) for the file at ``inner`` and stage
        the record with it. ``report``: content refused also goes to .tfrfs/errors and the log.

        Large content is never read into memory (``largevalue``): it is judged by a stand-in, and
        staged straight from its temporary file. A value no record can hold is refused by its size,
        before anything is read."""
        if isinstance(existing, ScratchFile):
            return
        stager = self.stager

        def refuse(exc: TfrfsError) -> TfrfsError:
            if not report:
                return exc
            fail = stager.fail(record, inner, exc.message)
            if isinstance(exc, Invalid):
                return fail
            said = type(exc)(fail.message)   # the path in front, as for content refused
            said.errno = exc.errno
            return said

        kind: str | None = None   # the kind an empty list takes (a user.tfrfs.kind xattr)
        if isinstance(content, OpenFile):
            if content.failed is not None:
                raise refuse(content.failed)
            size = content.size()
            kind = content.kind
        else:
            size = len(content)
        if size > LIMIT:
            raise refuse(_too_large(f"the value is {size:,} bytes"))
        if isinstance(existing, DataFile) and existing.loc is not None and existing.loc.item is None:
            loc = existing.loc
            suffix = names.split_suffix(inner[-1])[1] or ".bin"
            target = Target(loc.section, loc.key, suffix, None, loc.raw)
        else:
            target = stager.target(record, inner)
        msg = self.store.message(record.shard, record.rid)
        # Written into a .list/ or .steps/ folder, the feature is shown as that folder, its items
        # under the names they had and this one under the name it was written to. Written as a
        # file, the name written through keeps finding the value until a commit, whatever suffix
        # the rules now give it (an empty or text value written to KEY.bin is KEY.txt): the writer
        # can open it again by that name (pins.NamePin.keep_written).
        keep_name = target.item_names is None and target.item is None and target.section != "feature_lists" \
            and not target.raw and target.suffix != ".json"
        dataset_kind = stager.dataset_kind_near(record.shard)
        stand: StandIn | None = None
        if isinstance(content, OpenFile):
            if content.fd >= 0 and size >= largevalue.MIN_SIZE and \
                    not _judged_whole(msg, target, dataset_kind, self.store.decode_raw):
                stand = largevalue.stand_in(content.fd, size)
                content = stand.data
            else:
                content = content.content()
        try:
            mutate.apply(msg, target, content, dataset_kind,
                         decode_raw=self.store.decode_raw, dataset_newline=stager.dataset_newline)
        except Invalid as exc:
            raise refuse(exc) from None
        if kind is not None:
            _give_empty_kind(msg, target, kind)
        del content   # the message holds the value now (or its stand-in)
        grows = stand.size - len(stand.data) if stand is not None else 0
        if msg.ByteSize() + grows > LIMIT:
            raise refuse(_too_large(f"the record would be {msg.ByteSize() + grows:,} bytes"))
        serialized = msg.SerializeToString(deterministic=True)
        data: bytes | Spliced = serialized if stand is None else stand.splice(serialized)
        if len(data) > LIMIT:
            raise refuse(_too_large(f"the record would be {len(data):,} bytes"))
        # How the record is shown now, with the digests of its values: the other features' are as
        # they were, and this one's is set below (the content's, not its stand-in's).
        pin = self._names_shown(record, msg) if target.item_names is not None or keep_name else None
        if pin is not None and target.item_names is not None:
            pin.set_item_names(target.section, target.key, target.item_names,
                               _digest(msg, target, stand), folder=target.folder,
                               sub_names=target.sub_names)
        elif pin is not None:
            rest = inner[1:] if target.section else inner
            pin.keep_written(target.section, target.key, rest[:-1], rest[-1], _digest(msg, target, stand))
        try:
            stager.stage_record(record.shard, record.rid, data, pin)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or isinstance(exc, TfrfsError):
                raise
            raise refuse(NoSpace(f"it could not be staged: {os.strerror(exc.errno)}")) from None
        stager.learn(msg, target.section, target.key, record)

    def set_kind(self, path: str, value: bytes) -> None:
        """setxattr ``user.tfrfs.kind``: an empty list (``[]`` tells no kind, SPEC 7) takes the kind
        named, as ``cp -a`` copies it back; on any other value it is accepted and changes nothing
        (the content told the kind). A file still open takes it when its content is judged."""
        kind = value.decode("ascii", "replace").strip()
        if kind not in mutate.LIST_KINDS:
            return
        file = self.open_files.get(path)
        if file is not None:
            file.kind = kind
            if file.dirty:
                return
        node, record, inner = self.tree.locate(path)
        if not isinstance(node, DataFile) or node.loc is None or record is None or node.damaged:
            return
        loc = node.loc
        if loc.item is not None or loc.section == "feature_lists" or node.data != b"[]\n":
            return
        msg = self.store.message(record.shard, record.rid)
        target = Target(loc.section, loc.key, ".json")
        if not _give_empty_kind(msg, target, kind):
            return
        self.stager.stage_record(record.shard, record.rid, msg.SerializeToString(deterministic=True))
        self.stager.learn(msg, loc.section, loc.key, record)

    def _names_shown(self, record: RecordDir, msg: Any) -> NamePin:
        """``EditSession.names_shown`` for the record ``msg`` was parsed from, taken from ``msg`` rather
        than from a second parse (the record may hold a large value): ``msg`` changed in the one
        feature whose pinned entry the caller then sets anew."""
        view = self.store.view(record.shard, record.rid)
        return pin_from_shown(view.shown, msg) if view.shown else NamePin()

    def unlink(self, path: str) -> None:
        if path in self.open_files:   # still open: what is written to it goes nowhere
            f = self.open_files.pop(path)
            f.gone = True
            if f.new:
                return   # nothing staged to remove
        node, record, inner = self.tree.locate(path)
        if isinstance(node, ScratchFile):
            assert record is not None
            durable.unlink(node.path)
            self.session.invalidate(record.shard, record.rid)
            return
        if isinstance(node, RecordBin):
            self.stager.delete_record(node.shard, node.rid)
            return
        if not isinstance(node, DataFile) or node.loc is None or record is None:
            if node.folder:
                raise IsADir(path)
            raise ReadOnly(f"{path}: only records can be changed")
        msg = self.store.message(record.shard, record.rid)
        pin = self.session.names_shown(record.shard, record.rid)
        remove_feature(self.stager, record, msg, pin, node, inner)
        self.stager.stage_record(record.shard, record.rid, msg.SerializeToString(deterministic=True), pin)


def remove_feature(stager: Stager, record: RecordDir, msg: Any, pin: NamePin, node: DataFile,
                   inner: tuple[str, ...]) -> None:
    """Remove what a feature file stands for from ``msg``; the names of the rest stay in ``pin``.
    Folders that held only this feature (a .list/ or .steps/ folder included) stay until rmdir,
    as on any file system."""
    loc = node.loc
    assert loc is not None
    gone = mutate.remove(msg, loc)
    pin.drop(loc, gone, feature_digest(msg, loc.section, loc.key))
    if gone == "feature" or (gone == "item" and loc.sub is not None):
        stager.keep_folders(record, inner[:-1])


_DIGEST_SIZE = 16   # pins.value_digest's (a test holds the two digests equal)


def _give_empty_kind(msg: Any, t: Target, kind: str) -> bool:
    """``mutate.retype_empty`` for the feature a ``.json`` file ``t`` stands for, as a whole."""
    if t.item is not None or t.section == "feature_lists" or t.suffix != ".json":
        return False
    return mutate.retype_empty(mutate.features_of(msg, t.section), t.key, kind)


def _too_large(what: str) -> TooLarge:
    return TooLarge(f"{what}, more than a record can hold: protobuf, and so TensorFlow, reads records "
                    f"of at most {LIMIT:,} bytes")


def _judged_whole(msg: Any, t: Target, dataset_kind: mutate.DatasetKind, decode_raw: bool) -> bool:
    """Whether ``mutate.apply`` judges content for ``t`` by all its bytes (JSON: a .json file, a
    feature list's file; a PNG stored as its pixels), not only by its name, its kind and its last
    bytes: then no stand-in can take its place."""
    if t.suffix == ".json" or (t.section == "feature_lists" and t.item is None):
        return True
    if t.suffix != ".png" or not decode_raw or t.section == "feature_lists" or t.item is not None:
        return False
    feats = mutate.features_of(msg, t.section)
    return t.raw if t.key in feats else dataset_kind(t.key, t.section)[1]


def _digest(msg: Any, t: Target, stand: StandIn | None) -> bytes:
    """``pins.feature_digest`` of the feature ``t`` names, with the content in place of its stand-in."""
    if stand is None:
        return feature_digest(msg, t.section, t.key)
    feats = msg.feature_lists.feature_list if t.section == "feature_lists" else mutate.features_of(msg, t.section)
    if t.key not in feats:
        return b""
    return stand.splice(feats[t.key].SerializeToString(deterministic=True)).blake2b(_DIGEST_SIZE)


def _overwrite(path: str, content: bytes) -> None:
    """Give the real file at ``path`` this content, durably, in place (its other descriptors see it)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        durable.pwrite(fd, content, 0, path)
        os.ftruncate(fd, len(content))
        durable.fsync(fd, path)
    finally:
        os.close(fd)


def _is_commit_file(node: Node | None) -> bool:
    return isinstance(node, MetaFile) and node.name == "commit"
