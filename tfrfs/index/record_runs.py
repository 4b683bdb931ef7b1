"""A run of a shard's records read in order, a large block at a time, every checksum checked: what
``tfrfs.open(...).records`` and the Ray Data source's read tasks stream.

A run is cut from the index (``span_of``) and then read without it: the records lie back to back
from ``start`` to ``end`` except after a gap of damaged bytes (SPEC 6), whose few resume points
travel with the run. So a read task is sent five numbers and a short tuple, never a shard's
offsets, and memory stays at one block whatever the run's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from tfrfs.errors import DamagedRecord
from tfrfs.index.shard_index import ShardIndex
from tfrfs.format.tfrecord import FOOTER, HEADER, OVERHEAD, PRead, check_data, parse_header

BLOCK = 4 << 20   # bytes read at once (a record larger than this is read alone)


@dataclass(frozen=True)
class Span:
    """Records ``first`` .. ``stop - 1`` of a shard, framed in bytes [``start``, ``end``) of its
    (inflated) stream; ``resumes``: (index, where the next record starts) for each record of the
    run that a gap follows."""

    first: int
    stop: int
    start: int
    end: int
    resumes: tuple[tuple[int, int], ...] = ()

    @property
    def records(self) -> int:
        return self.stop - self.first


def span_of(idx: ShardIndex, first: int, stop: int) -> Span:
    """The run of records ``first`` .. ``stop - 1`` of an indexed shard (``first < stop``)."""
    offsets = idx.offsets
    ends = idx.ends
    end = ends.get(stop - 1, offsets[stop]) if ends else offsets[stop]
    resumes = tuple((i, offsets[i + 1]) for i in sorted(ends) if first <= i < stop - 1) if ends else ()
    return Span(first, stop, offsets[first], end, resumes)


def walk(pread: PRead, span: Span, shard: str) -> Iterator[tuple[int, int, bytes | DamagedRecord]]:
    """``(index, header offset, data)`` for every record of ``span``, read through ``pread``; a
    record that cannot be served (data checksum, cut short) comes as a ``DamagedRecord`` in place
    of its data, and the walk goes on. A header that does not check where the index put one (the
    shard changed since it was indexed) ends the walk with a ``DamagedRecord``."""
    resumes = dict(span.resumes)
    buf = b""
    base = pos = span.start
    for i in range(span.first, span.stop):
        rel = pos - base
        if rel + HEADER > len(buf):
            buf, base, rel = pread(min(BLOCK, max(HEADER, span.end - pos)), pos), pos, 0
        head = buf[rel:rel + HEADER]
        length = parse_header(head) if len(head) == HEADER else None
        if length is None:
            yield i, pos, DamagedRecord(shard, i, pos, "no sound record header where the index has one (the shard "
                                                       "changed since it was indexed); the rest of the run is not read")
            return
        need = OVERHEAD + length
        if rel + need <= len(buf):
            body = buf[rel + HEADER:rel + need]
        elif need > BLOCK:
            body = pread(length + FOOTER, pos + HEADER)
        else:
            buf, base, rel = pread(min(BLOCK, max(need, span.end - pos)), pos), pos, 0
            body = buf[HEADER:need]
        data = body[:length]
        if len(body) < length + FOOTER:
            yield i, pos, DamagedRecord(shard, i, pos, "the record is cut short")
        elif not check_data(body[length:], data):
            yield i, pos, DamagedRecord(shard, i, pos, "data checksum failed")
        else:
            yield i, pos, data
        pos = resumes.get(i, pos + need)
