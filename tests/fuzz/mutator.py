"""Damaged shards for the fuzz layer: real shards (the real-data corpus and TensorFlow-written
ones) and a Hypothesis strategy that damages one of them with a single fault.

Faults of a plain stream: a bit flipped in a record's header, data or footer; cut short (at a
record boundary or anywhere); garbage appended or inserted (random or zero bytes, at a record
boundary or anywhere); a zeroed range. Faults of a GZIP/ZLIB file: a bit flipped in the compressed
data, in the trailer's checksum or length, or anywhere (headers too); cut short; garbage appended;
or one of the plain faults inside the inflated stream, compressed again ("inner").

Nothing here comes from tfrfs: record boundaries are found by the reference reader.
"""

from __future__ import annotations

import importlib.util
import os
import struct
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from reference import GZIP, NONE, ZLIB, frame, masked_crc, read_file

HERE = Path(__file__).resolve().parent

# The real-data corpus (MANIFEST.txt there), trimmed at record boundaries to keep the suite fast.
REALDATA_SHARDS = [
    # key, path under REALDATA, records kept (None: all), compression
    ("raccoon5", "raccoon_dataset/data/test.record", 5, NONE),
    ("mnist300", "tensorflow_datasets/mnist/3.0.1/mnist-test.tfrecord-00000-of-00001", 300, NONE),
    ("titanic300", "TensorFlow-Demo/data/train.tfrecords", 300, NONE),
    ("lite", "tfrecord_lite/tests/test.tfrecord", None, NONE),
    ("tfx_csv_gz", "tfx/tfx/components/testdata/csv_example_gen/Split-eval/data_tfrecord-00000-of-00012.gz",
     None, GZIP),
    ("penguin_gz", "tfx/tfx/components/testdata/penguin/data/Split-eval/data_tfrecord-00000-of-00001.gz",
     None, GZIP),
    ("nextpage_gz", "tfx/tfx/examples/tfjs_next_page_prediction/data/data.tfrecord.gz", None, GZIP),
]

HEALTHY = "tfrecord_lite/tests/test.tfrecord"     # the neighbour every mutant is mounted beside
NOT_A_SHARD_NAME = "blob.dat"


@dataclass(frozen=True)
class Base:
    key: str
    name: str              # the file name its mutants get
    data: bytes            # the file
    compression: str
    stream: bytes          # the inflated stream (the file itself when NONE)
    spans: tuple[tuple[int, int], ...]   # (header offset, data length) of every record

    def __repr__(self) -> str:
        return f"Base({self.key})"


@dataclass(frozen=True)
class Mutant:
    base: str
    name: str
    data: bytes
    what: str              # the fault, for a reproduction

    def __repr__(self) -> str:
        return f"Mutant({self.base}: {self.what}, as {self.name!r}, {len(self.data)} bytes)"


def compress(stream: bytes, compression: str) -> bytes:
    if compression == NONE:
        return stream
    c = zlib.compressobj(6, zlib.DEFLATED, 31 if compression == GZIP else 15)
    return c.compress(stream) + c.flush()


def make_base(key: str, name: str, data: bytes, compression: str, keep: int | None = None) -> Base:
    """A sound shard; ``keep``: its first records only, cut at a record boundary (never re-framed)."""
    view = read_file(data, name)
    assert view.is_shard and view.compression == compression and not view.problems, (key, view.problems)
    if keep is not None and keep < len(view.records):
        assert compression == NONE, "only plain shards are cut"
        data = data[: view.records[keep].offset]
        view = read_file(data, name)
        assert len(view.records) == keep and not view.problems
    spans = tuple((r.offset, len(r.data)) for r in view.records)
    return Base(key, name, data, compression, view.stream, spans)


def realdata_bases(realdata: Path) -> list[Base]:
    bases = []
    for key, rel, keep, compression in REALDATA_SHARDS:
        path = realdata / rel
        bases.append(make_base(key, path.name, path.read_bytes(), compression, keep))
    by_key = {b.key: b for b in bases}
    # ZLIB shards: plain real shards compressed with zlib, one named .zlib and one whose name
    # says nothing about compression (found by content).
    lite, titanic = by_key["lite"], by_key["titanic300"]
    bases.append(make_base("lite_zlib", "test.tfrecord.zlib", compress(lite.data, ZLIB), ZLIB))
    bases.append(make_base("titanic_zlib", "titanic-00000-of-00001", compress(titanic.data, ZLIB), ZLIB))
    return bases


