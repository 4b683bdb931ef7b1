"""Durable staged edits: the journal a writable mount keeps beside the shards.

Everything lives under ``ROOT/.tfrfs-staging/`` on the shards' own filesystem,
one folder per shard (named by a hash of its path relative to SOURCE)::

    lock                     flock-ed by the one writable mount
    shards/SID/meta.json     {"relpath", "new", "removed", "compression", "kind", "base": {...}}
    shards/SID/edit/N        new bytes of original record N (a serialized Example)
    shards/SID/del/N         marker: original record N is deleted
    shards/SID/add/H         an added record: u32 name length, UTF-8 name, record bytes
    shards/SID/committing    written just before the new shard file replaces the old one
    scratch/SID/RH/...       the user's scratch files (editor swap and backup files)
    tmp/                     files being written through the mount, until close

Each change is one small file written beside its final name, fsynced, renamed
into place and the folder fsynced, so once the call that made it returns the
change survives a crash; a half-written change is only ever a ``.tmp-`` file,
ignored and removed at the next mount.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import struct
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from . import durable
from .errors import Busy
from .index import STAGING_DIR


def shard_id(relpath: str) -> str:
    return hashlib.sha256(relpath.encode("utf-8", "surrogateescape")).hexdigest()[:24]


def name_id(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:32]


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
        self._lock_fd: int | None = None
        self.shards: dict[str, ShardChanges] = {}

    # -- lifetime -------------------------------------------------------------

    def exists(self) -> bool:
        return (self.dir / "shards").is_dir()

    def acquire(self) -> None:
        """Take the single-writer lock; raises Busy when another writable mount holds it."""
        self.dir.mkdir(exist_ok=True)
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Busy(f"{self.dir.parent} is already mounted writable by another tfrfs process") from None
        self._lock_fd = fd
        for sub in ("shards", "scratch", "tmp"):
            (self.dir / sub).mkdir(exist_ok=True)
        durable.fsync_dir(self.dir)
        durable.fsync_dir(self.dir.parent)   # the journal's own entry beside the shards
        # Files being written when a daemon died were never closed: nothing promised them. Folders
        # here are journals a crash interrupted while dropping them (see drop_shard).
        for leftover in (self.dir / "tmp").iterdir():
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover)
            else:
                leftover.unlink()
        # Half-written journal files (a crash inside durable.write_file) are only ever .tmp- files.
        for sdir in (self.dir / "shards").iterdir():
            for folder in (sdir, sdir / "edit", sdir / "del", sdir / "add"):
                for p in folder.glob(".tmp-*") if folder.is_dir() else ():
                    p.unlink()

    def is_locked(self) -> bool:
        """Whether another process holds the writer lock now."""
        try:
            fd = os.open(self.dir / "lock", os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

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

    # -- shard level ------------------------------------------------------------

    def shard(self, relpath: str, *, compression: str = "NONE", kind: str = "example",
              base: dict | None = None, new: bool = False) -> ShardChanges:
        """The changes of shard ``relpath``, created (durably) on first use."""
        ch = self.shards.get(relpath)
        if ch is None:
            ch = ShardChanges(relpath=relpath, sid=shard_id(relpath), new=new, compression=compression,
                              kind=kind, base=base or {})
            if self._sdir(ch).exists():
                # Not loaded, so not current: a folder whose meta.json was never written, or the journal
                # of a commit that finished but could not be cleared. Edits must not join it.
                self._remove_tree("shards", ch.sid)
            try:
                self._write_meta(ch)
            except BaseException:
                if (self._sdir(ch) / "meta.json").exists():
                    self.shards[relpath] = ch     # on disk already: the next mount will show it
                raise
            self.shards[relpath] = ch
        return ch

    def _sdir(self, ch: ShardChanges) -> Path:
        return self.dir / "shards" / ch.sid

    def _write_meta(self, ch: ShardChanges) -> None:
        sdir = self._sdir(ch)
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
        ch = self.shards.get(relpath)
        sid = ch.sid if ch else shard_id(relpath)
        # Scratch files first: a crash between the two then leaves the journal (which recovery
        # finishes), never scratch files of records that a commit has renumbered.
        self._remove_tree("scratch", sid)
        # Forgotten in memory once gone on disk, so a failure leaves both saying the same.
        self._remove_tree("shards", sid, gone=lambda: self.shards.pop(relpath, None))
        self.shards.pop(relpath, None)

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
        self._check_open(ch)
        try:
            yield
        except BaseException:
            self._refresh(ch)
            raise

    def _refresh(self, ch: ShardChanges) -> None:
        sdir = self._sdir(ch)
        try:
            meta = json.loads((sdir / "meta.json").read_text())
            ch.removed = meta.get("removed", False)
        except (OSError, ValueError):
            pass
        ch.deleted = {int(p.name) for p in _entries(sdir / "del")}
        ch.edited = {int(p.name) for p in _entries(sdir / "edit")} - ch.deleted
        ch.added = {_read_added_name(p): p.name for p in _entries(sdir / "add")}

    def put_edit(self, ch: ShardChanges, index: int, data: bytes) -> None:
        with self._changing(ch):
            durable.write_file(self._sdir(ch) / "edit" / str(index), data)
            ch.edited.add(index)

    def get_edit(self, ch: ShardChanges, index: int) -> bytes:
        return (self._sdir(ch) / "edit" / str(index)).read_bytes()

    def delete_record(self, ch: ShardChanges, index: int) -> None:
        with self._changing(ch):
            durable.write_file(self._sdir(ch) / "del" / str(index), b"")
            # Deleted from here on (a del marker wins over an edit, see load); the edit file is tidied.
            ch.deleted.add(index)
            if index in ch.edited:
                ch.edited.discard(index)
                durable.unlink(self._sdir(ch) / "edit" / str(index))

    def put_added(self, ch: ShardChanges, name: str, data: bytes) -> None:
        with self._changing(ch):
            fid = ch.added.get(name) or name_id(name)
            raw = name.encode("utf-8", "surrogateescape")
            durable.write_file(self._sdir(ch) / "add" / fid, struct.pack("<I", len(raw)) + raw + data)
            ch.added[name] = fid

    def get_added(self, ch: ShardChanges, name: str) -> bytes:
        blob = (self._sdir(ch) / "add" / ch.added[name]).read_bytes()
        (n,) = struct.unpack_from("<I", blob)
        return blob[4 + n:]

    def remove_added(self, ch: ShardChanges, name: str) -> None:
        with self._changing(ch):
            durable.unlink(self._sdir(ch) / "add" / ch.added[name])
            del ch.added[name]

    # -- scratch files ---------------------------------------------------------------

    def scratch_dir(self, relpath: str, record: str) -> Path:
        return self.dir / "scratch" / shard_id(relpath) / name_id(record)

    def tmp_file(self) -> tuple[int, str]:
        """A new file for content being written through the mount."""
        return durable.mkstemp(self.dir / "tmp")

    # -- commit markers -----------------------------------------------------------------

    def committing_path(self, ch: ShardChanges) -> Path:
        return self._sdir(ch) / "committing"


def _entries(folder: Path) -> Iterator[Path]:
    if not folder.is_dir():
        return iter(())
    return (p for p in folder.iterdir() if not p.name.startswith(".tmp-"))


def _read_added_name(path: Path) -> str:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<I", f.read(4))
        return f.read(n).decode("utf-8", "surrogateescape")
