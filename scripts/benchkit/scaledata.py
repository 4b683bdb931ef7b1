"""The ``--scale`` dataset: many tiny Examples, written fast (bench-out/scale-R-S/).

Each record is an ``Example`` with ``id`` (int64, the record's number across the dataset) and
``label`` (int64, id mod 10): 34 bytes of Example, 50 with its framing. The bytes are encoded by
hand, which is what protobuf writes for such a record (it parses to the same message),
so ten million records take seconds to make, one process per core.
"""

from __future__ import annotations

import os
import struct
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import crc32c

from .common import OUT, progress

_MASK_DELTA = 0xA282EAD8


def _masked(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _ld(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + _varint(len(body)) + body


def example_bytes(ident: int) -> bytes:
    """The serialized ``Example`` of record ``ident``."""
    def int_feature(key: bytes, value: int) -> bytes:
        feature = _ld(0x1A, _ld(0x0A, _varint(value)))          # Feature.int64_list, packed value
        return _ld(0x0A, _ld(0x0A, key) + _ld(0x12, feature))    # map entry: key, value
    return _ld(0x0A, int_feature(b"id", ident) + int_feature(b"label", ident % 10))


def _write_shard(path: str, first: int, count: int) -> int:
    pack = struct.pack
    parts = []
    for ident in range(first, first + count):
        data = example_bytes(ident)
        head = pack("<Q", len(data))
        parts.append(head + pack("<I", _masked(head)) + data + pack("<I", _masked(data)))
    blob = b"".join(parts)
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, path)
    return len(blob)


def scale_dataset(records: int, shards: int) -> Path:
    """The folder of the dataset (made once; kept in bench-out/)."""
    root = OUT / f"scale-{records}-{shards}"
    done = root / ".complete"
    if done.exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    progress(f"making {records} records in {shards} shards under {root}")
    per, extra = divmod(records, shards)
    jobs, first = [], 0
    for n in range(shards):
        count = per + (n < extra)
        jobs.append((str(root / f"scale.tfrecord-{n:05d}-of-{shards:05d}"), first, count))
        first += count
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        total = sum(pool.map(_write_shard, *zip(*jobs)))
    done.write_text(f"{records} {shards} {total}\n")
    progress(f"made {total / 1e6:.0f} MB")
    return root
