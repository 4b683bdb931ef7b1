"""Indexing local shards on every core (``tfrfs index``, the cold part of a mount).

A shard's index is found by walking its headers from the first record to the last: one shard is
one job, and the shards of a dataset are walked side by side on a runner (``jobs.runner``: by
default one local worker process per core, never forked from a daemon's threads). A worker writes the index file into the cache
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
from typing import Any, Callable, Iterable, Iterator, Sequence

from array import array

from tfrfs.index import idxfile
from tfrfs.jobs import runner as jobs
from tfrfs.jobs import shard_work as shardjobs
from tfrfs.index import shardschema
from tfrfs.format import tfrecord
from tfrfs.index.shard_index import IndexCache, ShardIndex
from tfrfs.index.discovery import ShardFile, SourceFiles
from tfrfs.index.where import Where

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
    from tfrfs.storage.local_reader import LocalReaders
    return type(cache.readers) is LocalReaders and type(cache.files) is SourceFiles


def worth_a_pool(shards: list[ShardFile]) -> bool:
    return len(shards) > 1 and jobs.cores() > 1 and sum(s.size for s in shards) >= POOL_BYTES


def build_one(cache_dir: str, shard: ShardFile, schema: bool) -> str | None:
    """A worker's job: index ``shard`` from its headers into the cache at ``cache_dir`` (with its
    schema's part when ``schema``). None when done, else why it failed (then the caller indexes
    it itself, and raises what it raises: a job that raises would end the whole run)."""
    try:
        cache = IndexCache(cache_dir)
        idx = cache.build(shard)
        if schema:
            idx.tally = tally_of(idx)
        cache.save(idx)
    except Exception as exc:  # noqa: BLE001 - whatever it was, the job is done again by the caller
        return str(exc or type(exc).__name__)
    return None


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
              runner: jobs.Runner | None = None) -> None:
    """Index ``shards`` (each with its position in the caller's list) on ``runner`` (a pool of
    local processes by default), the largest first; ``done`` is called with each index, loaded
    from the cache, as it is ready. A job that fails in its worker, or that the workers could not
    run, is done here (where its error, if any, is raised as the calling process would raise
    it), after one message saying so."""
    schema = _SCHEMA.get()
    own = runner is None
    if own:
        import multiprocessing
        # The fork server imports what the workers run once, before it forks them (when it is not
        # running yet): each worker starts ready instead of importing it again (~0.2 s).
        multiprocessing.get_context("forkserver").set_forkserver_preload([__name__])
    run = runner or jobs.LocalPool(min(jobs.cores() + 1, len(shards)))
    order = sorted(shards, key=lambda job: -job[1].size)
    left = dict(order)
    try:
        for k, failed in run.run(build_one, [(str(cache.dir), shard, schema) for _, shard in order]):
            n, shard = order[k]
            if failed is not None:
                log.warning("%s: indexing it in a worker process failed (%s); it is indexed in this process",
                            shard.relpath, failed)
                continue
            del left[n]
            idx = cache.load(shard)
            if idx is None:   # not in the cache after all (it cannot be written): indexed here
                idx = cache.get(shard)[0]
            else:
                cache.scans += 1
            done(n, idx)
    except jobs.WorkersLost as exc:
        log.warning("a process indexing shards stopped (%s); the shards it had not indexed are indexed "
                    "in this process", exc)
    finally:
        if own:
            run.close()
    for n, shard in sorted(left.items()):
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
    found: dict[int, ShardIndex] = {}
    threads = jobs.Threads(workers, "tfrfs-index")
    for done, (n, (idx, _)) in enumerate(threads.run(cache.get, [(shard,) for shard in shards]), 1):
        found[n] = idx
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
        elif poolable(shard, cache) and not cache.shipped_candidates(shard):
            scan.append((n, shard))
        else:
            done(n, cache.get(shard)[0])
    if worth_a_pool([s for _, s in scan]):
        build_all(scan, cache, done)
    else:
        for n, shard in scan:
            done(n, cache.get(shard)[0])
    return [found[n] for n in range(len(shards))]


# --- shard jobs: a shard's index, the schema's parts of many -----------------------------------------------------------------------------------

def index_job(where: Where, shard: ShardFile, schema: bool) -> bytes:
    """Index ``shard`` from its headers (with its schema's part when ``schema``, unless it is to
    be read in parts): the bytes of its cache entry (``IndexCache.entry_bytes``). A compressed
    shard's plain stream goes into the cache folder, where the caller finds it when it shares
    that folder (one machine); else the caller inflates it again."""
    cache = IndexCache(where.cache_dir, shardjobs.readers_of(where, shard), shardjobs.WhereFiles(where))
    idx = cache.build(shard)
    if schema and not shardjobs.large(shard, idx.count):
        # Reading every record for the schema, the data checksums are checked on the way (for
        # little more): a copy of the shard (``reshard``) then need not read them again.
        failed: list[int] = []
        idx.tally = _tally_of_index(cache, idx, failed)
        idx.checked = tuple(failed)
    return cache.entry_bytes(idx)


def _tally_of_index(cache: IndexCache, idx: ShardIndex, failed: list[int] | None = None) -> shardschema.Tally:
    reader = cache.readers.open(idx.data_path)
    try:
        scanner = shardschema.Scanner(idx.detected_kind)
        shardschema.scan_read(scanner, reader.pread, idx.offsets, idx.bad, failed)
        return scanner.flush()
    finally:
        reader.close()


def tally_job(where: Where, shard: ShardFile, data_path: str, stream_size: int, kind: str, offsets: bytes,
              typecode: str, first: int, skip: tuple[int, ...]) -> tuple[dict, list[int]]:
    """The tally (``Tally.to_json``) of the records whose offsets are ``offsets`` (an array of
    ``typecode``; the first is record ``first``'s), leaving out ``skip``, and the records whose
    data checksums fail (checked on the way, as ``index_job`` checks them). A compressed shard
    is read from its inflated stream at ``data_path`` when this process sees it there, else
    inflated anew."""
    spans = array(typecode)
    spans.frombytes(offsets)
    scanner = shardschema.Scanner(kind)
    skipped = {i - first for i in skip}
    failed: list[int] = []
    if shard.compression != tfrecord.NONE and shardjobs.holds_stream(data_path, stream_size):
        with open(data_path, "rb") as f:
            fd = f.fileno()
            shardschema.scan_read(scanner, lambda n, off: os.pread(fd, n, off), spans, skipped, failed)
    else:
        with shardjobs.plain_stream(where, shard) as (pread, _, _):
            shardschema.scan_read(scanner, pread, spans, skipped, failed)
    return scanner.flush().to_json(), [first + i for i in failed]


def read_tallies(runner: jobs.Runner, where: Where, indexes: Sequence[ShardIndex], kinds: Sequence[str],
                 keep: Callable[[int, ShardIndex, shardschema.Tally], None],
                 progress: Callable[[int, int], None] | None = None) -> None:
    """Read the tallies that ``indexes`` lack (as ``kinds``), a job per shard or part of one;
    ``keep(n, index, tally)`` takes each shard's whole tally, in shard order."""
    todo: list[jobs.Job] = []
    owner: list[int] = []
    for n, idx in enumerate(indexes):
        tally = idx.tally
        if tally is not None and tally.kind == kinds[n]:
            continue
        offsets = idx.offsets
        stream_size = idx.shard.size if idx.shard.compression == tfrecord.NONE else shardjobs.stream_size(idx)
        cuts = shardjobs.parts(offsets, idx.ends, stream_size) if idx.shard.compression == tfrecord.NONE and \
            shardjobs.large(idx.shard, idx.count) else [shardjobs.Part(0, idx.count, 0, stream_size)]
        for p in cuts:
            if p.last <= p.first and len(cuts) > 1:
                continue
            skip = tuple(sorted(i for i in idx.bad if p.first <= i < p.last))
            todo.append((where, idx.shard, idx.data_path, stream_size, kinds[n],
                         bytes(offsets[p.first:p.last + 1]), idxfile.typecode(offsets), p.first, skip))
            owner.append(n)
        idx.drop_offsets()
    if not todo:
        return
    total = sum(indexes[n].count for n in dict.fromkeys(owner))
    done = [0]

    def finished(k: int, _: Any) -> None:
        job = todo[k]
        done[0] += len(job[5]) // array(job[6]).itemsize - 1
        if progress is not None:
            progress(done[0], total)
    whole: shardschema.Tally | None = None
    failed: list[int] = []
    for k, (got, bad) in enumerate(shardjobs.gather(runner, tally_job, todo, finished)):
        n = owner[k]
        if whole is None:
            whole = shardschema.Tally(kinds[n])
        part = shardschema.Tally.from_json(got)
        assert part is not None
        whole.add(part)
        failed += bad
        if k + 1 == len(owner) or owner[k + 1] != n:
            indexes[n].checked = tuple(sorted(failed))   # every record was read: as index_job does
            keep(n, indexes[n], whole)
            whole, failed = None, []