def tf_written_bases(out: Path) -> list[Base]:
    """Small shards written by TensorFlow itself (tf_shards.py), or, without TensorFlow, raw
    records of the same shapes framed here."""
    out.mkdir(parents=True, exist_ok=True)
    if importlib.util.find_spec("tensorflow") is not None:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        proc = subprocess.run([sys.executable, str(HERE / "tf_shards.py"), str(out)], capture_output=True,
                              text=True, timeout=300, env=env)
        if proc.returncode != 0:
            raise AssertionError(f"tf_shards.py exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        made = {"tf_examples.tfrecord": NONE, "tf_seq.tfrecords": NONE, "tf_raw.tfrecord": NONE,
                "tf_gzip.tfrecord.gz": GZIP, "tf_zlib-00000-of-00001": ZLIB}
        return [make_base(name.split(".")[0].split("-")[0], name, (out / name).read_bytes(), comp)
                for name, comp in made.items()]
    records = [b"", b"plain text record", bytes(range(256)), b"\x00" * 40] + \
              [f"record {i} ".encode() * (i % 7 + 1) for i in range(36)]
    stream = b"".join(frame(r) for r in records)
    return [make_base("framed", "framed.tfrecord", stream, NONE),
            make_base("framed_gzip", "framed.tfrecord.gz", compress(stream, GZIP), GZIP),
            make_base("framed_zlib", "framed-00000-of-00001", compress(stream, ZLIB), ZLIB)]


# --- the faults ----------------------------------------------------------------------------------

def garbage() -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(min_size=1, max_size=48),
                     st.integers(1, 48).map(lambda n: b"\x00" * n))


