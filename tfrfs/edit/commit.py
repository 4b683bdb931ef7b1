"""The commit of a writable mount (SPEC 7): every changed shard written anew, then put in place.

``Committer.commit`` does it, and ``Committer.start`` does it on a thread of its own, so that the
mount keeps answering while a large shard is written: the request thread serves every read and
listing, and ``guard`` (a lock that every request of the mount holds) is taken by the commit only
where it changes what a request sees, shard by shard: putting the new file in place, dropping its
staged changes and serving the shard from the new file happen together, between two requests.
Until then a shard is read as it was, its staged edits included; after, from its new file.

While a commit runs, changes are refused (``busy``): the commit works from the staged changes as
they were when it started, and drops each shard's journal once its new file is in place.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, ContextManager, Iterator

from tfrfs.edit import mutate
from tfrfs.edit import repack
from tfrfs.edit.journal import ShardChanges, Staging
from tfrfs.edit.repack import CommitFailed, ShardPlan, ShardResult, Written
from tfrfs.index import manifest
from tfrfs.index import tfds_info as tfds
from tfrfs.index.shard_index import IndexCache
from tfrfs.index.discovery import ShardFile, local_identity
from tfrfs.index.shardschema import Tally
from tfrfs.index.where import Where
from tfrfs.view.nodes import PlainFile
from tfrfs.view.tree import Tree

log = logging.getLogger("tfrfs")

# The write jobs of a commit's plans, in order (on whatever runner the caller chose).
WriteJobs = Callable[[list[ShardPlan]], Iterator[Written]]


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


def pending_of(staging: Staging) -> tuple[PendingShard, ...]:
    """The shards with staged changes, in path order."""
    return tuple(pending_shard(ch) for _, ch in sorted(staging.shards.items()) if not ch.empty)


def pending_shard(ch: ShardChanges) -> PendingShard:
    return PendingShard(ch.relpath, ch.new, ch.removed, len(ch.edited), len(ch.deleted), len(ch.added))


class Committer:
    """Commits a writable mount's staged changes into its tree (see the module's docstring)."""

    def __init__(self, tree: Tree, staging: Staging, cache: IndexCache, where: Where,
                 guard: ContextManager[object] | None = None) -> None:
        self.tree = tree
        self.staging = staging
        self.cache = cache
        self.where = where
        self.root = tree.discovery.root
        # Held by every request of the mount (the FUSE adapter takes it); a re-entrant lock, so a
        # commit run on the request thread itself (at unmount, in-process) takes it again freely.
        self.guard: ContextManager[object] = guard if guard is not None else contextlib.nullcontext()
        self.last: CommitResult | None = None
        self.started = 0   # commits started so far (``.tfrfs/commit`` says it, for ``tfrfs commit`` to wait on)
        self._thread: threading.Thread | None = None

    # -- in the background -----------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether a commit started by ``start`` is still running."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def busy(self) -> str | None:
        """Why a change cannot be staged now (a commit runs), or None."""
        return "a commit is running; change it again once the commit is done (tfrfs status)" \
            if self.running else None

    def start(self, write_jobs: WriteJobs) -> None:
        """Commit on a thread of its own; a commit already running is the one asked for (nothing
        can have been staged since it started). Its result is ``last``, once ``running`` is over."""
        if self.running:
            return
        self.started += 1
        self._thread = threading.Thread(target=self._run, args=(write_jobs,), name="tfrfs-commit", daemon=True)
        self._thread.start()

    def _run(self, write_jobs: WriteJobs) -> None:
        try:
            self.commit(write_jobs)
        except CommitFailed:
            pass   # logged, and kept in ``last``
        except Exception as exc:   # a bug: the mount goes on, and says so where tfrfs commit looks
            log.error("the commit failed", exc_info=exc)
            with self.guard:
                self.last = CommitResult(False, error=f"the commit failed: {exc}")

    def wait(self, timeout: float | None = None) -> None:
        """Until a commit started by ``start`` is over (not called holding ``guard``)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    # -- the commit itself -------------------------------------------------------------

    def commit(self, write_jobs: WriteJobs) -> CommitResult:
        """Write every changed shard anew: each new file by a shard job of ``write_jobs``, each put
        in place here, in shard order, under ``guard``. Raises CommitFailed; what finished before
        stays committed."""
        staging = self.staging
        done: list[ShardResult] = []
        started = time.monotonic()
        store = self.tree.store
        staged: list[PendingShard] = []
        root = self.root
        plans: dict[str, ShardPlan] = {}
        written: Iterator[Written] = iter(())
        try:
            with self.guard:
                self.tree.schema.forget()   # the shards are about to change
                todo = list(sorted(staging.shards.items()))
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
            written = write_jobs([plan for relpath, plan in plans.items() if relpath not in here])
            for relpath, ch in todo:
                if ch.empty:
                    with self.guard:
                        staging.drop_shard(relpath)
                    continue
                pending = pending_shard(ch)
                n = store.shard_number(relpath)
                log.info("committing %s (%d edited, %d deleted, %d added%s)", relpath, len(ch.edited),
                         len(ch.deleted), len(ch.added), ", removed" if ch.removed else ", new" if ch.new else "")
                tally = self._tally_after(n, ch)
                if n is not None:
                    store.reader(n)   # opened before the file is replaced: the mount reads the old one until reloaded
                got = None
                if not ch.removed:
                    got = repack.write_job(self.where, plans[relpath], store.reader(n)) \
                        if relpath in here and n is not None else next_written(written)
                with self.guard:   # the swap: between two requests
                    if ch.removed:
                        result = repack.remove_shard(root, ch, staging)
                    else:
                        assert got is not None
                        result = repack.put_in_place(plans.pop(relpath), got, staging)
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
            with self.guard:
                self.last = CommitResult(False, tuple(done), error=str(exc), staged=tuple(staged),
                                         notes=self._follow_tfds(done) + self._follow_manifest(done))
            raise
        finally:
            close = getattr(written, "close", None)
            if close is not None:
                close()   # the jobs not finished yet are called off ...
            repack.take_back(plans.values())   # ... and their files taken back
        with self.guard:
            notes = self._follow_tfds(done) + self._follow_manifest(done)
            self.last = CommitResult(True, tuple(done), round(time.monotonic() - started, 3),
                                     staged=tuple(staged), notes=notes)
            return self.last

    def _tally_after(self, n: int | None, ch: ShardChanges) -> Tally | None:
        """What shard ``n`` will hold once ``ch`` is committed (the schema follows without reading
        the shard again), or None when its tally is not known yet."""
        if ch.removed or n is None:
            return None
        store = self.tree.store
        idx = store.shards[n]
        staging = self.staging
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
        notes = tfds.after_commit(self.root, self.tree.store.shards, [r.relpath for r in done])
        for note in notes:
            log.info("%s", note)
        for rel in {os.path.join(os.path.dirname(r.relpath), tfds.INFO) for r in done}:
            parent = self.tree.dirs.get(os.path.dirname(rel))
            if parent is not None and isinstance(parent.children.get(tfds.INFO), PlainFile):
                try:
                    parent.children[tfds.INFO] = PlainFile(rel, *self.tree.discovery.access.plain_stat(rel))
                except OSError:   # gone from under the mount: it is shown as it was
                    pass
        return tuple(notes)

    def _follow_manifest(self, done: list[ShardResult]) -> tuple[str, ...]:
        """The index files beside the committed shards and the dataset's manifest follow them
        (SPEC 1.2), where the dataset has them (also after a commit of nothing: one that a crash
        cut short may have left them behind)."""
        store = self.tree.store
        written = [store.shards[n] for r in done if r.action != "removed"
                   and (n := store.shard_number(r.relpath)) is not None]
        removed = [r.relpath for r in done if r.action == "removed"]
        schema = self.tree.schema
        notes = manifest.follow(self.root, self.cache, written, removed,
                                schema.summary() if schema.ready() else None)
        for note in notes:
            log.info("%s", note)
        return tuple(notes)

    def _reload(self, n: int, relpath: str) -> None:
        path = os.path.join(self.root, relpath)
        st = os.stat(path)
        old = self.tree.store.shards[n].shard
        shard = ShardFile(path=os.path.abspath(path), relpath=relpath, compression=old.compression,
                          size=st.st_size, mtime_ns=st.st_mtime_ns, identity=local_identity(st))
        idx, _ = self.cache.get(shard)
        self.tree.replace_shard(n, idx)


def _same_file(shard: ShardFile) -> bool:
    """Whether ``shard``'s path still holds the file that was indexed."""
    try:
        return local_identity(os.stat(shard.path)) == shard.identity
    except OSError:
        return False


def next_written(written: Iterator[Written]) -> Written:
    """The next shard's write job's result; a failure of the runner itself (a worker lost again
    and again, a cluster gone) fails that shard's commit as a job's own failure would."""
    try:
        return next(written)
    except Exception as exc:   # the job's own failures come back in Written
        log.error("a commit job failed", exc_info=True)
        return Written(0, OSError(errno.EIO, f"its job failed: {exc}"))


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
