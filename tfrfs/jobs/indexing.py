"""Indexing shards on every core (``tfrfs index``, the cold part of a mount), or as shard jobs on
any runner.

A shard's index is found by walking its headers from the first record to the last: one shard is
one job (``index_job``), and the shards of a dataset are walked side by side on a runner
(``jobs.runner``: by default one local worker process per core, never forked from a daemon's
threads). A job sends back its cache entry's bytes; the caller writes them into the cache and
loads each index from there, as a later mount would. ``tfrfs index`` also asks the job for the
shard's part of the schema (``shardschema``): it reads the records just after walking them, while
they are in the page cache, and the tally goes into the same index file.

Remote shards are not for a local pool (their requests overlap in threads instead), and so few
bytes that starting workers would cost more than it saves are indexed in the calling process.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
from typing import Any, Callable, Iterable, Sequence

from array import array

from tfrfs.index import idxfile
from tfrfs.jobs import runner as jobs
from tfrfs.jobs import shard_work as shardjobs
from tfrfs.index import shardschema
from tfrfs.format import tfrecord
from tfrfs.index.shard_index import IndexCache, ShardIndex
from tfrfs.index.discovery import ShardFile, SourceFiles
from tfrfs.index.where import Where, WhereFiles, plain_stream, readers_of

log = logging.getLogger("tfrfs")

POOL_BYTES = 64 << 20     # fewer bytes to walk than this in all: walked here (a worker takes ~0.1 s to start)

def poolable(shard: ShardFile, cache: IndexCache) -> bool:
    """Whether a worker can index ``shard`` as ``cache`` would: a local file, read by the local
    readers, through the local files."""
    from tfrfs.storage.local_reader import LocalReaders
    return type(cache.readers) is LocalReaders and type(cache.files) is SourceFiles


def worth_a_pool(shards: list[ShardFile]) -> bool:
    return len(shards) > 1 and jobs.cores() > 1 and sum(s.size for s in shards) >= POOL_BYTES


def local_where(cache: IndexCache) -> Where:
    """A ``Where`` for local shards indexed into ``cache`` (any local path opens the local
    readers a worker needs; only shards ``poolable`` says yes to go to workers)."""
    return Where(os.sep, (), str(cache.dir))


# --- the one shard job: a shard's index -----------------------------------------------------------

def index_job(where: Where, shard: ShardFile, schema: bool, local: bool = False) -> bytes | str:
    """Index ``shard`` from its headers (with its schema's part when ``schema``, unless it is to
    be read in parts): the bytes of its cache entry (``IndexCache.entry_bytes``), which the caller
    writes into the cache. A compressed shard's plain stream goes into the cache folder, where the
    caller finds it when it shares that folder (one machine); else the caller inflates it again.
    ``local``: a job of a pool on the caller's machine, which shares its cache folder: the job
    writes the entry there itself and sends back nothing (no copy of the offsets through a
    pipe), and a failure is returned as text (why) instead of raised, so that one shard does not
    end the pool's whole run; the caller then indexes that shard itself (and raises what it
    raises)."""
    try:
        cache = IndexCache(where.cache_dir, readers_of(where, shard), WhereFiles(where))
        walked = _WalkTally(cache, shard) if schema and _WalkTally.suits(shard) else None
        try:
            idx = cache.build(shard, walked.block if walked is not None else None)
            if schema and not shardjobs.large(shard, idx.count):
                # Reading every record for the schema, the data checksums are checked on the way
                # (for little more): a copy of the shard (``reshard``) then need not read them again.
                got = walked.finish(idx) if walked is not None else None
                failed: list[int] = []
                idx.tally, idx.checked = got if got is not None else (_tally_of_index(cache, idx, failed),
                                                                       tuple(failed))
        finally:
            if walked is not None:
                walked.close()
        data = cache.entry_bytes(idx)
        if local:
            cache.save_bytes(shard, data)
            return b""
        return data
    except Exception as exc:  # noqa: BLE001 - whatever it was, the job is done again by the caller
        if not local:
            raise
        return str(exc or type(exc).__name__)


def _loaded(cache: IndexCache, shard: ShardFile, data: bytes) -> ShardIndex:
    """``data`` (a job's ``index_job`` bytes; none when the job wrote them itself) written into the
    cache, and the index loaded from there, as a later mount loads it."""
    if data:
        cache.save_bytes(shard, data)
    idx = cache.load(shard)
    if idx is None:
        # Not in the cache after all (it cannot be written, or a compressed shard whose stream a
        # job on another machine made): indexed here.
        return cache.get(shard)[0]
    cache.scans += 1
    return idx


Done = Callable[[int, ShardIndex], None]   # (the shard's position in the list, its index)


def build_all(where: Where, shards: list[tuple[int, ShardFile]], cache: IndexCache, done: Done,
              runner: jobs.Runner | None = None, schema: bool = False) -> None:
    """Index ``shards`` (each with its position in the caller's list) by ``index_job`` on
    ``runner`` (a pool of local processes by default), the largest first; ``done`` is called with
    each index, loaded from the cache, as it is ready. A job that fails in its worker, or that the
    workers could not run, is done here (where its error, if any, is raised as the calling
    process would raise it), after one message saying so."""
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
        for k, got in run.run(index_job, [(where, shard, schema, True) for _, shard in order]):
            n, shard = order[k]
            if isinstance(got, str):
                log.warning("%s: indexing it in a worker process failed (%s); it is indexed in this process",
                            shard.relpath, got)
                continue
            del left[n]
            done(n, _loaded(cache, shard, got))
    except jobs.WorkersLost as exc:
        log.warning("a process indexing shards stopped (%s); the shards it had not indexed are indexed "
                    "in this process", exc)
    finally:
        if own:
            run.close()
    for n, shard in sorted(left.items()):
        done(n, _here(where, cache, shard, schema))


def _here(where: Where, cache: IndexCache, shard: ShardFile, schema: bool) -> ShardIndex:
    """``shard`` indexed in this process: by the cache (as a mount does), or with its schema's
    part by the job itself (so that its cache entry is the one a worker would have written)."""
    if not schema:
        return cache.get(shard)[0]
    got = index_job(where, shard, schema)
    assert isinstance(got, bytes)
    return _loaded(cache, shard, got)


# --- the indexes of many shards, in order --------------------------------------------------------

ProgressFn = Callable[[int, int, int], None]   # (shards done, shards total, records so far)
SourceProgress = Callable[[int, int, int, int, int], None]   # as ``index.IndexProgress``


def index_shards(shards: Sequence[ShardFile], cache: IndexCache, where: Where, progress: SourceProgress | None,
                 *, runner: jobs.Runner | None = None, schema: bool = False, workers: int = 1) -> list[ShardIndex]:
    """Every shard's index, in order: those in ``cache`` or shipped beside their shards are taken
    here; the others are ``index_job``s (``schema``: with their schema's part). Without a
    ``runner``, on a local pool when there are enough bytes to walk (else here), or ``workers``
    at a time in threads (shards in a store: their requests overlap); with one, as shard jobs on
    it (a store's shards on Ray only: without Ray, threads here still do it best), whose index
    files this process writes into the cache and loads from there, so the indexes are those one
    process makes, byte for byte."""
    shards = list(shards)
    if runner is None or (workers > 1 and not isinstance(runner, jobs.RayRunner)):
        upto = [0, *itertools.accumulate(s.size for s in shards)]   # bytes of the first n shards

        def report(done: int, total: int, records: int) -> None:
            if progress is not None:
                progress(done, total, records, upto[done], upto[-1])
        return index_all(shards, cache, report, workers, where=where, schema=schema)
    found: dict[int, ShardIndex] = {}
    total_bytes = sum(s.size for s in shards)
    done_bytes = 0
    records = 0

    def done(n: int, idx: ShardIndex) -> None:
        nonlocal done_bytes, records
        found[n] = idx
        records += idx.count
        done_bytes += shards[n].size
        if progress is not None:
            progress(len(found), len(shards), records, done_bytes, total_bytes)
    cold = _cold(shards, cache, done)
    todo = [(where, shards[n], schema) for n in cold]
    for n, data in zip(cold, shardjobs.gather(runner, index_job, todo)):
        done(n, _loaded(cache, shards[n], data))
    return [found[n] for n in range(len(shards))]


def index_all(shards: Iterable[ShardFile], cache: IndexCache, progress: ProgressFn | None = None,
              workers: int = 1, *, where: Where | None = None, schema: bool = False) -> list[ShardIndex]:
    """Every shard's index, in order; ``workers`` shards at a time (remote shards: the requests
    of many shards overlap; their schema's parts are read later, by the schema)."""
    shards = list(shards)
    records = 0
    if workers <= 1 and len(shards) > 1:
        return _index_local(shards, cache, progress, where or local_where(cache), schema)
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


def _index_local(shards: list[ShardFile], cache: IndexCache, progress: ProgressFn | None, where: Where,
                 schema: bool) -> list[ShardIndex]:
    """``index_all`` of local shards: those in the cache or with an index file beside them are
    taken here, the others are walked on every core (``build_all``) when there are enough."""
    found: dict[int, ShardIndex] = {}
    records = 0

    def done(n: int, idx: ShardIndex) -> None:
        nonlocal records
        found[n] = idx
        records += idx.count
        if progress:
            progress(len(found), len(shards), records)
    scan = [(n, shards[n]) for n in _cold(shards, cache, done, lambda shard: poolable(shard, cache))]
    if worth_a_pool([s for _, s in scan]):
        build_all(where, scan, cache, done, schema=schema)
    else:
        for n, shard in scan:
            done(n, _here(where, cache, shard, schema))
    return [found[n] for n in range(len(shards))]


def _cold(shards: list[ShardFile], cache: IndexCache, done: Done,
          walkable: Callable[[ShardFile], bool] = lambda shard: True) -> list[int]:
    """The positions of the shards to walk as jobs; the others are given to ``done`` here: those
    in the cache, those with an index file beside them (read here), and those a job could not
    walk as this process would (not ``walkable``: indexed here)."""
    cold: list[int] = []
    for n, shard in enumerate(shards):
        idx = cache.load(shard)
        if idx is not None:
            done(n, idx)
        elif cache.shipped_candidates(shard) or not walkable(shard):
            done(n, cache.get(shard)[0])
        else:
            cold.append(n)
    return cold


class _WalkTally:
    """A shard's tally (its data checksums checked on the way) counted during its header walk
    (``Walk.offsets``'s ``seen``), so that indexing reads the shard once, not twice: the records
    a block of the walk holds whole are counted from that block, the others (cut by the block's
    end, large ones the walk steps over, those after a gap) are read again on their own. The
    tally is the one ``_tally_of_index`` reads after the walk, record for record.

    The records' kind is the first block's: ``choose_kind`` of its first ``KIND_SAMPLE``
    non-empty records, as ``IndexCache.build`` chooses it, when that block holds them whole with
    their checksums holding (and then it is the kind ``build`` finds). Otherwise nothing is
    counted (``finish`` gives None) and the caller reads the tally after the walk."""

    @staticmethod
    def suits(shard: ShardFile) -> bool:
        """An uncompressed shard not read in parts (where the walk reads the stream itself)."""
        return shard.compression == tfrecord.NONE and not shardjobs.large(shard, 0)

    def __init__(self, cache: IndexCache, shard: ShardFile) -> None:
        self.cache, self.shard = cache, shard
        self.scanner: shardschema.Scanner | None = None
        self.given_up = False
        self.done = 0                  # records counted, in order
        self.failed: list[int] = []    # ... whose data checksum fails
        self._reader: Any = None

    def block(self, block: bytes, base: int, out: array, taken: int, end: int) -> None:
        if self.given_up:
            return
        first = len(out) - taken
        if self.scanner is None:
            kind = self._kind(block, base, out, first, end)
            if kind is None:
                self.given_up = True
                return
            self.scanner = shardschema.Scanner(kind)
        if len(out) > shardjobs.SPLIT_RECORDS:
            self.given_up = True   # read in parts after all
            return
        # Records not counted yet that this block does not hold (after a gap, cut by the end of
        # the block before) are read on their own; then this block's records whose end it holds
        # are counted from it. (Those its end cuts are read with the next block's first ones.)
        self._count(first, out, out[first])
        limit = base + len(block)
        whole = len(out) if end <= limit else max(first, bisect.bisect_right(out, limit, first) - 1)
        view = memoryview(block)
        self._count(whole, out, out[whole] if whole < len(out) else end,
                    lambda n, off: view[off - base:off - base + n])

    def _count(self, stop: int, out: idxfile.Offsets, stop_at: int, pread: Any = None) -> None:
        """Count records ``done``..``stop-1`` (the last ending at ``stop_at``), read through
        ``pread`` (default: the shard's reader)."""
        if stop <= self.done:
            return
        assert self.scanner is not None
        offsets = array("Q", out[self.done:stop])
        offsets.append(stop_at)
        failed: list[int] = []
        shardschema.scan_read(self.scanner, pread or self._pread, offsets, set(), failed)
        self.failed += [self.done + k for k in failed]
        self.done = stop

    def _kind(self, block: bytes, base: int, out: array, first: int, end: int) -> str | None:
        from tfrfs.format.record_kinds import KIND_SAMPLE, choose_kind
        if first:
            return None
        sample: list[bytes] = []
        for k in range(len(out)):
            stop = out[k + 1] if k + 1 < len(out) else end
            if stop > base + len(block):
                return None   # the block does not hold it whole
            framed = block[out[k] - base:stop - base]
            data = framed[tfrecord.HEADER:-tfrecord.FOOTER]
            if not tfrecord.check_data(framed[-tfrecord.FOOTER:], data):
                return None   # a damaged record among them: ``build`` judges it
            if data:
                sample.append(bytes(data))
                if len(sample) == KIND_SAMPLE:
                    break
        if len(sample) < KIND_SAMPLE and end < self.shard.size:
            return None       # fewer in the block than the kind is chosen from
        return choose_kind(sample)

    def _pread(self, n: int, off: int) -> bytes:
        if self._reader is None:
            self._reader = self.cache.readers.open(self.shard.path)
        return self._reader.pread(n, off)

    def finish(self, idx: ShardIndex) -> tuple[shardschema.Tally, tuple[int, ...]] | None:
        """The tally and the records whose data checksum fails, or None (given up)."""
        if self.scanner is None or self.given_up or self.scanner.tally.kind != idx.detected_kind or idx.bad:
            return None
        self._count(idx.count, idx.offsets, idx.offsets[idx.count])   # records after the last block
        return self.scanner.flush(), tuple(self.failed)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


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
        with plain_stream(where, shard) as (pread, _, _):
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


