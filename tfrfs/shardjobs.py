"""The shard jobs of ``index``, ``verify``, ``inspect`` and ``repair`` (SPEC 8), as the runners of
``jobs`` run them: in this process, in local worker processes, or as Ray tasks.

A job is one shard, or one part of a large one: an uncompressed shard of more than
``SPLIT_BYTES`` bytes or ``SPLIT_RECORDS`` records whose index is known is cut at record
boundaries the index gives (``parts``), never right after a gap, so that a walk of a part finds
exactly what the walk of the whole shard finds there. A job reads through ``jobs.Where`` (a local
path or a bucket), streams (records one at a time; a compressed shard is inflated into a
temporary file, as far as it goes), and returns something small: an index file's bytes, a
``verify.ShardReport``, a tally as JSON, a ``repair.Repaired``. The caller merges the parts of a
shard and alone writes what the command writes.

The limits can be lowered for tests and experiments by the environment: ``TFRFS_SPLIT_BYTES``
and ``TFRFS_SPLIT_RECORDS`` (whole numbers).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import tempfile
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from . import idxfile, jobs, salvage, shardschema, tfrecord
from .index import IndexCache, ShardFile, ShardIndex, SourceFiles
from .jobs import Where

if TYPE_CHECKING:
    from .verify import ShardReport


def _env_int(name: str, default: int) -> int:
    try:
        return max(1, int(os.environ[name]))
    except (KeyError, ValueError):
        return default


SPLIT_BYTES = _env_int("TFRFS_SPLIT_BYTES", 256 << 20)     # a shard longer than this is cut in parts ...
SPLIT_RECORDS = _env_int("TFRFS_SPLIT_RECORDS", 1 << 20)   # ... and so is one with more records


@dataclass(frozen=True)
class Part:
    """Records ``first``..``last - 1`` of a plain stream, in its bytes [``start``, ``stop``)."""

    first: int
    last: int
    start: int
    stop: int


def large(shard: ShardFile, count: int) -> bool:
    return shard.size > SPLIT_BYTES or count > SPLIT_RECORDS


def parts(offsets: idxfile.Offsets, ends: dict[int, int], size: int) -> list[Part]:
    """The parts of a stream of ``size`` bytes whose index is ``offsets`` (header offsets and the
    end of the last record) and ``ends`` (records a gap follows), each at most about
    ``SPLIT_BYTES`` and ``SPLIT_RECORDS``. A part starts at a record whose predecessor ends right
    there (no gap between them), so a walk from it judges every byte as the whole walk does; the
    first part starts at 0 and the last ends at ``size`` (damage before the first record and
    after the last is theirs)."""
    count = len(offsets) - 1
    out: list[Part] = []
    first, start = 0, 0
    while True:
        cut = min(first + SPLIT_RECORDS, bisect.bisect_left(offsets, start + SPLIT_BYTES, first + 1, count + 1))
        cut = max(cut, first + 1)
        while cut < count and (cut - 1) in ends:
            cut += 1
        if cut >= count:
            out.append(Part(first, count, start, size))
            return out
        out.append(Part(first, cut, start, offsets[cut]))
        first, start = cut, offsets[cut]


# --- running jobs -------------------------------------------------------------------------------

def gather(runner: jobs.Runner, fn: Callable[..., Any], todo: Sequence[jobs.Job],
           done: Callable[[int, Any], None] | None = None) -> Iterator[Any]:
    """``fn(*job)`` for every job, in job order; ``done(n, result)`` as each finishes (progress).
    A single job is not worth a local process: it runs here."""
    if len(todo) == 1 and isinstance(runner, jobs.LocalPool):
        runner = jobs.InProcess()
    waiting: dict[int, Any] = {}
    nxt = 0
    for n, result in runner.run(fn, todo):
        if done is not None:
            done(n, result)
        waiting[n] = result
        while nxt in waiting:
            yield waiting.pop(nxt)
            nxt += 1


class _WhereFiles(SourceFiles):
    """A job's way to a shard's stored bytes (a compressed shard, to inflate)."""

    def __init__(self, where: Where) -> None:
        super().__init__("/")
        self.where = where

    def open_stream(self, path: str) -> Any:
        return self.where.open_stream(path)


def readers_of(where: Where, shard: ShardFile) -> Any:
    """``where``'s readers, told the shard's size and identity as the caller saw them (no look-up)."""
    readers = where.readers()
    know = getattr(readers, "know", None)
    if know is not None:
        from .remote import ObjectInfo
        know([ObjectInfo(shard.path, shard.size, shard.identity, shard.mtime_ns)])
    return readers


@contextlib.contextmanager
def plain_stream(where: Where, shard: ShardFile) -> Iterator[tuple[tfrecord.PRead, int, Any]]:
    """(pread, size, the problem that ended the inflation or None) of the shard's plain stream:
    read in place, or inflated into a temporary file first (GZIP, ZLIB)."""
    if shard.compression == tfrecord.NONE:
        reader = readers_of(where, shard).open(shard.path)
        try:
            yield reader.pread, reader.size, None
        finally:
            reader.close()
        return
    with tempfile.TemporaryFile() as tmp:
        with where.open_stream(shard.path) as src:
            problem = salvage.inflate(src, tmp, shard.compression)
        tmp.flush()
        fd = tmp.fileno()
        yield (lambda n, off: os.pread(fd, n, off)), os.fstat(fd).st_size, problem


# --- the jobs -----------------------------------------------------------------------------------

def index_job(where: Where, shard: ShardFile, schema: bool) -> bytes:
    """Index ``shard`` from its headers (with its schema's part when ``schema``, unless it is to
    be read in parts): the bytes of its cache entry (``IndexCache.entry_bytes``). A compressed
    shard's plain stream goes into the cache folder, where the caller finds it when it shares
    that folder (one machine); else the caller inflates it again."""
    cache = IndexCache(where.cache_dir, readers_of(where, shard), _WhereFiles(where))
    idx = cache.build(shard)
    if schema and not large(shard, idx.count):
        idx.tally = _tally_of_index(cache, idx)
    return cache.entry_bytes(idx)


def _tally_of_index(cache: IndexCache, idx: ShardIndex) -> shardschema.Tally:
    reader = cache.readers.open(idx.data_path)
    try:
        scanner = shardschema.Scanner(idx.detected_kind)
        shardschema.scan_read(scanner, reader.pread, idx.offsets, idx.bad)
        return scanner.flush()
    finally:
        reader.close()


def tally_job(where: Where, shard: ShardFile, data_path: str, stream_size: int, kind: str, offsets: bytes,
              typecode: str, first: int, skip: tuple[int, ...]) -> dict:
    """The tally (``Tally.to_json``) of the records whose offsets are ``offsets`` (an array of
    ``typecode``; the first is record ``first``'s), leaving out ``skip``. A compressed shard is
    read from its inflated stream at ``data_path`` when this process sees it there, else
    inflated anew."""
    spans = array(typecode)
    spans.frombytes(offsets)
    scanner = shardschema.Scanner(kind)
    skipped = {i - first for i in skip}
    if shard.compression != tfrecord.NONE and _holds_stream(data_path, stream_size):
        with open(data_path, "rb") as f:
            fd = f.fileno()
            shardschema.scan_read(scanner, lambda n, off: os.pread(fd, n, off), spans, skipped)
    else:
        with plain_stream(where, shard) as (pread, _, _):
            shardschema.scan_read(scanner, pread, spans, skipped)
    return scanner.flush().to_json()


def _holds_stream(path: str, size: int) -> bool:
    try:
        return os.path.getsize(path) == size
    except OSError:
        return False


def verify_job(where: Where, shard: ShardFile, records: str | None, part: Part | None) -> "ShardReport":
    """``verify.verify_shard`` of the shard, or of one part of it (``records``: the kind)."""
    from .verify import verify_shard
    return verify_shard(shard, lambda: plain_stream(where, shard), records, part=part)


def repair_job(where: Where, report: "ShardReport", dry_run: bool) -> Any:
    """``repair.rewrite``: the damaged shard's sound records into a temporary file beside it, or
    a temporary object beside it in a bucket (the caller puts it in place)."""
    from .repair import rewrite
    return rewrite(where, report, dry_run)


# --- the schema's parts of many shards ----------------------------------------------------------

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
        stream_size = idx.shard.size if idx.shard.compression == tfrecord.NONE else _stream_size(idx)
        cuts = parts(offsets, idx.ends, stream_size) if idx.shard.compression == tfrecord.NONE and \
            large(idx.shard, idx.count) else [Part(0, idx.count, 0, stream_size)]
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
    for k, got in enumerate(gather(runner, tally_job, todo, finished)):
        n = owner[k]
        if whole is None:
            whole = shardschema.Tally(kinds[n])
        part = shardschema.Tally.from_json(got)
        assert part is not None
        whole.add(part)
        if k + 1 == len(owner) or owner[k + 1] != n:
            keep(n, indexes[n], whole)
            whole = None


def _stream_size(idx: ShardIndex) -> int:
    try:
        return os.path.getsize(idx.data_path)
    except OSError:
        return idx.offsets[-1] if idx.count else 0
