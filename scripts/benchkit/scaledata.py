"""The ``--scale`` datasets, made once and kept (bench-out/ or --scale-data): many tiny Examples
(scale-R-S/), a tree of copies of them made of hard links (scale-R-S-xN/), and C4-like 2 KB
records (c4like-R-S/).

Each record is an ``Example`` with ``id`` (int64, the record's number across the dataset) and
``label`` (int64, id mod 10): 34 bytes of Example, 50 with its framing. The bytes are encoded by
hand, which is what protobuf writes for such a record (it parses to the same message),
so a hundred million records take a few minutes to make, one process per core.
"""

from __future__ import annotations

import os
import struct
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable

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


def _crc_field(data: bytes) -> bytes:
    return struct.pack("<I", _masked(data))


# ``label``'s map entry, one per value 0..9: key "label", Feature.int64_list holding one byte.
_LABELS = [b"\x0a\x0e\x0a\x05label\x12\x05\x1a\x03\x0a\x01" + bytes([n]) for n in range(10)]


def _write_shard(path: str, first: int, count: int) -> int:
    """Records ``first`` .. ``first + count - 1``: the bytes of ``example_bytes`` with every length
    worked out by hand (they are all below 128), about three times as fast as composing them."""
    crc, mask, pack = crc32c.crc32c, _MASK_DELTA, struct.pack
    heads: dict[int, bytes] = {}
    parts = []
    for ident in range(first, first + count):
        vb = _varint(ident)
        n = len(vb)
        body = (b"\x0a" + bytes((n + 28, 0x0A, n + 10)) + b"\x0a\x02id\x12" + bytes((n + 4, 0x1A, n + 2, 0x0A, n))
                + vb + _LABELS[ident % 10])
        head = heads.get(n)
        if head is None:
            head = heads[n] = pack("<Q", len(body)) + _crc_field(pack("<Q", len(body)))
        c = crc(body)
        parts.append(head + body + pack("<I", (((c >> 15) | (c << 17)) + mask) & 0xFFFFFFFF))
    return _write_blob(path, b"".join(parts))


def _write_blob(path: str, blob: bytes) -> int:
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, path)
    return len(blob)


def scale_dataset(records: int, shards: int, base: Path = OUT) -> Path:
    """The folder of the dataset (made once; kept in bench-out/ or ``base``)."""
    return _made(base / f"scale-{records}-{shards}", "scale", records, shards, _write_shard, (),
                 f"making {records} records in {shards} shards")


def _made(root: Path, stem: str, records: int, shards: int, write: Callable[..., int], extra: tuple,
          what: str) -> Path:
    """``root`` holding ``records`` records in ``shards`` shards named ``stem.tfrecord-N-of-M``,
    each written by ``write(path, first, count, *extra)`` on every core; made once (a
    ``.complete`` marker says it was finished)."""
    done = root / ".complete"
    if done.exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    progress(f"{what} under {root}")
    per, spare = divmod(records, shards)
    jobs, first = [], 0
    for n in range(shards):
        count = per + (n < spare)
        jobs.append((str(root / f"{stem}.tfrecord-{n:05d}-of-{shards:05d}"), first, count, *extra))
        first += count
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        total = sum(pool.map(write, *zip(*jobs)))
    done.write_text(f"{records} {shards} {total}\n")
    progress(f"made {total / 1e6:.0f} MB")
    return root


# --- 2 KB records, as in C4: a text of words, its URL and a timestamp -----------------------------

def _bytes_entry(key: bytes, value: bytes) -> bytes:
    """A map entry of Features: ``key`` -> Feature.bytes_list holding ``value``."""
    return _ld(0x0A, _ld(0x0A, key) + _ld(0x12, _ld(0x0A, _ld(0x0A, value))))


def _corpus(seed: int, size: int) -> bytes:
    """``size`` bytes of words drawn from a fixed vocabulary (lowercase, 2-11 letters)."""
    import random
    vocab_rng = random.Random(0)
    vocab = ["".join(vocab_rng.choice("etaoinshrdlucmfwypvbgkjqxz") for _ in range(vocab_rng.randint(2, 11)))
             for _ in range(5000)]
    rng = random.Random(seed)
    words: list[str] = []
    length = 0
    while length < size:
        w = rng.choice(vocab)
        words.append(w)
        length += len(w) + 1
    return " ".join(words).encode()


def _write_text_shard(path: str, first: int, count: int, mean: int) -> int:
    import random
    rng = random.Random(first)
    corpus = _corpus(first, 1 << 20)
    parts = []
    for ident in range(first, first + count):
        n = rng.randint(mean * 3 // 4, mean * 5 // 4)
        at = rng.randrange(0, len(corpus) - n)
        text = corpus[at:at + n]
        url = b"https://www.example.org/%d/%s.html" % (ident, text[:rng.randint(5, 40)].replace(b" ", b"-"))
        stamp = b"2019-04-%02dT%02d:%02d:%02dZ" % (1 + ident % 28, ident % 24, ident % 60, (ident * 7) % 60)
        data = _ld(0x0A, _bytes_entry(b"text", text) + _bytes_entry(b"timestamp", stamp) + _bytes_entry(b"url", url))
        head = struct.pack("<Q", len(data))
        parts.append(head + _crc_field(head) + data + _crc_field(data))
    return _write_blob(path, b"".join(parts))


def text_dataset(base: Path, records: int, shards: int, mean: int = 2048) -> Path:
    """C4-like records of about ``mean`` bytes of text each (base/c4like-R-S/; made once)."""
    return _made(base / f"c4like-{records}-{shards}", "c4like", records, shards, _write_text_shard, (mean,),
                 f"making {records} text records of ~{mean} bytes in {shards} shards")


# --- the billion-record tree: copies of one dataset, hard links only ----------------------------

def shard_files(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if ".tfrecord-" in p.name and not p.name.endswith((".part", IDX)))


IDX = ".tfrfs-idx"


def linked_tree(data: Path, copies: int, index_beside: Callable[[Path], float]) -> tuple[Path, float | None]:
    """``copies`` sub-folders (part-00, part-01, ...) of hard links to the shards of ``data`` and
    to their index files, which ``index_beside(part-00)`` writes once (``tfrfs index --beside``):
    a hard link keeps the shard's size and time, so the same index files match in every copy.
    The dataset itself is left without index files, so that its cold ``index`` still scans.
    Returns the tree and the seconds the index took (None when the tree was already made)."""
    tree = data.parent / f"{data.name}-x{copies}"
    done = data.parent / f"{tree.name}.complete"   # outside the tree: the mount would show it
    if done.exists():
        return tree, None
    shards = shard_files(data)
    first = tree / "part-00"
    first.mkdir(parents=True, exist_ok=True)
    progress(f"linking {len(shards)} shards into {tree} ({copies} copies)")
    for p in shards:
        if not (first / p.name).exists():
            os.link(p, first / p.name)
    took = None
    if not all((first / (p.name + IDX)).exists() for p in shards):
        progress(f"writing the shipped indexes of {first}")
        took = index_beside(first)
    for c in range(1, copies):
        part = tree / f"part-{c:02d}"
        part.mkdir(exist_ok=True)
        for p in shards:
            for name in (p.name, p.name + IDX):
                if not (part / name).exists():
                    os.link(first / name, part / name)
    done.write_text(f"{copies} {len(shards)}\n")
    return tree, took
