"""``tfrfs verify`` (SPEC 6): every checksum and every parse, shard by shard, without mounting.

The records are walked as the index builder walks them (``salvage.Walk``), reading every byte:
a damaged shard reports each gap, each record whose data checksum fails, each record that does
not parse, and the damage of a compressed stream. Nothing is called clean that is not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ContextManager, Iterator

from tfrfs.jobs import runner as jobs
from tfrfs.format import bulk, salvage
from tfrfs.jobs import shard_work as shardjobs
from tfrfs.format import tfrecord
from tfrfs.format.record_kinds import choose_kind, parse_problem
from tfrfs.index.shard_index import IndexCache
from tfrfs.index.discovery import ShardFile
from tfrfs.index.where import Where, plain_stream, stream_of
from tfrfs.jobs.shard_work import Part
from tfrfs.index.opened import OpenedSource
from tfrfs.format.tfrecord import Problem

BytesDone = Callable[[int], None]   # bytes of the current shard's stream checked so far


@dataclass
class ShardReport:
    shard: ShardFile
    records: int = 0
    kind: str = "example"
    problems: list[Problem] = field(default_factory=list)
    unparsable: set[int] = field(default_factory=set)   # sound records that do not parse as ``kind``
    data_bytes: int = 0            # the records' data, without framing

    @property
    def damaged(self) -> bool:
        """Whether bytes of the shard are lost (not merely records that do not parse): what
        ``repair`` mends."""
        return len(self.problems) > len(self.unparsable)

    def as_json(self) -> dict:
        return {"shard": self.shard.relpath, "records": self.records, "kind": self.kind,
                "compression": self.shard.compression,
                "problems": [dict(p.fields(), shard=self.shard.relpath) for p in self.problems]}


Stream = Callable[[], ContextManager[tuple[tfrecord.PRead, int, "Problem | None"]]]
"""Opens a shard's plain stream: (pread, size, the problem that ended its inflation or None)."""


def verify_shard(shard: ShardFile, stream: Stream, records: str | None = None,
                 done: BytesDone | None = None, part: Part | None = None) -> ShardReport:
    """Check the framing, both checksums and the parse of every record of one shard, or of one
    ``part`` of it (records numbered as in the whole shard; ``records``, the kind, must then be
    given: it is the whole shard's).

    Memory stays flat: records are read one at a time, and a compressed shard is first inflated
    (as far as it goes) into an anonymous temporary file.
    """
    report = ShardReport(shard)
    with stream() as (pread, size, stream_problem):
        if records is None:
            records = choose_kind(_sound_records(pread, size))
        report.kind = records
        first = part.first if part is not None else 0
        walk = salvage.Walk(pread, part.stop if part is not None else size, with_data=True, count=first,
                            start=part.start if part is not None else 0)
        found: list[Problem] = []
        if bulk.available():
            _check_runs(walk, records, report, found, done)
        else:
            for index, (offset, length, data) in enumerate(walk, first):
                assert data is not None
                if not walk.ok:
                    found.append(Problem(offset, _checksum_failed(offset), index))
                elif why := parse_problem(data, records):
                    found.append(Problem(offset, why, index))
                    report.unparsable.add(index)
                report.data_bytes += length
                if done is not None and index % 1024 == 0:
                    done(offset)
        report.records = walk.count - first
        report.problems = sorted(salvage.merge_stream_problem(stream_problem, walk) + found,
                                 key=lambda p: p.offset)
    return report


def _checksum_failed(offset: int) -> str:
    return f"data checksum failed for the record at offset {offset}"


def _check_runs(walk: salvage.Walk, kind: str, report: ShardReport, found: list[Problem],
                done: BytesDone | None) -> None:
    """The loop of ``verify_shard`` over runs of records checked in C (``salvage.Walk.runs``): the
    same problems, the records C cannot vouch for parsed here."""
    for run in walk.runs(kind):
        first = walk.count
        offsets = run.offsets
        for i in run.failed:
            found.append(Problem(offsets[i], _checksum_failed(offsets[i]), first + i))
        for i in run.unsure:
            if why := parse_problem(bytes(run.data(i)), kind):
                found.append(Problem(offsets[i], why, first + i))
                report.unparsable.add(first + i)
        report.data_bytes += run.data_bytes
        if done is not None:
            done(offsets[-1])


