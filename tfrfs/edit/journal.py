"""Durable staged edits: the journal a writable mount keeps beside the shards.

Everything lives under ``ROOT/.tfrfs-staging/`` on the shards' own filesystem,
one folder per shard (named by a hash of its path relative to SOURCE)::

    lock                     flock-ed by the one writable mount, which notes in it its process
                             and mount point (JSON; read by status, commit and discard)
    shards/SID/meta.json     {"relpath", "new", "removed", "compression", "kind", "base": {...}}
    shards/SID/edit/N        new bytes of original record N (a serialized Example)
    shards/SID/del/N         marker: original record N is deleted
    shards/SID/add/H         an added record: u32 name length, UTF-8 name, record bytes
    shards/SID/committing    written just before the new shard file replaces the old one
    scratch/SID/RH/...       the user's scratch files (editor swap and backup files)
    tmp/                     files being written through the mount, until close; files
                             prepared for an intent
    intent                   a change of several files above that a crash must not split

Each change is one small file written beside its final name, fsynced, renamed
into place and the folder fsynced, so once the call that made it returns the
change survives a crash; a half-written change is only ever a ``.tmp-`` file,
ignored and removed at the next mount.

When a writable mount ends with nothing staged (after its commit, or when
nothing was changed), the whole folder is removed (``release``): its
sub-folders first, then the lock file, then the folder, each only while
empty. A crash part way leaves an empty journal that the next mount reuses;
a mount starting meanwhile makes the folder again and checks that the lock it
took is the one at the path (``acquire``).

Some calls change several files at once: ``mv label.json label.json~`` turns a
feature into a scratch file (the record loses the key, a scratch file appears),
``mv`` of a record folder into another shard adds it there and deletes it here.
Such a call is an ``Intent``: its new contents are first written to files in
``tmp/``, then one JSON file, ``intent``, listing every step, is published by a
single durable rename (``durable.write_file``: a torn one is only a ``.tmp-``
file, never read). Before that rename the call has not happened (the next mount
removes what ``tmp/`` holds); after it, it has: the steps are carried out, and
``intent`` is removed. Each step is a rename of a prepared (or the user's own)
file or folder into place, or the removal of one, and does nothing when done
already, so running the list again, from any point, finishes the call: the
next mount does so before it reads the journal (``acquire``), and a running
mount does so before its next change if a step failed. Steps on the user's
scratch files also check the inode they were planned for, so running them
again never touches a file made after the call.

While a step keeps failing (an I/O error, twice), the running mount counts the
call as done; a record whose file is not in place yet cannot be read until the
next change, commit or mount finishes it. ``tfrfs status`` of an unmounted
source reads the journal files as they are, without finishing an intent.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import struct
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from tfrfs.storage import durable
from tfrfs.storage.durable import Streamed
from tfrfs.errors import Busy
from tfrfs.index.discovery import STAGING_DIR
# shard_id and name_id are the journal's names too (its folders are named by them)
from tfrfs.edit.intent import Intent, Op, added_blob, added_head, carry_out, name_id, parse_intent, prepare, shard_id
from tfrfs.edit.writerlock import WriterLock

log = logging.getLogger("tfrfs")

__all__ = ["INTENT", "Intent", "ShardChanges", "Staging", "name_id", "shard_id"]

INTENT = "intent"

@dataclass
class ShardChanges:
    """What is staged for one shard (record data stays on disk until asked for)."""

    relpath: str
    sid: str
    new: bool = False
    removed: bool = False
    compression: str = "NONE"
    kind: str = "example"
    base: dict = field(default_factory=dict)        # size and mtime of the shard the edits apply to
    edited: set[int] = field(default_factory=set)
    deleted: set[int] = field(default_factory=set)
    added: dict[str, str] = field(default_factory=dict)   # record name -> file id under add/

    @property
    def empty(self) -> bool:
        return not (self.new or self.removed or self.edited or self.deleted or self.added)

    def added_names(self) -> list[str]:
        return sorted(self.added)


class Staging:
    """The on-disk journal of one SOURCE's staged edits."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.dir = Path(root) / STAGING_DIR
        self.lock = WriterLock(self.dir)
        self.shards: dict[str, ShardChanges] = {}
        self._running: Intent | None = None   # published by this process and not yet removed

    # -- lifetime -------------------------------------------------------------

    def exists(self) -> bool:
        return (self.dir / "shards").is_dir()

    def acquire(self) -> None:
        """Take the single-writer lock; raises Busy when another writable mount holds it."""
        self.lock.take()
        for sub in ("shards", "scratch", "tmp"):
            (self.dir / sub).mkdir(exist_ok=True)
        durable.fsync_dir(self.dir)
        durable.fsync_dir(self.dir.parent)   # the journal's own entry beside the shards
        # A call a crash cut short after its intent was published happened: finish it first, while
        # the files it prepared are still in tmp/.
        self.settle()
        # Files being written when a daemon died were never closed: nothing promised them. Folders
        # here are journals a crash interrupted while dropping them (see drop_shard), files are those
        # prepared for an intent that was never published.
        # Half-written journal files (a crash inside durable.write_file) are only ever .tmp- files;
        # beside the lock, they are intents that were never published.
        self._clear_leftovers()
        for sdir in (self.dir / "shards").iterdir():
            for folder in (sdir, sdir / "edit", sdir / "del", sdir / "add"):
                for p in folder.glob(".tmp-*") if folder.is_dir() else ():
                    p.unlink()

    def release(self) -> None:
        """Let go of the lock; with nothing staged, remove the staging folder first (``tidy``)."""
        if not self.lock.held:
            return
        try:
            self.tidy()
        except OSError as exc:   # an empty journal left behind is harmless
            log.warning("could not remove the empty %s: %s", self.dir, exc)
        finally:
            self.lock.release()

    def holds_anything(self) -> bool:
        """Whether anything is staged on disk: a shard's journal, a scratch file or folder, an intent."""
        if self._intent_path.exists():
            return True
        shards, scratch = self.dir / "shards", self.dir / "scratch"
        return (shards.is_dir() and any(shards.iterdir())) or \
            (scratch.is_dir() and any(_holds_scratch(sdir) for sdir in scratch.iterdir()))

    def _clear_leftovers(self) -> None:
        """Remove what ``tmp/`` holds and half-written ``.tmp-`` files: nobody's, with the lock held
        and no call under way."""
        tmp = self.dir / "tmp"
        for leftover in tmp.iterdir() if tmp.is_dir() else ():
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover)
            else:
                leftover.unlink()
        for p in self.dir.glob(".tmp-*"):
            p.unlink()

    def tidy(self) -> bool:
        """Remove the staging folder if nothing is staged in it (the lock held); whether it went.

        Only empty things are removed, in an order that a mount starting meanwhile survives (see
        the module's docstring): what ``tmp/`` holds is nobody's once the mount is over."""
        if not self.lock.held or self.holds_anything():
            return False
        self._clear_leftovers()
        scratch = self.dir / "scratch"
        for sdir in scratch.iterdir() if scratch.is_dir() else ():
            for rh in sdir.iterdir():
                rh.rmdir()                # empty (holds_anything said so)
            sdir.rmdir()
        for sub in ("tmp", "shards", "scratch"):
            try:
                (self.dir / sub).rmdir()
            except FileNotFoundError:
                pass
        os.unlink(self.dir / "lock")
        try:
            self.dir.rmdir()
        except OSError as exc:   # another mount has just made it again: it is theirs now
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            return False
        durable.fsync_dir(self.dir.parent)
        return True

    # -- loading --------------------------------------------------------------

    def load(self) -> dict[str, ShardChanges]:
        """Read every shard's staged changes back from disk."""
        self.shards = {}
        shards_dir = self.dir / "shards"
        if not shards_dir.is_dir():
            return self.shards
        for sdir in sorted(shards_dir.iterdir()):
            meta_path = sdir / "meta.json"
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                continue
            ch = ShardChanges(relpath=meta["relpath"], sid=sdir.name, new=meta.get("new", False),
                              removed=meta.get("removed", False), compression=meta.get("compression", "NONE"),
                              kind=meta.get("kind", "example"), base=meta.get("base", {}))
            for p in _entries(sdir / "edit"):
                ch.edited.add(int(p.name))
            for p in _entries(sdir / "del"):
                ch.deleted.add(int(p.name))
            # A crash inside delete_record can leave a record both edited and deleted: deleted wins,
            # as it did for the call that returned (or was interrupted) last.
            ch.edited -= ch.deleted
            for p in _entries(sdir / "add"):
                ch.added[_read_added_name(p)] = p.name
            self.shards[ch.relpath] = ch
        self.shards = dict(sorted(self.shards.items()))   # in shard order, not by folder hash
        return self.shards

    def drop_all(self) -> int:
        """Drop everything staged (tfrfs discard, tfrfs umount --discard): every shard's journal and
        the scratch files and folders; the number of shards that had anything staged."""
        self.settle()
        staged = set()
        for top, holds in (("shards", _holds_changes), ("scratch", _holds_scratch)):
            folder = self.dir / top
            for sdir in sorted(folder.iterdir()) if folder.is_dir() else ():
                if holds(sdir):
                    staged.add(sdir.name)
                self._remove_tree(top, sdir.name)
        self.shards = {}
        return len(staged)

    # -- shard level ------------------------------------------------------------

    def shard(self, relpath: str, *, compression: str = "NONE", kind: str = "example",
              base: dict | None = None, new: bool = False) -> ShardChanges:
        """The changes of shard ``relpath``, created (durably) on first use."""
        ch = self.shards.get(relpath)
        if ch is None:
            self.settle()
            ch = ShardChanges(relpath=relpath, sid=shard_id(relpath), new=new, compression=compression,
                              kind=kind, base=base or {})
            if self.shard_dir(ch).exists():
                # Not loaded, so not current: a folder whose meta.json was never written, or the journal
                # of a commit that finished but could not be cleared. Edits must not join it.
                self._remove_tree("shards", ch.sid)
            try:
                self._write_meta(ch)
            except BaseException:
                if (self.shard_dir(ch) / "meta.json").exists():
                    self.shards[relpath] = ch     # on disk already: the next mount will show it
                raise
            self.shards[relpath] = ch
        return ch

    def shard_dir(self, ch: ShardChanges) -> Path:
        return self.dir / "shards" / ch.sid

    def _write_meta(self, ch: ShardChanges) -> None:
        sdir = self.shard_dir(ch)
        for sub in ("edit", "del", "add"):
            (sdir / sub).mkdir(parents=True, exist_ok=True)
        durable.fsync_dir(sdir)
        meta = {"relpath": ch.relpath, "new": ch.new, "removed": ch.removed, "compression": ch.compression,
                "kind": ch.kind, "base": ch.base}
        durable.write_file(sdir / "meta.json", json.dumps(meta).encode())
        durable.fsync_dir(sdir.parent)

    def _check_open(self, ch: ShardChanges) -> None:
        """Refuse new changes to a shard whose last commit failed after its rename: recovery would
        take the journal as committed and drop them with it. Committing again clears this."""
        if self.committing_path(ch).exists():
            raise Busy(f"{ch.relpath}: its last commit failed after the new shard file was put in place; "
                       "commit again (tfrfs commit) before changing it")

    def set_removed(self, ch: ShardChanges, removed: bool) -> None:
        with self._changing(ch):
            ch.removed = removed
            self._write_meta(ch)

    def drop_shard(self, relpath: str) -> None:
        """Forget everything staged for ``relpath`` (after its commit, or a discard)."""
        self.settle()   # an unfinished intent may still have to put files into this journal
        ch = self.shards.get(relpath)
        sid = ch.sid if ch else shard_id(relpath)
        # Scratch files first: a crash between the two then leaves the journal (which recovery
        # finishes), never scratch files of records that a commit has renumbered.
        self._remove_tree("scratch", sid)
        # Forgotten in memory once gone on disk, so a failure leaves both saying the same.
        self._remove_tree("shards", sid, gone=lambda: self.shards.pop(relpath, None))
        self.shards.pop(relpath, None)

    def set_aside(self, relpath: str) -> Path:
        """Move a shard's journal (and its scratch files) out of the staging folder, into
        ``conflicts/TIME-SID/`` beside it, whole (its edits no longer apply: the shard changed
        under them); where it went."""
        self.settle()
        ch = self.shards[relpath]
        dest = self.dir.parent / "conflicts" / f"{time.strftime('%Y%m%d-%H%M%S')}-{ch.sid}"
        dest.mkdir(parents=True)
        for top in ("shards", "scratch"):
            if (self.dir / top / ch.sid).exists():
                os.rename(self.dir / top / ch.sid, dest / top)
                durable.fsync_dir(self.dir / top)
        durable.fsync_dir(dest)
        durable.fsync_dir(dest.parent)
        self.shards.pop(relpath, None)
        return dest

    def _remove_tree(self, top: str, sid: str, gone: Callable[[], object] | None = None) -> None:
        path = self.dir / top / sid
        if path.exists():
            # Rename first, so a crash mid-delete never leaves a half-dropped journal.
            doomed = self.dir / "tmp" / f"drop-{top}-{sid}"
            if doomed.exists():
                shutil.rmtree(doomed)
            durable.rename(path, doomed)
            if gone is not None:
                gone()
            durable.fsync_dir(self.dir / top)
            shutil.rmtree(doomed, ignore_errors=True)

    # -- record level -------------------------------------------------------------

    @contextmanager
    def _changing(self, ch: ShardChanges) -> Iterator[None]:
        """Run one change of ``ch``; if it fails part way, make memory say what the disk now says,
        so the mount shows what the next mount would."""
        self.settle()
        self._check_open(ch)
        try:
            yield
        except BaseException:
            self._refresh(ch)
            raise

    def _refresh(self, ch: ShardChanges) -> None:
        sdir = self.shard_dir(ch)
        try:
            meta = json.loads((sdir / "meta.json").read_text())
            ch.removed = meta.get("removed", False)
        except (OSError, ValueError):
            pass
        ch.deleted = {int(p.name) for p in _entries(sdir / "del")}
        ch.edited = {int(p.name) for p in _entries(sdir / "edit")} - ch.deleted
        ch.added = {_read_added_name(p): p.name for p in _entries(sdir / "add")}

    def put_edit(self, ch: ShardChanges, index: int, data: bytes | Streamed) -> None:
        with self._changing(ch):
            durable.write_file(self.shard_dir(ch) / "edit" / str(index), data)
            ch.edited.add(index)

    def get_edit(self, ch: ShardChanges, index: int) -> bytes:
        return self.edit_path(ch, index).read_bytes()

    def edit_path(self, ch: ShardChanges, index: int) -> Path:
        """The file holding original record ``index``'s new bytes (all of it)."""
        return self.shard_dir(ch) / "edit" / str(index)

    def added_path(self, ch: ShardChanges, name: str) -> tuple[Path, int]:
        """The file holding added record ``name``, and where in it the record's bytes start."""
        path = self.shard_dir(ch) / "add" / ch.added[name]
        return path, 4 + len(name.encode("utf-8", "surrogateescape"))

    def delete_record(self, ch: ShardChanges, index: int) -> None:
        with self._changing(ch):
            durable.write_file(self.shard_dir(ch) / "del" / str(index), b"")
            # Deleted from here on (a del marker wins over an edit, see load); the edit file is tidied.
            ch.deleted.add(index)
            if index in ch.edited:
                ch.edited.discard(index)
                durable.unlink(self.shard_dir(ch) / "edit" / str(index))

    def put_added(self, ch: ShardChanges, name: str, data: bytes | Streamed) -> None:
        with self._changing(ch):
            fid = ch.added.get(name) or name_id(name)
            blob = added_blob(name, data) if isinstance(data, bytes) else data.prefixed(added_head(name))
            durable.write_file(self.shard_dir(ch) / "add" / fid, blob)
            ch.added[name] = fid

    def get_added(self, ch: ShardChanges, name: str) -> bytes:
        blob = (self.shard_dir(ch) / "add" / ch.added[name]).read_bytes()
        (n,) = struct.unpack_from("<I", blob)
        return blob[4 + n:]

    def remove_added(self, ch: ShardChanges, name: str) -> None:
        with self._changing(ch):
            durable.unlink(self.shard_dir(ch) / "add" / ch.added[name])
            del ch.added[name]

    # -- intents: one call, several files ---------------------------------------------

    def intent(self) -> Intent:
        return Intent(self.shard_dir)

    @property
    def _intent_path(self) -> Path:
        return self.dir / INTENT

    def run(self, intent: Intent) -> None:
        """Make every change of ``intent`` at once (see the module's docstring). If this raises, the
        call has happened when its intent was published (memory says so too; the files follow at the
        next change, commit or mount), and has not otherwise."""
        self.settle()
        for ch in intent.shards:
            self._check_open(ch)
        if not intent.ops:
            return
        try:
            prepare(intent, self.dir)
            durable.write_file(self._intent_path, intent.to_json(self.dir))
        except BaseException:
            # Only a failed fsync after the rename leaves it published; otherwise nothing happened.
            if not self._intent_path.exists():
                intent.discard_prepared()
                raise
        intent.published = True
        self._running = intent
        try:
            try:
                carry_out(intent.ops, self.dir)
            except OSError as exc:
                # Each step is idempotent: one more try keeps a passing error from leaving the
                # change half in place until the next change.
                log.warning("retrying a staged change after: %s", exc)
                carry_out(intent.ops, self.dir)
        finally:
            intent.note_in_memory()
        self._retire()

    def settle(self) -> None:
        """Finish a published intent whose steps did not all run (a crash, an I/O error)."""
        mine = self._running
        if mine is None and not self._intent_path.exists():
            return
        ops = mine.ops if mine is not None else self._read_intent()
        if ops is not None:
            carry_out(ops, self.dir)
        if mine is not None:
            mine.after()
        else:
            # Not ours (a journal loaded before it was finished): memory follows the disk.
            touched = {op.dst.relative_to(self.dir).parts[1] for op in ops or ()
                       if op.dst.relative_to(self.dir).parts[0] == "shards"}
            for ch in self.shards.values():
                if ch.sid in touched:
                    self._refresh(ch)
        # Raises if it cannot: no other change may start while an intent is on disk.
        self._retire(quiet=False)

    def _read_intent(self) -> list[Op] | None:
        try:
            return parse_intent(self._intent_path.read_bytes(), self.dir)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Published by one rename of a fsynced file, so this is damage from outside: nothing
            # can be finished safely from it.
            log.error("%s cannot be read (%s); the change it held is dropped", self._intent_path, exc)
            return None

    def _retire(self, *, quiet: bool = True) -> None:
        """Remove the finished intent. Running it again is harmless, so the call that made it need not
        fail if this does: the next change (``quiet=False``) removes it first."""
        try:
            durable.unlink(self._intent_path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if not quiet:
                raise
            log.warning("%s could not be removed yet (%s); it is removed before the next change",
                        self._intent_path, exc)
            return
        self._running = None

    # -- scratch files ---------------------------------------------------------------

    def scratch_dir(self, relpath: str, record: str) -> Path:
        return self.dir / "scratch" / shard_id(relpath) / name_id(record)

    def tmp_file(self) -> tuple[int, str]:
        """A new file for content being written through the mount."""
        return durable.mkstemp(self.dir / "tmp")

    # -- commit markers -----------------------------------------------------------------

    def committing_path(self, ch: ShardChanges) -> Path:
        return self.shard_dir(ch) / "committing"


def _holds_changes(sdir: Path) -> bool:
    """Whether a shard's journal folder stages any change."""
    try:
        meta = json.loads((sdir / "meta.json").read_text())
    except (OSError, ValueError):
        meta = {}
    return bool(meta.get("new") or meta.get("removed")) or any(
        any(_entries(sdir / sub)) for sub in ("edit", "del", "add"))


def _holds_scratch(sdir: Path) -> bool:
    """Whether a shard's scratch folder holds any of the user's files or folders (scratch/SID/RH/...;
    a record's folder there is left empty when its last scratch file goes)."""
    return any(rh.is_dir() and any(rh.iterdir()) for rh in sdir.iterdir())


def _entries(folder: Path) -> Iterator[Path]:
    if not folder.is_dir():
        return iter(())
    return (p for p in folder.iterdir() if not p.name.startswith(".tmp-"))


def _read_added_name(path: Path) -> str:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<I", f.read(4))
        return f.read(n).decode("utf-8", "surrogateescape")
