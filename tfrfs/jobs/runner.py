"""Work that runs shard by shard (SPEC 8: ``index``, ``verify``, ``inspect``, ``repair``,
``commit SOURCE``, ``reshard``): in this process, in a pool of local processes over every core,
or as tasks on a Ray cluster (``--ray [ADDRESS]``).

A command cuts its work into jobs: a module-level function and small, picklable arguments (a
``Where`` saying how to reach the dataset's bytes, a shard, a record range). A job opens what it
reads itself, streams through it, and sends back a small result (an index file's bytes, a
report, a tally). The caller gets the results as the jobs finish (``Runner.run``) or in job order
(``Runner.ordered``) and alone writes what the command writes, so the output does not depend on
where the jobs ran.

A job whose worker process is lost (killed, out of memory, its node gone) runs again: in a local
pool on a fresh pool, on Ray by Ray's own task retries. A job that raises raises in the caller.
"""

from __future__ import annotations

import logging
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from tfrfs.errors import UsageError

log = logging.getLogger("tfrfs")

RETRIES = 3          # times a job whose worker was lost runs again
RAY_WINDOW = 64      # Ray tasks under way at least
RAY_ENV = "RAY_ADDRESS"

Job = tuple[Any, ...]   # the arguments of one call of the job function


class WorkersLost(RuntimeError):
    """Worker processes kept stopping: a job could not be run (see ``LocalPool``)."""


class Runner(ABC):
    """Runs a job function over many argument tuples."""

    name: str
    workers: int   # jobs that run at the same time

    @abstractmethod
    def run(self, fn: Callable[..., Any], jobs: Sequence[Job]) -> Iterator[tuple[int, Any]]:
        """``(n, fn(*jobs[n]))`` for every job, as they finish. At most a few jobs per worker are
        under way or finished-but-not-taken at a time, so results stream."""

    def ordered(self, fn: Callable[..., Any], jobs: Sequence[Job]) -> Iterator[Any]:
        """``fn(*job)`` for every job, in job order (results that finish early wait their turn)."""
        waiting: dict[int, Any] = {}
        nxt = 0
        for n, result in self.run(fn, jobs):
            waiting[n] = result
            while nxt in waiting:
                yield waiting.pop(nxt)
                nxt += 1

    def close(self) -> None:
        pass

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InProcess(Runner):
    """One job after the other, here."""

    name = "this process"
    workers = 1

    def run(self, fn: Callable[..., Any], jobs: Sequence[Job]) -> Iterator[tuple[int, Any]]:
        for n, job in enumerate(jobs):
            yield n, fn(*job)


class Threads(Runner):
    """Threads of this process: for jobs that wait on requests (remote shards), not on a core."""

    name = "threads"

    def __init__(self, workers: int, prefix: str = "tfrfs-job") -> None:
        self.workers = workers
        self.prefix = prefix

    def run(self, fn: Callable[..., Any], jobs: Sequence[Job]) -> Iterator[tuple[int, Any]]:
        from concurrent.futures import ThreadPoolExecutor, as_completed
        with ThreadPoolExecutor(max(1, min(self.workers, len(jobs))), thread_name_prefix=self.prefix) as pool:
            futures = {pool.submit(fn, *job): n for n, job in enumerate(jobs)}
            try:
                for fut in as_completed(futures):
                    yield futures[fut], fut.result()
            finally:
                for fut in futures:
                    fut.cancel()


def cores() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def process_pool(workers: int, *, nice: bool = False) -> ProcessPoolExecutor:
    """The pool of local worker processes every runner and indexer here uses: forked when this
    process runs one thread (a command, a daemon before it serves: a worker starts in
    milliseconds), else started by a fork server (never forked from a daemon's threads).
    ``nice``: the workers yield to other work (a read nobody waits for, beside a mount's own)."""
    import multiprocessing
    context = "fork" if threading.active_count() == 1 else "forkserver"
    # A fork server started earlier holds the environment of that moment: the workers take
    # this process's as it is now (a store's credentials, set since, among it).
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(context),
                               initializer=_start_worker, initargs=(dict(os.environ), nice))


class LocalPool(Runner):
    """A pool of local worker processes, one per core (see ``process_pool``); ``nice``: they yield
    to other work."""

    name = "local processes"

    def __init__(self, workers: int | None = None, *, nice: bool = False) -> None:
        self.workers = workers or cores()
        self.nice = nice
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = process_pool(self.workers, nice=self.nice)
        return self._pool

    def run(self, fn: Callable[..., Any], jobs: Sequence[Job]) -> Iterator[tuple[int, Any]]:
        todo = list(range(len(jobs)))[::-1]          # popped from the end: job order
        tries = [0] * len(jobs)
        window = 2 * self.workers
        running: dict[Future, int] = {}
        fresh_pools = 0   # pools made since a job last finished: bounds a pool that never works
        try:
            while todo or running:
                lost: list[int] = []   # jobs a lost worker had (a broken pool loses them all)
                try:
                    while todo and len(running) < window:
                        n = todo.pop()
                        try:
                            running[self._executor().submit(fn, *jobs[n])] = n
                        except BrokenProcessPool:
                            # A worker died between jobs: the pool noticed before this job went in.
                            todo.append(n)
                            raise
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        n = running.pop(fut)
                        try:
                            result = fut.result()
                        except BrokenProcessPool:
                            lost.append(n)
                            continue
                        fresh_pools = 0
                        yield n, result
                except BrokenProcessPool:
                    pass
                if lost or self._broken():
                    for n in lost:
                        tries[n] += 1
                        if tries[n] > RETRIES:
                            raise WorkersLost(f"a worker process was lost {tries[n]} times running job {n}") from None
                    fresh_pools += 1
                    if fresh_pools > RETRIES + 1:
                        raise WorkersLost("worker processes keep stopping before any job finishes") from None
                    # Every job the broken pool held is lost with it: they all run again.
                    log.warning("a worker process stopped; its jobs run again in new workers")
                    todo.extend(lost)
                    todo.extend(running.values())
                    running.clear()
                    todo.sort(reverse=True)
                    self._drop_pool()
        finally:
            for fut in running:
                fut.cancel()

    def _broken(self) -> bool:
        """Whether the pool has lost a worker (and so every job it holds)."""
        return self._pool is not None and bool(getattr(self._pool, "_broken", False))

    def _drop_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _start_worker(env: dict[str, str], nice: bool) -> None:
    os.environ.clear()
    os.environ.update(env)
    if nice:
        try:
            os.nice(10)
        except OSError:
            pass