def merge(parts: list[ShardReport]) -> ShardReport:
    """The report of a shard verified in parts (in order)."""
    whole = ShardReport(parts[0].shard, kind=parts[0].kind)
    for r in parts:
        whole.records += r.records
        whole.problems += r.problems
        whole.unparsable |= r.unparsable
        whole.data_bytes += r.data_bytes
    return whole


def shard_kind(pread: tfrecord.PRead, size: int) -> str:
    """The record kind ``verify_shard`` finds for a whole shard."""
    return choose_kind(_sound_records(pread, size))


def _sound_records(pread: tfrecord.PRead, size: int) -> Iterator[bytes]:
    """The records whose data checksums hold, from the start (for ``choose_kind``)."""
    walk = salvage.Walk(pread, size, with_data=True)
    for _, length, data in walk:
        if walk.ok and length:
            assert data is not None
            yield data


def local_stream(source: OpenedSource, shard: ShardFile) -> Stream:
    """How ``verify_shard`` reads a shard of an opened SOURCE in this process."""
    return lambda: stream_of(shard, lambda: source.readers.open(shard.path),
                                       source.discovery.access.open_stream)


Progress = Callable[[int, int, int, int], None]   # (shards done, records, stream bytes done, bytes in all)


def verify_source(source: OpenedSource, records: str | None = None, progress: Progress | None = None,
                  runner: "jobs.Runner | None" = None) -> Iterator[ShardReport]:
    """Every shard's report, in order, from jobs on ``runner`` (this process by default): one
    per shard, or per part of a large uncompressed shard whose index is known."""
    runner = runner or jobs.InProcess()
    where = Where.of(source)
    shards = source.discovery.shards
    todo: list[jobs.Job] = []
    owner: list[int] = []
    for n, shard in enumerate(shards):
        cuts = _parts(source, shard)
        kind = records
        if cuts is not None and kind is None:
            with local_stream(source, shard)() as (pread, size, _):
                kind = shard_kind(pread, size)
        pieces: list[Part | None] = list(cuts) if cuts else [None]
        for part in pieces:
            todo.append((where, shard, kind, part))
            owner.append(n)
    total = sum(s.size for s in shards)
    left = {n: owner.count(n) for n in set(owner)}
    tally = {"shards": 0, "records": 0, "bytes": 0}

    def finished(k: int, report: ShardReport) -> None:
        n = owner[k]
        part = todo[k][3]
        left[n] -= 1
        tally["shards"] += left[n] == 0
        tally["records"] += report.records
        tally["bytes"] += shards[n].size if part is None else part.stop - part.start
        if progress is not None:
            progress(tally["shards"], tally["records"], min(tally["bytes"], total), total)
    got: list[ShardReport] = []
    for k, report in enumerate(shardjobs.gather(runner, verify_job, todo, finished)):
        got.append(report)
        if k + 1 == len(owner) or owner[k + 1] != owner[k]:
            yield got[0] if len(got) == 1 else merge(got)
            got = []


def _parts(source: OpenedSource, shard: ShardFile) -> "list[Part] | None":
    """The parts a large uncompressed shard is verified in, when its index is at hand (in the
    cache, or shipped beside it); else None (one job)."""
    if shard.compression != tfrecord.NONE or shard.size <= shardjobs.SPLIT_BYTES and \
            shard.size <= shardjobs.SPLIT_RECORDS * tfrecord.OVERHEAD:
        return None
    cache = IndexCache(source.cache_dir, source.readers, source.discovery.access)
    idx = cache.load(shard)
    if idx is None and shard.shipped:
        idx, _ = cache.from_shipped(shard)
    if idx is None or not shardjobs.large(shard, idx.count):
        return None
    cuts = shardjobs.parts(idx.offsets, idx.ends, shard.size)
    idx.drop_offsets()
    return cuts if len(cuts) > 1 else None


def verify_job(where: Where, shard: ShardFile, records: str | None, part: Part | None) -> ShardReport:
    """``verify.verify_shard`` of the shard, or of one part of it (``records``: the kind)."""
    return verify_shard(shard, lambda: plain_stream(where, shard), records, part=part)
