"""``tfrfs verify`` (SPEC 6): every checksum and every parse, shard by shard, without mounting.

The records are walked as the index builder walks them (``salvage.Walk``), reading every byte:
a damaged shard reports each gap, each record whose data checksum fails, each record that does
not parse, and the damage of a compressed stream. Nothing is called clean that is not.
"""

from __future__ import annotations

import functools
import os
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable, Iterator

from . import salvage, tfrecord
from .index import ShardFile, detect_kind, parse_problem
from .sources import Source
from .tfrecord import Problem

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


def verify_shard(shard: ShardFile, source: Source, records: str | None = None,
                 done: BytesDone | None = None) -> ShardReport:
    """Check the framing, both checksums and the parse of every record of one shard.

    Memory stays flat: records are read one at a time, and a compressed shard is first inflated
    (as far as it goes) into an anonymous temporary file.
    """
    report = ShardReport(shard)
    stream_problem = None
    with ExitStack() as stack:
        if shard.compression != tfrecord.NONE:
            tmp = stack.enter_context(tempfile.TemporaryFile())
            with source.discovery.access.open_stream(shard.path) as src:
                stream_problem = salvage.inflate(src, tmp, shard.compression)
            tmp.flush()
            fd = tmp.fileno()
            size = os.fstat(fd).st_size
            pread: tfrecord.PRead = functools.partial(os.pread, fd)
        else:
            reader = source.readers.open(shard.path)
            stack.callback(reader.close)
            pread, size = reader.pread, reader.size
        if records is None:
            records = detect_kind(_sound_records(pread, size))
        report.kind = records
        walk = salvage.Walk(pread, size, with_data=True)
        found: list[Problem] = []
        for index, (offset, length, data) in enumerate(walk):
            assert data is not None
            if not walk.ok:
                found.append(Problem(offset, f"data checksum failed for the record at offset {offset}", index))
            elif why := parse_problem(data, records):
                found.append(Problem(offset, why, index))
                report.unparsable.add(index)
            report.data_bytes += length
            if done is not None and index % 1024 == 0:
                done(offset)
        report.records = walk.count
        report.problems = sorted(salvage.merge_stream_problem(stream_problem, walk) + found,
                                 key=lambda p: p.offset)
    return report


def _sound_records(pread: tfrecord.PRead, size: int) -> Iterator[bytes]:
    """The records whose data checksums hold, from the start (for ``detect_kind``)."""
    walk = salvage.Walk(pread, size, with_data=True)
    for _, length, data in walk:
        if walk.ok and length:
            assert data is not None
            yield data


def verify_source(source: Source, records: str | None = None,
                  progress: Callable[[ShardFile, int, int], None] | None = None) -> Iterator[ShardReport]:
    """Every shard's report, in order; ``progress(shard, shards done, stream bytes done)``."""
    for n, shard in enumerate(source.discovery.shards):
        done = None if progress is None else (lambda b, s=shard, k=n: progress(s, k, b))
        yield verify_shard(shard, source, records, done)
        if progress is not None:
            progress(shard, n + 1, 0)
