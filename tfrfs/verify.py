"""``tfrfs verify``: every checksum and every parse, shard by shard, without mounting."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Iterator

from . import tfrecord
from .index import Discovery, ShardFile, SourceFiles, detect_kind, parse_problem
from .tfrecord import Problem


@dataclass
class ShardReport:
    shard: ShardFile
    records: int = 0
    kind: str = "example"
    problems: list[Problem] = field(default_factory=list)


def _records(f: BinaryIO, size: int, problems: list[Problem]) -> Iterator[tuple[int, int, bytes, bool]]:
    """(index, offset, data, checksum holds) of each record, read sequentially.

    Framing problems that end the shard are appended to ``problems``.
    """
    pos = 0
    index = 0
    while pos < size:
        length, problem = tfrecord.header_problem(f.read(tfrecord.HEADER), pos, size, index)
        if length is None:
            if problem is not None:
                problems.append(problem)
            return
        body = f.read(length)
        yield index, pos, body, tfrecord.check_data(f.read(tfrecord.FOOTER), body)
        index += 1
        pos += tfrecord.OVERHEAD + length


def verify_shard(shard: ShardFile, records: str | None = None, files: SourceFiles | None = None) -> ShardReport:
    """Check framing, both checksums and parsing of every record of one shard.

    Memory stays flat: records are read one at a time, and a compressed shard
    is first inflated into an anonymous temporary file.
    """
    report = ShardReport(shard)
    files = files or SourceFiles("/")
    with files.open_stream(shard.path) as src, tempfile.TemporaryFile() as tmp:
        f: BinaryIO = src
        if shard.compression != tfrecord.NONE:
            problem = tfrecord.decompress_stream(src, tmp, shard.compression)
            if problem:
                report.problems.append(problem)
            f = tmp
        size = f.seek(0, os.SEEK_END)
        if records is None:
            f.seek(0)
            records = detect_kind(data for _, _, data, ok in _records(f, size, []) if ok and data)
        report.kind = records
        f.seek(0)
        for index, offset, data, ok in _records(f, size, report.problems):
            report.records += 1
            if not ok:
                report.problems.append(Problem(offset, f"data checksum failed for the record at offset {offset}", index))
            why = parse_problem(data, records)
            if why:
                report.problems.append(Problem(offset, why, index))
    report.problems.sort(key=lambda p: (p.offset, p.reason))
    return report


def verify_dataset(disc: Discovery, records: str | None = None,
                   progress: Callable[[str], None] | None = None) -> Iterator[ShardReport]:
    for n, shard in enumerate(disc.shards, 1):
        if progress:
            progress(f"{n}/{len(disc.shards)} shards: {shard.relpath}")
        yield verify_shard(shard, records, disc.access)
