"""One place that assembles a mount, and the results of what a mount is asked to do.

``open_mount`` has the dataset factory (``factory.open_dataset``) find SOURCE's shards and index
them, and (``writable``) takes the source's lock, loads the staged changes and recovers an
interrupted commit before the factory makes the record store with them as its overlay; then it
builds the namespace and the editors. The FUSE adapter serves the ``Mount`` it returns (and keeps
the daemon's mount record); the command line and the crash tests use the same function.
``commit``, ``status`` and ``discard`` return small result values; only the command line prints
them.

How a writable mount ends (SPEC 7): ``finish`` commits only when the kernel unmounted it
(``fusermount3 -u``, ``umount``, ``tfrfs umount``), or drops the staged edits when asked to
(``tfrfs umount --discard`` writes ``discard`` to ``.tfrfs/commit`` first); a stop signal
(SIGTERM, Ctrl-C) leaves them staged for ``tfrfs commit SOURCE`` or the next mount.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import threading
from pathlib import Path
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

from tfrfs.jobs import runner as jobs
from tfrfs.edit import bucket_commit, repack
from tfrfs.edit.commit import CommitResult, Committer, PendingShard, WriteJobs, pending_of
from tfrfs.errors import Busy, UsageError
from tfrfs.storage.factory import open_storage
from tfrfs.index.shard_index import IndexCache, IndexProgress, ShardIndex
from tfrfs.index.discovery import Discovery, discover
from tfrfs.view.nodes import MetaFile
from tfrfs.view.problems import Rejected
from tfrfs.storage.readers import Readers
from tfrfs.view.records import RecordStore
from tfrfs.edit.repack import CommitFailed
from tfrfs.index.memory import IndexMemory
from tfrfs.dataset.factory import open_dataset
from tfrfs.dataset.sources import Source, open_source
from tfrfs.edit.journal import Staging
from tfrfs.edit.overlay import EditSession
from tfrfs.view.tree import Tree
from tfrfs.index.where import Where

if TYPE_CHECKING:   # the editors are loaded by writable mounts only (see open_mount)
    from tfrfs.edit.feature_files import FileEditor
    from tfrfs.edit.folders import FolderEditor
    from tfrfs.edit.rename import Renamer

log = logging.getLogger("tfrfs")

__all__ = ["CommitResult", "DiscardResult", "Mount", "PendingShard", "StatusResult", "commit_source", "discard",
           "open_mount", "pending_of", "source_root", "staged_in", "writable_holder"]


@dataclass(frozen=True)
class StatusResult:
    writable: bool
    pending: tuple[PendingShard, ...] = ()
    last_commit: CommitResult | None = None
    rejected: tuple[Rejected, ...] = ()       # the last writes refused, oldest first
    source: str = ""
    pid: int = 0
    committing: bool = False   # a commit runs now (changes are refused until it is over)

    def to_json(self) -> dict:
        return {"pending": [asdict(p) for p in self.pending],
                "last_commit": self.last_commit.to_json() if self.last_commit else {},
                "rejected": [asdict(r) for r in self.rejected], "source": self.source, "pid": self.pid,
                "committing": self.committing}


@dataclass(frozen=True)
class DiscardResult:
    shards: int     # shards whose staged changes were dropped


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
    committer: Committer | None = None
    discard_at_unmount: bool = False   # tfrfs umount --discard asked for it (see ``control``)
    mountpoint: str | None = None      # where it is served (``attach``)
    # Held by every request of a writable mount, and by its commit while it puts a shard in place.
    guard: threading.RLock = field(default_factory=threading.RLock)

    @property
    def last_commit(self) -> CommitResult | None:
        return self.committer.last if self.committer is not None else None

    @property
    def store(self) -> RecordStore:
        return self.tree.store

    @property
    def writable(self) -> bool:
        return self.staging is not None

    @property
    def source_name(self) -> str:
        """SOURCE as given, made absolute when local: what to name in a message to run later."""
        name = self.source.name
        return name if self.source.local_root is None else os.path.abspath(name)

    def status(self) -> StatusResult:
        if self.staging is None:
            return StatusResult(False, source=self.source_name, pid=os.getpid())
        return StatusResult(True, pending_of(self.staging), self.last_commit,
                            tuple(self.tree.errors.rejected), self.source_name, os.getpid(),
                            self.committer is not None and self.committer.running)

    def attach(self, mountpoint: str) -> None:
        """Note that this mount is served at ``mountpoint`` (the FUSE side keeps the daemon's
        record of it): the lock names it, and a writable mount readies its schema."""
        self.mountpoint = mountpoint
        if self.staging is not None:
            self.staging.lock.note_holder(mountpoint=mountpoint, source=self.source_name)
            # The kind of a key new to the dataset needs the schema: have it ready by the first edit.
            self.tree.schema.build_in_background()
        elif self.source.local_root is not None:
            staged = staged_in(self.discovery.root)
            if staged:
                log.warning("%s has staged edits that this read-only mount does not show (%s): mount it "
                            "--rw to see them, or tfrfs commit / tfrfs discard it", self.source_name,
                            ", ".join(p.shard for p in staged))

    def control(self, text: bytes) -> None:
        """What is written to ``.tfrfs/commit``: ``discard`` (drop the staged edits at unmount
        instead of committing them), ``keep`` (commit at unmount again), else commit now."""
        word = text.strip().decode("utf-8", "replace")
        if word == "discard":
            self.discard_at_unmount = True
            log.info("the staged edits are dropped at unmount (tfrfs umount --discard)")
        elif word == "keep":
            self.discard_at_unmount = False
        elif self.committer is not None:
            # On a thread of its own: the mount keeps answering meanwhile (see edit.commit), and
            # tfrfs commit waits for its result in .tfrfs/commit.
            self.committer.start(self.write_jobs(None))

    def busy(self) -> str | None:
        """Why the mount takes no change now (a commit runs), or None."""
        return self.committer.busy() if self.committer is not None else None

    def finish(self, unmounted: bool, why: str) -> None:
        """The end of a writable mount: commit when the kernel unmounted it (``unmounted``), or drop
        the staged edits when ``tfrfs umount --discard`` asked; else (a stop signal: ``why`` says
        which) leave them staged. Failures are logged: the daemon is ending."""
        staging = self.staging
        if staging is None:
            return
        if self.committer is not None:
            self.committer.wait()   # a commit still running ends first, however the mount ends
        if unmounted and self.discard_at_unmount:
            try:
                n = staging.drop_all()
            except OSError as exc:
                log.error("discarding the staged edits at unmount failed (%s); they stay staged: "
                          "tfrfs discard %s", exc, self.source_name)
                return
            log.info("unmounted: the staged edits of %d shard(s) are discarded", n)
            return
        if unmounted:
            try:
                self.commit()
            except CommitFailed as exc:
                log.error("commit at unmount failed, edits stay staged: %s", exc)
            return
        pending = pending_of(staging)
        if pending:
            log.warning("%s: %d shard(s)' edits stay staged (%s); tfrfs commit %s or mount again",
                        why, len(pending), ", ".join(p.shard for p in pending), self.source_name)
        else:
            log.info("%s: nothing was staged", why)

    def commit(self, runner: jobs.Runner | None = None) -> CommitResult:
        """Write every changed shard anew, here and now: each new file by a shard job on ``runner``
        (here, one after the other, without one: as inside the daemon), each put in place in shard
        order. Raises CommitFailed; what finished before stays committed."""
        if self.committer is None:
            return CommitResult(True)
        self.committer.wait()   # one started by .tfrfs/commit ends first
        return self.committer.commit(self.write_jobs(runner))

    def write_jobs(self, runner: jobs.Runner | None) -> WriteJobs:
        where = Where.of(self.source)

        def write_jobs(plans: list[repack.ShardPlan]) -> Iterator[repack.Written]:
            from tfrfs.jobs.shard_work import gather
            return gather(runner or jobs.InProcess(), repack.write_job, [(where, plan) for plan in plans])
        return write_jobs

    def close(self) -> None:
        if self.committer is not None:
            self.committer.wait()   # it reads through the tree
        self.tree.close()   # and with it the record store and its shard readers
        if self.staging is not None:
            self.staging.release()   # and with nothing staged, the staging folder goes


def open_mount(source: str | Source, *, writable: bool = False, records: str | None = None, decode_raw: bool = True,
               cache_dir: str | None = None, readers: Readers | None = None,
               progress: IndexProgress | None = None, index_dir: str | None = None,
               memory: IndexMemory | None = None, runner: jobs.Runner | None = None,
               indexed: tuple[list[ShardIndex], IndexCache] | None = None) -> Mount:
    """Assemble a mount of ``source`` (a path, glob or URL, or a ``Source`` already opened;
    ``indexed``: its shards, already indexed; else indexed by ``open_dataset`` with
    ``progress``, ``index_dir``, ``memory`` and ``runner``). Raises UsageError (bad SOURCE,
    ``writable`` with a remote one) or Busy (another writable mount holds the source)."""
    src = source if isinstance(source, Source) else open_source(source, cache_dir=cache_dir, readers=readers)
    if writable and src.local_root is None:
        _check_bucket(src)
    log.info("shards are read through the %s shard reader", src.readers.name)
    disc = src.discovery
    held: list[Staging] = []
    base: list[bucket_commit.Base] = []

    def staged_edits(_: Source) -> EditSession | None:
        """A writable mount's edits, once the shards are indexed: the source's lock taken, the
        staged changes loaded, an interrupted commit recovered (and, of a bucket, the edits of
        shards another writer's commit changed set aside)."""
        if not writable:
            return None
        staging = Staging(staging_root(src))
        staging.acquire()
        held.append(staging)
        staging.load()
        if src.local_root is not None:
            lines = repack.recover(disc.root, staging)
        else:
            base.append(_bucket_base(src))
            lines = bucket_commit.recover(staging, src.storage, disc.root, base[0])
            staging.load()
            lines += bucket_commit.rebase(staging, {s.relpath: s for s in disc.shards})
        for line in lines:
            log.warning("recovery: %s", line)
        staging.load()
        return EditSession(staging)
    try:
        parts = open_dataset(src, progress=progress, index_dir=index_dir, memory=memory, runner=runner,
                             indexed=indexed, records=records, decode_raw=decode_raw, overlay=staged_edits,
                             writable=writable)
        staging = held[0] if held else None
        session = parts.store.overlay
        if isinstance(session, EditSession):
            session.attach(parts.store)
        tree = Tree(disc, parts.store, parts.schema)
        if src.manifest is not None and src.local_root is not None and staging is None:
            from tfrfs.view.folder_check import FolderCheck
            tree.check_folders(FolderCheck(tree, parts.cache))
        mount = Mount(disc, tree, parts.cache, src, staging)
        if staging is not None:
            mount.committer = Committer(tree, staging, parts.cache, Where.of(src), mount.guard) if not base else \
                bucket_commit.BucketCommitter(tree, staging, parts.cache, Where.of(src), mount.guard,
                                              storage=src.storage, base=base[0])
            # Imported here: a read-only mount (and every command but mount --rw) does without them.
            from tfrfs.edit.feature_files import FileEditor
            from tfrfs.edit.folders import FolderEditor
            from tfrfs.edit.rename import Renamer
            from tfrfs.edit.stager import Stager
            assert isinstance(session, EditSession)
            stager = Stager(tree, session)
            mount.files = FileEditor(stager, mount.control)
            mount.files.busy = mount.busy
            mount.folders = FolderEditor(stager)
            mount.renames = Renamer(stager)
            _add_write_meta(mount)
    except BaseException:
        for staging in held:
            staging.release()
        raise
    return mount


def staging_root(src: Source) -> str:
    """Where a source's edits are staged: beside its shards, or (a bucket's) in the cache folder,
    keyed by its URL (SPEC 7.1)."""
    if src.local_root is not None:
        return src.discovery.root
    root = bucket_commit.staging_root(src.name, src.cache_dir)
    bucket_commit.note_source(root, src.name)
    return str(root)


def _check_bucket(src: Source) -> None:
    """That a source in a store can take edits: a prefix (a dataset's root) in a store that writes
    on a condition (SPEC 7.1). Raises UsageError."""
    if not src.storage.writable:
        raise UsageError(f"{src.name}: a web server's files are read-only; mount it without --rw")
    if not src.discovery.mirrors_dir:
        raise UsageError(f"{src.name}: edits in a bucket are committed through the dataset's manifest at its "
                         "root: mount the prefix, not one object or a glob")


def _bucket_base(src: Source) -> bucket_commit.Base:
    """The manifest version a writable bucket mount starts from: the one its shards were found
    from (read again with its identity; if a commit came between, the mount starts again)."""
    got = bucket_commit.read_base(src.storage, src.discovery.root)
    found = src.manifest
    same = (found is None and got.body is None) or (
        found is not None and got.body is not None and
        [(e.path, e.identity) for e in found.shards] ==
        [(e["path"], e["identity"]) for e in got.body.get("shards", ())])
    if found is None and got.body is not None:
        raise UsageError(f"{src.name}: its edits are committed through its manifest: open it from the manifest "
                         "(without --no-manifest)")
    if not same:
        raise UsageError(f"{src.name}: another writer committed to it while it was being mounted; mount it again")
    return got


def _add_write_meta(mount: Mount) -> None:
    """``.tfrfs/status`` (pending changes) and ``.tfrfs/commit`` (write to it to commit; it holds
    the last commit's result)."""
    def status() -> bytes:
        return (json.dumps(mount.status().to_json(), indent=2, ensure_ascii=False) + "\n").encode()

    def commit() -> bytes:
        # "commits" (started so far) and "running" tell tfrfs commit when the one it started is over.
        committer = mount.committer
        assert committer is not None
        result = committer.last.to_json() if committer.last else {}
        result.update(commits=committer.started, running=committer.running)
        return (json.dumps(result, ensure_ascii=False) + "\n").encode()
    mount.tree.meta.children["status"] = MetaFile("status", status)
    mount.tree.meta.children["commit"] = MetaFile("commit", commit)


def discard(source: str, cache_dir: str | None = None) -> DiscardResult:
    """Drop every staged change of SOURCE (not mounted writable: raises UsageError then)."""
    staging = Staging(source_root(source, cache_dir))
    if not staging.dir.is_dir():
        return DiscardResult(0)
    with _locking(staging, busy=lambda where: f"{source} is mounted writable{where}: to drop its edits, "
                                              "tfrfs umount --discard MOUNTPOINT",
                  refused=lambda reason: f"{staging.dir}: {reason}: cannot change the staged edits"):
        staging.acquire()
    try:
        return DiscardResult(staging.drop_all())
    finally:
        staging.release()


def commit_source(source: Source, indexed: tuple[list[ShardIndex], IndexCache] | None = None,
                  runner: jobs.Runner | None = None, *, progress: IndexProgress | None = None,
                  index_dir: str | None = None, memory: IndexMemory | None = None) -> CommitResult:
    """Commit the staged edits of a SOURCE that is not mounted (after a crash, or a stop by a
    signal), by the code a mount commits with, the new shard files written by shard jobs on
    ``runner``. Raises UsageError while it is mounted writable, CommitFailed (the edits stay
    staged)."""
    with _locking(Staging(source.discovery.root),
                  busy=lambda where: f"{source.name} is mounted writable{where}: commit it there "
                                     "(tfrfs commit MOUNTPOINT)",
                  refused=lambda reason: f"{source.discovery.root}: {reason}: cannot commit there"):
        m = open_mount(source, writable=True, indexed=indexed, runner=runner, progress=progress,
                       index_dir=index_dir, memory=memory)
    try:
        return m.commit(runner)
    finally:
        m.close()


_NOT_ALLOWED = (errno.EACCES, errno.EPERM, errno.EROFS)


@contextlib.contextmanager
def _locking(staging: Staging, *, busy: Callable[[str], str], refused: Callable[[str], str]) -> Iterator[None]:
    """Taking ``staging``'s lock, failures as a UsageError: ``busy(where)`` (the mount holding it)
    when another writable mount holds it, ``refused(reason)`` when this user may not."""
    try:
        yield
    except Busy as exc:
        raise UsageError(busy(_where(staging))) from exc
    except OSError as exc:
        if exc.errno not in _NOT_ALLOWED:
            raise
        raise UsageError(refused(exc.strerror or str(exc))) from exc


def _where(staging: Staging) -> str:
    where = staging.lock.holder().get("mountpoint")
    return f" at {where}" if where else ""


def staged_in(source: str, cache_dir: str | None = None) -> tuple[PendingShard, ...]:
    """What is staged for SOURCE, read from its journal (it need not be mounted)."""
    staging = Staging(source_root(source, cache_dir))
    staging.load()
    return pending_of(staging)


def unfinished_commit(source: str, cache_dir: str | None = None) -> bool:
    """Whether a commit of SOURCE (a bucket's) stopped after its manifest was written and before
    it was done: ``tfrfs commit SOURCE`` (or the next mount) finishes it."""
    return (Path(Staging(source_root(source, cache_dir)).dir) / bucket_commit.RECORD).exists()


def writable_holder(source: str, cache_dir: str | None = None) -> dict:
    """Who mounts SOURCE writable now ({"pid", "mountpoint", "source"}), or {} when nobody does."""
    staging = Staging(source_root(source, cache_dir))
    return (staging.lock.holder() or {"pid": None}) if staging.lock.is_locked() else {}


def source_root(source: str, cache_dir: str | None = None) -> str:
    """The folder a SOURCE's staged changes live in: its own, or (a bucket prefix) one in the
    cache folder (``cache_dir``, else the default one) keyed by its URL."""
    storage = open_storage(source)
    if storage.local_path(source) is None:
        if not storage.writable:
            raise UsageError(f"{source}: a web server's files are read-only: nothing is ever staged for them")
        from tfrfs.index.cache_dir import default_cache_dir
        return str(bucket_commit.staging_root(source, Path(cache_dir) if cache_dir else default_cache_dir()))
    if os.path.isdir(source):
        return os.path.abspath(source)
    return discover(source).root
