"""Indexing local shards on every core (``tfrfs index``, the cold part of a mount).

A shard's index is found by walking its headers from the first record to the last: one shard is
one job, and the shards of a dataset are walked side by side, one worker process per core (fresh
processes, never forked from a daemon's threads). A worker writes the index file into the cache
directory itself and sends back only a few figures; the caller then loads each index from the
cache, as a later mount would. ``tfrfs index`` also asks the worker for the shard's part of the
schema (``shardschema``): it reads the records just after walking them, while they are in the
page cache, and the tally goes into the same index file.

Remote shards are not for a pool (their requests overlap in threads instead), and so few bytes
that starting workers would cost more than it saves are indexed in the calling process.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from concurrent.futures import Executor, Future, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from . import idxfile, shardschema
from .index import IndexCache, ShardFile, ShardIndex, SourceFiles
from .remote import is_url

if TYPE_CHECKING:
    from . import jobs
    from .indexmemory import IndexMemory
    from .sources import Source

log = logging.getLogger("tfrfs")

POOL_BYTES = 64 << 20     # fewer bytes to walk than this in all: walked here (a worker takes ~0.1 s to start)

_SCHEMA = contextvars.ContextVar("tfrfs_index_schema", default=False)


@contextlib.contextmanager
def reading_schema() -> Iterator[None]:
    """Within it, shards indexed by workers also have their schema's part read (``tfrfs index``)."""
    token = _SCHEMA.set(True)
    try:
        yield
    finally:
        _SCHEMA.reset(token)


def poolable(shard: ShardFile, cache: IndexCache) -> bool:
    """Whether a worker can index ``shard`` as ``cache`` would: a local file, read by the local
    readers, through the local files."""
    from .readers.local import LocalReaders
    return (not is_url(shard.path) and type(cache.readers) is LocalReaders
            and type(cache.files) is SourceFiles)


def worth_a_pool(shards: list[ShardFile]) -> bool:
    return len(shards) > 1 and shardschema.workers() > 1 and sum(s.size for s in shards) >= POOL_BYTES


def build_one(cache_dir: str, shard: ShardFile, schema: bool) -> int:
    """A worker's job: index ``shard`` from its headers into the cache at ``cache_dir`` (with its
    schema's part when ``schema``). Returns its record count."""
    cache = IndexCache(cache_dir)
    idx = cache.build(shard)
    if schema:
        idx.tally = tally_of(idx)
    cache.save(idx)
    return idx.count


def tally_of(idx: ShardIndex) -> shardschema.Tally | None:
    """The schema's part of an indexed local shard, or None when its stream changed meanwhile."""
    try:
        stamp = shardschema.stamp_of(os.stat(idx.data_path))
    except OSError:
        return None
    got = shardschema.scan_part(idx.data_path, stamp, idx.detected_kind, idx.offsets.tobytes(), 0,
                                tuple(sorted(idx.bad)), idxfile.typecode(idx.offsets))
    return shardschema.Tally.from_json(got) if got is not None else None


Done = Callable[[int, ShardIndex], None]   # (the shard's position in the list, its index)


def build_all(shards: list[tuple[int, ShardFile]], cache: IndexCache, done: Done,
              executor: Executor | None = None) -> None:
    """Index ``shards`` (each with its position in the caller's list) in worker processes, the
    largest first; ``done`` is called with each index, loaded from the cache, as it is ready. A
    job that fails in its worker is done here (where its error, if any, is raised as the calling
    process would raise it), after one message saying so."""
    schema = _SCHEMA.get()
    own = executor is None
    if own:
        import multiprocessing
        # The fork server imports what the workers run once, before it forks them (when it is not
        # running yet): each worker starts ready instead of importing it again (~0.2 s).
        multiprocessing.get_context("forkserver").set_forkserver_preload([__name__])
    ex = executor or shardschema.pool(min(shardschema.workers() + 1, len(shards)), fork=True)
    here: list[tuple[int, ShardFile]] = []
    try:
        futures: dict[Future, tuple[int, ShardFile]] = {}
        for n, shard in sorted(shards, key=lambda job: -job[1].size):
            futures[ex.submit(build_one, str(cache.dir), shard, schema)] = (n, shard)
        broken = False
        for fut in as_completed(futures):
            n, shard = futures[fut]
            try:
                fut.result()
            except BrokenProcessPool:
                if not broken:
                    log.warning("a process indexing shards stopped; the shards it had not indexed "
                                "are indexed in this process")
                broken = True
                here.append((n, shard))
                continue
            except Exception as exc:  # noqa: BLE001 - whatever it was, the job is done again here
                log.warning("%s: indexing it in a worker process failed (%s); it is indexed in this process",
                            shard.relpath, exc or type(exc).__name__)
                here.append((n, shard))
                continue
            idx = cache.load(shard)
            if idx is None:   # not in the cache after all (it cannot be written): indexed here
                idx = cache.get(shard)[0]
            else:
                cache.scans += 1
            done(n, idx)
    finally:
        if own:
            ex.shutdown(wait=True, cancel_futures=True)
    for n, shard in sorted(here):
        done(n, cache.get(shard)[0])


