"""What the shard jobs of ``index``, ``verify``, ``inspect``, ``repair`` and ``commit SOURCE`` (SPEC 8)
share: cutting a large shard in parts, reaching a shard's plain stream from any process, and
gathering the results in job order. The jobs themselves live with their commands
(``indexing.index_job`` and ``tally_job``, ``verify.verify_job``, ``repair.repair_job``,
``repack.write_job``); the runners of ``jobs`` run them here, in local worker processes or as
Ray tasks.

A job is one shard, or one part of a large one: an uncompressed shard of more than
``SPLIT_BYTES`` bytes or ``SPLIT_RECORDS`` records whose index is known is cut at record
boundaries the index gives (``parts``), never right after a gap, so that a walk of a part finds
exactly what the walk of the whole shard finds there. A job reads through ``index.where.Where`` (a local
path or a bucket), streams (records one at a time; a compressed shard is inflated into a
temporary file, as far as it goes), and returns something small: an index file's bytes, a
``verify.ShardReport``, a tally as JSON, a ``repair.Repaired``. The caller merges the parts of a
shard and alone writes what the command writes.

The limits can be lowered for tests and experiments by the environment: ``TFRFS_SPLIT_BYTES``
and ``TFRFS_SPLIT_RECORDS`` (whole numbers).
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from tfrfs.index import idxfile
from tfrfs.jobs import runner as jobs
from tfrfs.index.shard_index import ShardIndex
from tfrfs.index.discovery import ShardFile


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


def holds_stream(path: str, size: int) -> bool:
    try:
        return os.path.getsize(path) == size
    except OSError:
        return False


def stream_size(idx: ShardIndex) -> int:
    try:
        return os.path.getsize(idx.data_path)
    except OSError:
        return idx.offsets[-1] if idx.count else 0