def scan_pool(nice: bool) -> LocalPool:
    """The runner a mount's schema scan reads tallies on (``view.schema.Schema``): every core,
    yielding to other work when ``nice`` (a scan in the background)."""
    return LocalPool(nice=nice)


_ray_lock = threading.Lock()


class RayRunner(Runner):
    """Tasks on a Ray cluster: ``address`` as ``ray.init`` takes it; ``auto`` is ``$RAY_ADDRESS``
    when set, else a cluster started here for this command (stopped with it). A Ray session this
    process already holds (the library used inside a Ray program) is used as it is."""

    name = "Ray"

    def __init__(self, address: str = "auto") -> None:
        try:
            import ray
        except ImportError:
            raise UsageError("--ray needs Ray: pip install 'tfrfs[ray]'") from None
        self.ray = ray
        self._started = False
        with _ray_lock:
            if not ray.is_initialized():
                if address == "auto":
                    address = os.environ.get(RAY_ENV) or ""
                try:
                    ray.init(address=address or None, include_dashboard=False, log_to_driver=False,
                             configure_logging=False, ignore_reinit_error=True)
                except (ConnectionError, ValueError, RuntimeError) as exc:
                    where = address or "a local cluster"
                    raise UsageError(f"cannot reach the Ray cluster at {where}: {exc}") from None
                self._started = True
            _ray_messages_to_stderr()
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._task = ray.remote(max_retries=RETRIES, retry_exceptions=False, num_cpus=1)(_call)

    def run(self, fn: Callable[..., Any], jobs: Sequence[Job]) -> Iterator[tuple[int, Any]]:
        ray = self.ray
        todo = list(range(len(jobs)))[::-1]
        # Each task costs Ray a few milliseconds to place and return: with many short jobs (a
        # thousand small new shards) enough of them are kept under way to hide that; results are
        # small, so the window costs no memory to speak of.
        window = max(4 * self.workers, RAY_WINDOW)
        running: dict[Any, int] = {}
        fn_ref = ray.put(fn)
        try:
            while todo or running:
                while todo and len(running) < window:
                    n = todo.pop()
                    running[self._task.remote(fn_ref, jobs[n])] = n
                finished, _ = ray.wait(list(running), num_returns=1, fetch_local=True)
                for ref in finished:
                    n = running.pop(ref)
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:
                        # The job's own exception (its class and message), as InProcess raises it.
                        cause = getattr(exc, "cause", None)
                        raise (cause if isinstance(cause, BaseException) else exc.as_instanceof_cause()) from None
                    yield n, result
        finally:
            for ref in running:
                ray.cancel(ref, force=True)

    def close(self) -> None:
        if self._started:
            self.ray.shutdown()
            self._started = False


def _ray_messages_to_stderr() -> None:
    """Ray prints what its raylets report (a worker lost, its task retried) on the driver's
    stdout; a command's stdout is its output, the same wherever its jobs ran: they go to stderr."""
    try:
        from ray._private import worker
    except ImportError:
        return
    show = getattr(worker, "print_to_stdstream", None)
    if show is None or getattr(show, "_tfrfs", False):
        return

    def to_stderr(data: dict, *args: Any, **kw: Any) -> Any:
        return show(dict(data, is_err=True), *args, **kw)
    to_stderr._tfrfs = True   # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr


def _call(fn: Callable[..., Any], job: Job) -> Any:
    return fn(*job)


# The jobs of a walk of every record (index, verify, inspect) read shards as much as they
# compute: while one worker waits on the disk, another uses the core (index of 100 M tiny records
# here: 16.7 s with one worker a core, 10.2 s with two; verify 13.0 s and 9.2 s). Jobs that write
# (repair, reshard, commit) gained nothing from a second worker a core.
WALK_WORKERS_PER_CORE = 2


def runner(ray: str | None = None, workers: int | None = None, per_core: int = 1) -> Runner:
    """The runner a command's options ask for: ``ray`` (``--ray [ADDRESS]``) on Ray, else a local
    pool of ``workers`` processes (default: ``per_core`` a core), or this process for one
    worker."""
    if ray is not None:
        return RayRunner(ray or "auto")
    n = workers or per_core * cores()
    return InProcess() if n <= 1 else LocalPool(n)
