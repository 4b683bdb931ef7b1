"""One place that assembles a mount, and the results of what a mount is asked to do.

``open_mount`` finds SOURCE's shards, indexes them, and (``writable``) takes the source's lock,
loads the staged changes and recovers an interrupted commit; then it builds the record store, the
namespace and the editors. The FUSE adapter serves the ``Mount`` it returns; the command line,
the crash tests and the library use the same function. ``commit``, ``status`` and ``discard``
return small result values; only the command line prints them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from . import repack, tfds
from .errors import UsageError
from .remote import is_url
from .index import Discovery, IndexCache, IndexProgress, ShardFile, ShardIndex, discover, local_identity
from .nodes import MetaFile, PlainFile
from .readers import Readers, default_readers
from .records import RecordStore
from .repack import CommitFailed, ShardResult
from .schema import Schema
from .sources import Source, index_source, open_source
from .staging import ShardChanges, Staging
from .tree import Tree

if TYPE_CHECKING:   # the editors are loaded by writable mounts only (see open_mount)
    from .edit import FileEditor
    from .folders import FolderEditor
    from .rename import Renamer

log = logging.getLogger("tfrfs")



@dataclass(frozen=True)
class PendingShard:
    """What is staged for one shard."""

    shard: str
    new: bool
    removed: bool
    edited: int
    deleted: int
    added: int


@dataclass(frozen=True)
class CommitResult:
    ok: bool
    shards: tuple[ShardResult, ...] = ()
    seconds: float = 0.0
    error: str | None = None
    notes: tuple[str, ...] = ()   # what else the commit did or could not do (TFDS metadata), one line each

    def to_json(self) -> dict:
        if not self.ok:
            return {"ok": False, "error": self.error, "done": [r.relpath for r in self.shards]}
        return {"ok": True, "shards": [asdict(r) for r in self.shards], "seconds": self.seconds,
                "notes": list(self.notes)}


@dataclass(frozen=True)
class StatusResult:
    writable: bool
    pending: tuple[PendingShard, ...] = ()
    last_commit: CommitResult | None = None

    def to_json(self) -> dict:
        return {"pending": [asdict(p) for p in self.pending],
                "last_commit": self.last_commit.to_json() if self.last_commit else {}}


@dataclass(frozen=True)
class DiscardResult:
    shards: int     # shards whose staged changes were dropped


def pending_of(staging: Staging) -> tuple[PendingShard, ...]:
    """The shards with staged changes, in path order."""
    return tuple(_pending(ch) for _, ch in sorted(staging.shards.items()) if not ch.empty)


def _pending(ch: ShardChanges) -> PendingShard:
    return PendingShard(ch.relpath, ch.new, ch.removed, len(ch.edited), len(ch.deleted), len(ch.added))


@dataclass(eq=False)
class Mount:
    """A mounted (or mountable) dataset: its records, its namespace and, writable, its editors."""

    discovery: Discovery
    tree: Tree
    cache: IndexCache
    source: Source
    staging: Staging | None = None
    files: FileEditor | None = None
    folders: FolderEditor | None = None
    renames: Renamer | None = None
    last_commit: CommitResult | None = field(default=None)

    @property
    def store(self) -> RecordStore:
        return self.tree.store

    @property
    def writable(self) -> bool:
        return self.staging is not None

    def status(self) -> StatusResult:
        if self.staging is None:
            return StatusResult(False)
        return StatusResult(True, pending_of(self.staging), self.last_commit)

    def commit(self) -> CommitResult:
        """Write every changed shard anew. Raises CommitFailed; what finished before stays committed."""
        staging = self.staging
        if staging is None:
            return CommitResult(True)
        done: list[ShardResult] = []
        started = time.monotonic()
        self.tree.schema.forget()   # the shards are about to change
        store = self.store
        for relpath, ch in sorted(staging.shards.items()):
            if ch.empty:
                staging.drop_shard(relpath)
                continue
            n = store.shard_number(relpath)
            idx = store.shards[n] if n is not None else None
            reader = store.reader(n) if n is not None else None
            log.info("committing %s (%d edited, %d deleted, %d added%s)", relpath, len(ch.edited), len(ch.deleted),
                     len(ch.added), ", removed" if ch.removed else ", new" if ch.new else "")
            try:
                result = repack.commit_shard(self.discovery.root, ch, idx, reader, staging)
            except CommitFailed as exc:
                log.error("%s", exc)
                self.last_commit = CommitResult(False, tuple(done), error=str(exc), notes=self._follow_tfds(done))
                raise
            done.append(result)
            if n is not None:
                if result.action == "removed":
                    self.tree.hide_shard(n)
                else:
                    self._reload(n, relpath)
            log.info("committed %s: %s, %d records, %d bytes", relpath, result.action, result.records, result.bytes)
        notes = self._follow_tfds(done)
        self.last_commit = CommitResult(True, tuple(done), round(time.monotonic() - started, 3), notes=notes)
        return self.last_commit

    def _follow_tfds(self, done: list[ShardResult]) -> tuple[str, ...]:
        """A TFDS ``dataset_info.json`` beside committed shards follows them: not a failure of the
        commit, what it did or could not do are notes. The mount then shows the new file."""
        notes = tfds.after_commit(self.discovery.root, self.store.shards, [r.relpath for r in done])
        for note in notes:
            log.info("%s", note)
        for rel in {os.path.join(os.path.dirname(r.relpath), tfds.INFO) for r in done}:
            parent = self.tree.dirs.get(os.path.dirname(rel))
            if parent is not None and isinstance(parent.children.get(tfds.INFO), PlainFile):
                try:
                    parent.children[tfds.INFO] = PlainFile(rel, *self.discovery.access.plain_stat(rel))
                except OSError:   # gone from under the mount: it is shown as it was
                    pass
        return tuple(notes)

    def _reload(self, n: int, relpath: str) -> None:
        path = os.path.join(self.discovery.root, relpath)
        st = os.stat(path)
        old = self.store.shards[n].shard
        shard = ShardFile(path=os.path.abspath(path), relpath=relpath, compression=old.compression,
                          size=st.st_size, mtime_ns=st.st_mtime_ns, identity=local_identity(st))
        idx, _ = self.cache.get(shard)
        self.tree.replace_shard(n, idx)

    def close(self) -> None:
        self.tree.close()   # and with it the record store and its shard readers
        if self.staging is not None:
            self.staging.release()


def open_mount(source: str | Source, *, writable: bool = False, records: str | None = None, decode_raw: bool = True,
               cache_dir: str | None = None, readers: Readers | None = None,
               progress: IndexProgress | None = None, index_dir: str | None = None,
               indexed: tuple[list[ShardIndex], IndexCache] | None = None) -> Mount:
    """Assemble a mount of ``source`` (a path, glob or URL, or a ``Source`` already opened;
    ``indexed``: its shards, already indexed). Raises UsageError (bad SOURCE, ``writable`` with a
    remote one) or Busy (another writable mount holds the source)."""
    src = source if isinstance(source, Source) else open_source(source, cache_dir=cache_dir, readers=readers)
    if writable and src.remote:
        raise UsageError(f"{src.name}: a remote source is read-only; mount it without --rw")
    readers = src.readers
    log.info("shards are read through the %s shard reader", readers.name)
    indexes, cache = indexed or index_source(src, progress, index_dir)
    disc = src.discovery
    staging = None
    if writable:
        staging = Staging(disc.root)
        staging.acquire()
    try:
        if staging is not None:
            staging.load()
            for line in repack.recover(disc.root, staging):
                log.warning("recovery: %s", line)
            staging.load()
        store = RecordStore(indexes, readers, records=records, decode_raw=decode_raw, writable=writable,
                            staging=staging, on_bad=cache.save)
        tree = Tree(disc, store, Schema(store))
        mount = Mount(disc, tree, cache, src, staging)
        if staging is not None:
            # Imported here: a read-only mount (and every command but mount --rw) does without them.
            from .edit import FileEditor
            from .folders import FolderEditor
            from .rename import Renamer
            from .stager import Stager
            stager = Stager(tree, staging)
            mount.files = FileEditor(stager, mount.commit)
            mount.folders = FolderEditor(stager)
            mount.renames = Renamer(stager)
            _add_write_meta(mount)
    except BaseException:
        if staging is not None:
            staging.release()
        raise
    return mount


def _add_write_meta(mount: Mount) -> None:
    """``.tfrfs/status`` (pending changes) and ``.tfrfs/commit`` (write to it to commit; it holds
    the last commit's result)."""
    def status() -> bytes:
        return (json.dumps(mount.status().to_json(), indent=2, ensure_ascii=False) + "\n").encode()

    def commit() -> bytes:
        result = mount.last_commit.to_json() if mount.last_commit else {}
        return (json.dumps(result, ensure_ascii=False) + "\n").encode()
    mount.tree.meta.children["status"] = MetaFile("status", status)
    mount.tree.meta.children["commit"] = MetaFile("commit", commit)


def discard(source: str) -> DiscardResult:
    """Drop every staged change of SOURCE (not mounted writable)."""
    staging = Staging(source_root(source))
    if staging.is_locked():
        raise UsageError(f"{source} is mounted writable: unmount it first (tfrfs umount commits; "
                         "to drop the edits instead, kill the daemon, then discard)")
    shards = [relpath for relpath, ch in staging.load().items()]
    for relpath in shards:
        staging.drop_shard(relpath)
    return DiscardResult(len(shards))


def staged_in(source: str) -> tuple[PendingShard, ...]:
    """What is staged for SOURCE, read from its journal (it need not be mounted)."""
    staging = Staging(source_root(source))
    staging.load()
    return pending_of(staging)


def source_root(source: str) -> str:
    """The folder a SOURCE's staged changes live in."""
    if is_url(source):
        raise UsageError(f"{source}: a remote source is read-only: nothing is ever staged for it")
    if os.path.isdir(source):
        return os.path.abspath(source)
    return discover(source).root