# --- the indexes of many shards, in order --------------------------------------------------------

ProgressFn = Callable[[int, int, int], None]   # (shards done, shards total, records so far)


def index_all(shards: Iterable[ShardFile], cache: IndexCache,
              progress: ProgressFn | None = None, workers: int = 1) -> list[ShardIndex]:
    """Every shard's index, in order; ``workers`` shards at a time (remote shards: the requests
    of many shards overlap)."""
    shards = list(shards)
    records = 0
    if workers <= 1 and len(shards) > 1:
        return _index_local(shards, cache, progress)
    if workers <= 1 or len(shards) <= 1:
        out: list[ShardIndex] = []
        for n, shard in enumerate(shards, 1):
            idx, _ = cache.get(shard)
            out.append(idx)
            records += idx.count
            if progress:
                progress(n, len(shards), records)
        return out
    from concurrent.futures import ThreadPoolExecutor, as_completed
    found: dict[int, ShardIndex] = {}
    with ThreadPoolExecutor(min(workers, len(shards)), thread_name_prefix="tfrfs-index") as pool:
        futures = {pool.submit(cache.get, shard): n for n, shard in enumerate(shards)}
        for done, fut in enumerate(as_completed(futures), 1):
            idx, _ = fut.result()
            found[futures[fut]] = idx
            records += idx.count
            if progress:
                progress(done, len(shards), records)
    return [found[n] for n in range(len(shards))]


def _index_local(shards: list[ShardFile], cache: IndexCache, progress: ProgressFn | None) -> list[ShardIndex]:
    """``index_all`` of local shards: those in the cache or with an index file beside them are
    taken here, the others are walked on every core (``indexbuild``) when there are enough."""
    found: dict[int, ShardIndex] = {}
    records = 0

    def done(n: int, idx: ShardIndex) -> None:
        nonlocal records
        found[n] = idx
        records += idx.count
        if progress:
            progress(len(found), len(shards), records)
    scan: list[tuple[int, ShardFile]] = []
    for n, shard in enumerate(shards):
        idx = cache.load(shard)
        if idx is not None:
            done(n, idx)
        elif poolable(shard, cache) and not cache._candidates(shard):
            scan.append((n, shard))
        else:
            done(n, cache.get(shard)[0])
    if worth_a_pool([s for _, s in scan]):
        build_all(scan, cache, done)
    else:
        for n, shard in scan:
            done(n, cache.get(shard)[0])
    return [found[n] for n in range(len(shards))]


# --- the indexes of a SOURCE's shards as shard jobs (``tfrfs index``, ``inspect``, ...) -------------

SourceProgress = Callable[[int, int, int, int, int], None]   # as ``index.IndexProgress``


def index_with(source: "Source", runner: "jobs.Runner", progress: SourceProgress | None = None,
               schema: bool = False, index_dir: str | None = None,
               memory: "IndexMemory | None" = None) -> tuple[list[ShardIndex], IndexCache]:
    """The indexes of SOURCE's shards, as ``sources.index_source`` gives them: those in the cache
    or shipped beside their shards are taken here; the others are shard jobs on ``runner``
    (``schema``: with their schema's part), whose index files this process writes into the
    cache and loads from there, so the indexes are those one process makes, byte for byte. A
    remote source without Ray is indexed by threads here (its requests overlap), as before."""
    from . import jobs, shardjobs, sources
    if source.manifest is not None or (source.remote and not isinstance(runner, jobs.RayRunner)):
        with reading_schema() if schema else contextlib.nullcontext():
            return sources.index_source(source, progress, index_dir, memory)
    disc = source.discovery
    shards = list(disc.shards)
    cache = IndexCache(source.cache_dir, source.readers, disc.access, index_dir, memory)
    found: dict[int, ShardIndex] = {}
    total_bytes = sum(s.size for s in shards)
    done_bytes = [0]
    records = [0]

    def done(n: int, idx: ShardIndex) -> None:
        found[n] = idx
        records[0] += idx.count
        done_bytes[0] += shards[n].size
        if progress is not None:
            progress(len(found), len(shards), records[0], done_bytes[0], total_bytes)
    cold: list[int] = []
    for n, shard in enumerate(shards):
        idx = cache.load(shard)
        if idx is not None:
            done(n, idx)
        elif cache._candidates(shard):
            done(n, cache.get(shard)[0])   # an index file beside it: read here
        else:
            cold.append(n)
    where = jobs.Where.of(source)
    todo = [(where, shards[n], schema) for n in cold]
    try:
        for n, data in zip(cold, shardjobs.gather(runner, shardjobs.index_job, todo)):
            cache.save_bytes(shards[n], data)
            idx = cache.load(shards[n])
            if idx is None:
                # Not usable here (a compressed shard whose stream a job on another machine made):
                # indexed again in this process.
                idx = cache.get(shards[n])[0]
            else:
                cache.scans += 1
            done(n, idx)
    finally:
        if isinstance(disc.files, sources.RemoteFiles):
            disc.files.prefetched.clear()
    return [found[n] for n in range(len(shards))], cache
