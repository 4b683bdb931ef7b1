"""One place that assembles a mount, and the results of what a mount is asked to do.

``open_mount`` finds SOURCE's shards, indexes them, and (``writable``) takes the source's lock,
loads the staged changes and recovers an interrupted commit; then it builds the record store, the
namespace and the editors. The FUSE adapter serves the ``Mount`` it returns; the command line,
the crash tests and the library use the same function. ``commit``, ``status`` and ``discard``
return small result values; only the command line prints them.

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
import mmap
import os
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

from tfrfs.jobs import runner as jobs
from tfrfs.index import manifest
from tfrfs.fuse import mountrecord
from tfrfs.edit import mutate
from tfrfs.edit import repack
from tfrfs.index import tfds_info as tfds
from tfrfs.errors import Busy, UsageError
from tfrfs.storage.fsspec_store import is_url
from tfrfs.index.shard_index import Discovery, IndexCache, IndexProgress, ShardFile, ShardIndex, discover, local_identity
from tfrfs.view.nodes import MetaFile, PlainFile
from tfrfs.view.problems import Rejected
from tfrfs.storage.readers import Readers
from tfrfs.view.records import RecordStore
from tfrfs.edit.repack import CommitFailed, ShardResult
from tfrfs.view.schema import Schema
from tfrfs.index.shardschema import Tally
from tfrfs.dataset.sources import Source, index_source, open_source
from tfrfs.edit.journal import ShardChanges, Staging
from tfrfs.view.tree import Tree

if TYPE_CHECKING:   # the editors are loaded by writable mounts only (see open_mount)
    from tfrfs.edit.feature_files import FileEditor
    from tfrfs.edit.folders import FolderEditor
    from tfrfs.edit.rename import Renamer

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
    staged: tuple[PendingShard, ...] = ()   # what was staged for the shards it wrote

    @property
    def records_changed(self) -> int:
        return sum(p.edited + p.deleted + p.added for p in self.staged)

    def to_json(self) -> dict:
        if not self.ok:
            return {"ok": False, "error": self.error, "done": [r.relpath for r in self.shards]}
        return {"ok": True, "shards": [asdict(r) for r in self.shards], "seconds": self.seconds,
                "notes": list(self.notes), "staged": [asdict(p) for p in self.staged],
                "records_changed": self.records_changed}


@dataclass(frozen=True)
class StatusResult:
    writable: bool
    pending: tuple[PendingShard, ...] = ()
    last_commit: CommitResult | None = None
    rejected: tuple[Rejected, ...] = ()       # the last writes refused, oldest first
    source: str = ""
    pid: int = 0

    def to_json(self) -> dict:
        return {"pending": [asdict(p) for p in self.pending],
                "last_commit": self.last_commit.to_json() if self.last_commit else {},
                "rejected": [asdict(r) for r in self.rejected], "source": self.source, "pid": self.pid}


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
    discard_at_unmount: bool = False   # tfrfs umount --discard asked for it (see ``control``)
    mountpoint: str | None = None      # where it is served (``attach``)

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
        return name if self.source.remote else os.path.abspath(name)

    def status(self) -> StatusResult:
        if self.staging is None:
            return StatusResult(False, source=self.source_name, pid=os.getpid())
        return StatusResult(True, pending_of(self.staging), self.last_commit,
                            tuple(self.tree.errors.rejected), self.source_name, os.getpid())

    def attach(self, mountpoint: str) -> None:
        """Note that this mount is served at ``mountpoint`` (see ``mountrecord``); ``close`` forgets it."""
        self.mountpoint = mountpoint
        mountrecord.write(mountrecord.MountRecord(mountpoint, self.source_name, self.discovery.root,
                                                  self.writable, os.getpid()))
        if self.staging is not None:
            self.staging.lock.note_holder(mountpoint=mountpoint, source=self.source_name)
            # The kind of a key new to the dataset needs the schema: have it ready by the first edit.
            self.tree.schema.build_in_background()
        elif not self.source.remote:
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
        else:
            self.commit()

    def finish(self, unmounted: bool, why: str) -> None:
        """The end of a writable mount: commit when the kernel unmounted it (``unmounted``), or drop
        the staged edits when ``tfrfs umount --discard`` asked; else (a stop signal: ``why`` says
        which) leave them staged. Failures are logged: the daemon is ending."""
        staging = self.staging
        if staging is None:
            return
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
        """Write every changed shard anew: each new file by a shard job on ``runner`` (here, one
        after the other, without one: as inside the daemon), each put in place here, in shard
        order. Raises CommitFailed; what finished before stays committed."""
        staging = self.staging
        if staging is None:
            return CommitResult(True)
        done: list[ShardResult] = []
        started = time.monotonic()
        self.tree.schema.forget()   # the shards are about to change
        store = self.store
        staged: list[PendingShard] = []
        root = self.discovery.root
        todo = list(sorted(staging.shards.items()))
        plans: dict[str, repack.ShardPlan] = {}
        written: Iterator[repack.Written] = iter(())
        try:
            first = next((ch for _, ch in todo if not ch.empty), None)
            if first is not None:
                repack.settle(staging, first)
            for relpath, ch in todo:
                if ch.empty or ch.removed:
                    continue
                n = store.shard_number(relpath)
                try:
                    plans[relpath] = repack.plan_shard(root, ch, store.shards[n] if n is not None else None)
                except OSError as exc:
                    raise repack.failure(ch, exc, False) from exc
            # A shard replaced on disk since it was indexed (a commit whose last step failed) is
            # written here, from the file this mount holds open; the others by jobs.
            here = {relpath for relpath, plan in plans.items() if plan.shard is not None and not _same_file(plan.shard)}
            where = jobs.Where.of(self.source)
            from tfrfs.jobs.shard_work import gather
            written = gather(runner or jobs.InProcess(), repack.write_job,
                             [(where, plan) for relpath, plan in plans.items() if relpath not in here])
            for relpath, ch in todo:
                if ch.empty:
                    staging.drop_shard(relpath)
                    continue
                pending = _pending(ch)
                n = store.shard_number(relpath)
                log.info("committing %s (%d edited, %d deleted, %d added%s)", relpath, len(ch.edited),
                         len(ch.deleted), len(ch.added), ", removed" if ch.removed else ", new" if ch.new else "")
                tally = self._tally_after(n, ch)
                if n is not None:
                    store.reader(n)   # opened before the file is replaced: the mount reads the old one until reloaded
                if ch.removed:
                    result = repack.remove_shard(root, ch, staging)
                else:
                    plan = plans.pop(relpath)
                    got = repack.write_job(where, plan, store.reader(n)) if relpath in here and n is not None \
                        else _next_written(written)
                    result = repack.put_in_place(plan, got, staging)
                done.append(result)
                staged.append(pending)
                if n is not None:
                    if result.action == "removed":
                        self.tree.hide_shard(n)
                    else:
                        self._reload(n, relpath)
                        self.tree.schema.committed(n, tally)
                log.info("committed %s: %s, %d records, %d bytes", relpath, result.action, result.records,
                         result.bytes)
        except CommitFailed as exc:
            log.error("%s", exc)
            self.last_commit = CommitResult(False, tuple(done), error=str(exc), staged=tuple(staged),
                                            notes=self._follow_tfds(done) + self._follow_manifest(done))
            raise
        finally:
            close = getattr(written, "close", None)
            if close is not None:
                close()   # the jobs not finished yet are called off ...
            repack.take_back(plans.values())   # ... and their files taken back
        notes = self._follow_tfds(done) + self._follow_manifest(done)
        self.last_commit = CommitResult(True, tuple(done), round(time.monotonic() - started, 3),
                                        staged=tuple(staged), notes=notes)
        return self.last_commit

    def _tally_after(self, n: int | None, ch: ShardChanges) -> Tally | None:
        """What shard ``n`` will hold once ``ch`` is committed (the schema follows without reading
        the shard again), or None when its tally is not known yet."""
        if ch.removed or n is None:
            return None
        store = self.store
        idx = store.shards[n]
        staging = self.staging
        assert staging is not None
        replaced = sorted((ch.edited | ch.deleted) - idx.bad) if not ch.new else []
        removed = (store.original(n, i)[0] for i in replaced if i < idx.count)

        def written() -> Iterator[bytes | memoryview]:
            # Staged records are mapped, not read: one may hold a value of a gigabyte.
            for i in sorted(ch.edited - ch.deleted):
                yield from _mapped(staging.edit_path(ch, i), 0)
            for name in ch.added_names():
                if ch.kind == "sequence":
                    yield mutate.with_both_parts(staging.get_added(ch, name))
                else:
                    yield from _mapped(*staging.added_path(ch, name))
        return self.tree.schema.change_of(None if ch.new else n, store.kinds[n], removed, written())

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

    def _follow_manifest(self, done: list[ShardResult]) -> tuple[str, ...]:
        """The index files beside the committed shards and the dataset's manifest follow them
        (SPEC 1.2), where the dataset has them (also after a commit of nothing: one that a crash
        cut short may have left them behind)."""
        store = self.store
        written = [store.shards[n] for r in done if r.action != "removed"
                   and (n := store.shard_number(r.relpath)) is not None]
        removed = [r.relpath for r in done if r.action == "removed"]
        schema = self.tree.schema
        notes = manifest.follow(self.discovery.root, self.cache, written, removed,
                                schema.summary() if schema.ready() else None)
        for note in notes:
            log.info("%s", note)
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
            self.staging.release()   # and with nothing staged, the staging folder goes
        if self.mountpoint is not None:
            mountrecord.remove(self.mountpoint, os.getpid())


def _same_file(shard: ShardFile) -> bool:
    """Whether ``shard``'s path still holds the file that was indexed."""
    try:
        return local_identity(os.stat(shard.path)) == shard.identity
    except OSError:
        return False