def _flip(data: bytes, at: int, bit: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 1 << bit
    return bytes(out)


@st.composite
def plain_fault(draw: Callable, stream: bytes, spans: tuple[tuple[int, int], ...]) -> tuple[bytes, str]:
    """One fault in a plain stream: (damaged stream, what was done)."""
    size = len(stream)
    boundaries = [off for off, _ in spans] + [size]
    anywhere = st.integers(0, max(size - 1, 0))
    kinds = ["flip_header", "flip_footer", "truncate", "append", "insert", "zero"]
    if any(n for _, n in spans):
        kinds.append("flip_data")
    if not spans:
        kinds = ["append", "insert"]
    kind = draw(st.sampled_from(kinds))
    if kind.startswith("flip_"):
        candidates = [i for i, (_, n) in enumerate(spans) if n or kind != "flip_data"]
        i = draw(st.sampled_from(candidates))
        off, n = spans[i]
        if kind == "flip_header":
            at = off + draw(st.integers(0, 11))
        elif kind == "flip_data":
            at = off + 12 + draw(st.integers(0, n - 1))
        else:
            at = off + 12 + n + draw(st.integers(0, 3))
        bit = draw(st.integers(0, 7))
        return _flip(stream, at, bit), f"{kind} of record {i}: byte {at} bit {bit}"
    if kind == "truncate":
        cut = draw(st.one_of(st.sampled_from(boundaries[:-1]), anywhere))
        return stream[:cut], f"cut to {cut} bytes"
    if kind == "append":
        junk = draw(garbage())
        return stream + junk, f"appended {junk!r}"
    if kind == "insert":
        at = draw(st.one_of(st.sampled_from(boundaries), st.integers(0, size)))
        junk = draw(garbage())
        return stream[:at] + junk + stream[at:], f"inserted {junk!r} at {at}"
    start = draw(st.one_of(st.sampled_from(boundaries[:-1]), anywhere))
    length = draw(st.one_of(st.integers(1, 24), st.integers(1, 4096)))
    end = min(size, start + length)
    return stream[:start] + b"\x00" * (end - start) + stream[end:], f"zeroed [{start}, {end})"


@st.composite
def compressed_fault(draw: Callable, base: Base) -> tuple[bytes, str]:
    """One fault in a GZIP/ZLIB file: (damaged file, what was done)."""
    data, size = base.data, len(base.data)
    head, tail = (10, 8) if base.compression == GZIP else (2, 4)   # TF writes no optional gzip fields
    kind = draw(st.sampled_from(["flip_stream", "flip_trailer", "flip_any", "truncate", "append", "inner"]))
    if kind == "inner":
        stream, what = draw(plain_fault(base.stream, base.spans))
        return compress(stream, base.compression), f"inner ({what}), compressed again"
    if kind in ("flip_stream", "flip_trailer", "flip_any"):
        lo, hi = {"flip_stream": (head, size - tail - 1), "flip_trailer": (size - tail, size - 1),
                  "flip_any": (0, size - 1)}[kind]
        at, bit = draw(st.integers(lo, hi)), draw(st.integers(0, 7))
        return _flip(data, at, bit), f"{kind}: compressed byte {at} bit {bit}"
    if kind == "truncate":
        cut = draw(st.integers(0, size - 1))
        return data[:cut], f"compressed file cut to {cut} bytes"
    junk = draw(garbage())
    return data + junk, f"appended {junk!r} to the compressed file"


@st.composite
def mutants(draw: Callable, bases: list[Base]) -> Mutant:
    """A single-fault mutant of one of ``bases``, sometimes under a name not like a shard's."""
    base = draw(st.sampled_from(bases))
    if base.compression == NONE:
        data, what = draw(plain_fault(base.stream, base.spans))
    else:
        data, what = draw(compressed_fault(base))
    renamed = draw(st.sampled_from([False] * 7 + [True]))
    return Mutant(base.key, NOT_A_SHARD_NAME if renamed else base.name, data, what)


def draw_mutants(bases: list[Base], count: int, seed_value: int) -> list[Mutant]:
    """``count`` distinct mutants, the same ones for the same bases and seed: drawn once by
    Hypothesis (generation only: there is nothing to shrink, the checks come afterwards)."""
    found: dict[tuple[str, bytes], Mutant] = {}
    if count <= 0:
        return []

    @seed(seed_value)
    @settings(max_examples=count * 2, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(mutants(bases))
    def collect(m: Mutant) -> None:
        if len(found) < count:
            found.setdefault((m.name, m.data), m)

    collect()
    return list(found.values())


def edge_mutants(bases: list[Base]) -> list[Mutant]:
    """Hand-made damage at the edges of the contract, checked like the drawn mutants: bytes after
    a compressed stream (a gzip magic and junk, a lone first magic byte, zeros, a second ZLIB
    stream), garbage inside a stream cut short, GZIP members one after the other, empty streams,
    files cut inside a header, a sound header whose length runs past the end, a few trailing
    bytes, an empty record whose data crc fails, a plain shard whose damaged first header looks
    like a ZLIB header, and files not named like shards (a damaged first header with sound
    records after it, text, nothing): plain files in a folder, alone a shard or no source."""
    lite = next(b for b in bases if b.key == "lite")
    s = lite.stream
    half = lite.spans[len(lite.spans) // 2][0]
    g, z = compress(s, GZIP), compress(s, ZLIB)
    huge = struct.pack("<Q", 2 ** 64 - 1)
    junk = bytes((i * 37 + 11) % 256 for i in range(200))
    bad_empty = frame(b"")[:-4] + struct.pack("<I", masked_crc(b"") ^ 1)
    looks_zlib = bytearray(frame(b"x" * 376) + frame(b"second") + frame(b"third"))   # 78 01 ...
    looks_zlib[9] ^= 1
    gz, zl, pl = "edge.tfrecord.gz", "edge.tfrecord.zlib", "edge.tfrecord"
    cases = [
        (gz, g + b"\x1f\x8b" + b"junkjunk", "gzip magic and junk after the stream"),
        (gz, g + b"\x1f\x8b", "gzip magic alone after the stream"),
        (gz, g + b"\x1f", "the magic's first byte after the stream"),
        (gz, g + b"\x00" * 20, "zeros after the stream"),
        (gz, compress(s[:half], GZIP) + compress(s[half:], GZIP), "two gzip members, split at a record"),
        (gz, compress(s[:half + 5], GZIP) + compress(s[half + 5:], GZIP), "two gzip members, split mid-record"),
        (gz, g + compress(b"", GZIP), "a gzip member, then an empty one"),
        (gz, compress(b"", GZIP), "an empty gzip stream"),
        (gz, g[:5], "gzip cut inside its header"),
        (gz, compress(s + junk, GZIP)[:-10], "garbage after the records inside the stream, cut short"),
        (zl, z + z, "a second zlib stream after the first"),
        (zl, z[:1], "zlib cut inside its header"),
        (zl, compress(b"", ZLIB), "an empty zlib stream"),
        (pl, s + b"\x00" * 11, "11 zero bytes after the last record"),
        (pl, s + b"\x00" * 12, "12 zero bytes after the last record"),
        (pl, s + huge + struct.pack("<I", masked_crc(huge)) + b"abc", "a sound header of length 2**64-1"),
        (pl, b"abc", "3 bytes only"),
        (pl, b"", "an empty file"),
        (pl, s[:half] + bad_empty + s[half:], "an empty record whose data crc fails"),
        (pl, bytes(looks_zlib), "damaged first header whose bytes 78 01 look like a zlib header"),
        (NOT_A_SHARD_NAME, _flip(s, 9, 0), "damaged first header, not named like a shard"),
        (NOT_A_SHARD_NAME, b"plain text, not named like a shard\n" * 3, "text, not named like a shard"),
        (NOT_A_SHARD_NAME, b"", "an empty file not named like a shard"),
    ]
    return [Mutant("edge", name, data, what) for name, data, what in cases]
