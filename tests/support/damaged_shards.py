"""Uncompressed shards damaged in each way ``repair`` mends, and what a repair must leave of each:
the frames of the records kept, built here from the records (never by tfrfs's walk), and where
they lie in the damaged file, as stretches of kept records that lie back to back (what a copy of
the sound bytes copies, each stretch at once).

Damage at the start, in the middle and at the end; failed records side by side and around a gap;
garbage, zeros and a broken header; a file cut short in a record and in a header; a shard whose
every record fails; records on both sides of the 4 MiB block a walk reads at once, and records
larger than it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection

from support import reference
from tfrfs.format import proto

BLOCK = 4 << 20       # what a compiled walk reads at once (``salvage.BLOCK``)


@dataclass(frozen=True)
class Damaged:
    data: bytes                            # the damaged shard
    repaired: bytes                        # the shard a repair writes
    spans: tuple[tuple[int, int], ...]     # [start, end) in ``data`` of each stretch of kept records
    kept: int                              # records kept


def record(i: int, size: int = 0) -> bytes:
    """An Example with a blob of ``size`` bytes (else 20 to 600, by ``i``): no zero bytes in the
    blob, so no record header can be found inside it."""
    ex = proto.Example()
    ex.features.feature["n"].int64_list.value.append(i)
    ex.features.feature["blob"].bytes_list.value.append(bytes([i % 250 + 1]) * (size or 20 + i * 37 % 580))
    return ex.SerializeToString()


def build(records: list[bytes], *, failed: Collection[int] = (), broken: Collection[int] = (),
          before: dict[int, bytes] | None = None, cut: int = 0) -> Damaged:
    """The records framed back to back, with a data byte flipped in the records numbered in
    ``failed``, the length checksum broken in those in ``broken`` (both lost), ``before[i]`` put
    before record ``i`` (garbage: bytes in which no record starts), and the last ``cut`` bytes
    gone (with the records they end in)."""
    out = bytearray()
    kept: list[tuple[int, int]] = []
    for i, rec in enumerate(records):
        out += (before or {}).get(i, b"")
        framed = bytearray(reference.frame(rec))
        if i in failed:
            framed[reference.HEADER + len(rec) // 2] ^= 0x01
        if i in broken:
            framed[9] ^= 0x01
        if i not in failed and i not in broken:
            kept.append((len(out), len(out) + len(framed)))
        out += framed
    end = len(out) - cut
    kept = [(a, b) for a, b in kept if b <= end]
    spans: list[tuple[int, int]] = []
    for a, b in kept:
        if spans and spans[-1][1] == a:
            spans[-1] = (spans[-1][0], b)
        else:
            spans.append((a, b))
    data = bytes(out[:end])
    return Damaged(data, b"".join(data[a:b] for a, b in kept), tuple(spans), len(kept))


def shards() -> dict[str, Damaged]:
    """The damaged shards by name."""
    small = [record(i) for i in range(40)]
    garbage = bytes(range(0x80, 0xFF)) * 3
    many = [record(i) for i in range(16_000)]          # about 5 MiB: a walk reads it in two blocks
    ends, at = [], 0
    for rec in many:
        at += reference.FRAME + len(rec)
        ends.append(at)
    astride = next(i for i, e in enumerate(ends) if e > BLOCK)   # the record the first block cuts
    large = [record(0), record(1, BLOCK + 1000), record(2), record(3, BLOCK + 5), record(4, BLOCK + 77)]
    return {
        "first.tfrecord": build(small, failed={0}),
        "middle.tfrecord": build(small, failed={17}),
        "last.tfrecord": build(small, failed={39}),
        "side-by-side.tfrecord": build(small, failed={10, 11, 12}),
        "scattered.tfrecord": build(small, failed={0, 3, 20, 21, 33, 39}),
        "garbage.tfrecord": build(small, before={15: garbage}),
        "failed-around-a-gap.tfrecord": build(small, failed={14, 15}, before={15: garbage}),
        "zeros.tfrecord": build(small, failed={30}, before={8: bytes(5000)}),
        "header.tfrecord": build(small, broken={25}),
        "cut-in-a-record.tfrecord": build(small, failed={5}, cut=30),
        "cut-in-a-header.tfrecord": build(small + [b""], cut=reference.FRAME - 5),
        "all-failed.tfrecord": build(small[:6], failed=set(range(6))),
        "blocks.tfrecord": build(many, failed={7, astride, astride + 1, len(many) - 2}),
        "large.tfrecord": build(large, failed={3}),
    }