def _next_written(written: Iterator[repack.Written]) -> repack.Written:
    """The next shard's write job's result; a failure of the runner itself (a worker lost again
    and again, a cluster gone) fails that shard's commit as a job's own failure would."""
    try:
        return next(written)
    except Exception as exc:   # the job's own failures come back in Written
        log.error("a commit job failed", exc_info=True)
        return repack.Written(0, OSError(errno.EIO, f"its job failed: {exc}"))


def _mapped(path: os.PathLike[str] | str, start: int) -> Iterator[bytes | memoryview]:
    """The bytes of ``path`` from ``start`` on, mapped for as long as the consumer looks at them."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= start:
            yield b""
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            part = view[start:]
            try:
                yield part
            finally:
                part.release()
                view.release()


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
        tree = Tree(disc, store, Schema(store, cache.save, jobs.scan_pool))
        if src.manifest is not None and not src.remote and staging is None:
            from tfrfs.index.manifest import FolderCheck
            tree.check_folders(FolderCheck(tree, cache))
        mount = Mount(disc, tree, cache, src, staging)
        if staging is not None:
            # Imported here: a read-only mount (and every command but mount --rw) does without them.
            from tfrfs.edit.feature_files import FileEditor
            from tfrfs.edit.folders import FolderEditor
            from tfrfs.edit.rename import Renamer
            from tfrfs.edit.stager import Stager
            stager = Stager(tree, staging)
            mount.files = FileEditor(stager, mount.control)
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
    """Drop every staged change of SOURCE (not mounted writable: raises UsageError then)."""
    staging = Staging(source_root(source))
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


def commit_source(source: Source, indexed: tuple[list[ShardIndex], IndexCache],
                  runner: jobs.Runner | None = None) -> CommitResult:
    """Commit the staged edits of a SOURCE that is not mounted (after a crash, or a stop by a
    signal), by the code a mount commits with, the new shard files written by shard jobs on
    ``runner``. Raises UsageError while it is mounted writable, CommitFailed (the edits stay
    staged)."""
    with _locking(Staging(source.discovery.root),
                  busy=lambda where: f"{source.name} is mounted writable{where}: commit it there "
                                     "(tfrfs commit MOUNTPOINT)",
                  refused=lambda reason: f"{source.discovery.root}: {reason}: cannot commit there"):
        m = open_mount(source, writable=True, indexed=indexed)
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


def staged_in(source: str) -> tuple[PendingShard, ...]:
    """What is staged for SOURCE, read from its journal (it need not be mounted)."""
    staging = Staging(source_root(source))
    staging.load()
    return pending_of(staging)


def writable_holder(source: str) -> dict:
    """Who mounts SOURCE writable now ({"pid", "mountpoint", "source"}), or {} when nobody does."""
    staging = Staging(source_root(source))
    return (staging.lock.holder() or {"pid": None}) if staging.lock.is_locked() else {}


def source_root(source: str) -> str:
    """The folder a SOURCE's staged changes live in."""
    if is_url(source):
        raise UsageError(f"{source}: a remote source is read-only: nothing is ever staged for it")
    if os.path.isdir(source):
        return os.path.abspath(source)
    return discover(source).root
