"""The compiled record walker (tfrfs/format/_records.c, through tfrfs/format/bulk.py) gives what the
Python walk gives, record for record: offsets, problems, failed checksums, parse problems and
schema tallies, on made streams (damaged every way Hypothesis finds), on unusual encodings and on
every shard of ../shared/realdata. The Python paths are the reference (SPEC 6's walk is held to the
fuzz reference in tests/fuzz; the tally to the whole-record reference here and in
test_schema_index.py); each comparison runs both in this process, the Python one with the compiled
part turned off."""

from __future__ import annotations

import contextlib
import os
import struct
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any, Callable, Iterator

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REALDATA
from support.compiled import compiled_or_skip
from support.schema_reference import PNG, reference
from tfrfs.format import bulk, codec, proto, salvage, tfrecord
from tfrfs.index import schema_summary, shardschema
from tfrfs.index.discovery import ShardFile
from tfrfs.jobs import verify

_C = compiled_or_skip(bulk._C, "tfrfs.format._records")


@contextlib.contextmanager
def python_path() -> Iterator[None]:
    saved = bulk._C
    bulk._C = None
    try:
        yield
    finally:
        bulk._C = saved


def both(fn: Callable[[], Any]) -> tuple[Any, Any]:
    """``fn()`` on the compiled path, then on the Python path."""
    fast = fn()
    with python_path():
        slow = fn()
    return fast, slow


# --- the checksum ----------------------------------------------------------------------------


def test_crc32c_is_the_packages_on_every_length_and_alignment() -> None:
    data = bytes(range(256)) * 5 + os.urandom(700)
    for start in range(9):
        for n in [*range(40), 63, 64, 65, 255, 256, 1000, len(data) - start]:
            piece = data[start:start + n]
            assert bulk.crc32c(piece) == crc32c.crc32c(piece), (start, n)
            assert bulk.crc32c(piece, 0xDEADBEEF) == crc32c.crc32c(piece, 0xDEADBEEF)


def test_the_table_path_gives_the_same_checksums() -> None:
    """The tables (a processor without the instruction) against the package, in a process that
    chose them."""
    code = ("import os, crc32c\nfrom tfrfs.format import _records as r\nassert not r.HARDWARE_CRC\n"
            "d = os.urandom(5000)\n"
            "for s in range(9):\n    for n in (0, 1, 7, 8, 9, 100, 4000):\n"
            "        p = d[s:s + n]\n        assert r.crc32c(p) == crc32c.crc32c(p)\n"
            "        assert r.crc32c(p, 77) == crc32c.crc32c(p, 77)\nprint('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TFRFS_CRC_TABLES="1"),
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "ok", proc.stderr


# --- made streams, damaged ----------------------------------------------------------------------


def _ld(tag: int, body: bytes) -> bytes:
    n, out = len(body), b""
    while True:
        out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            return bytes([tag]) + out + body


def _example(values: dict[str, codec.Value]) -> bytes:
    m = proto.Example()
    for key, value in values.items():
        codec.value_to_proto(value, m.features.feature[key])
    return m.SerializeToString()


_KEYS = st.sampled_from(["id", "label", "text", "image/encoded", "image/height", "image/width", "image/depth",
                         "height", "width", "channels", "a/b", "é", "", "x" * 200])
_BYTES = st.one_of(st.binary(max_size=24), st.sampled_from([b"dog\n", b"cat", PNG, b"\xff\xd8\xff\xe0x", b"GIF89a",
                                                            bytes(6), bytes(12), "é\n".encode(), b"a\x00b",
                                                            b"\xed\xa0\x80", b"RIFF\0\0\0\0WEBP"]))
_VALUE = st.one_of(
    st.lists(st.integers(-2**63, 2**63 - 1), max_size=12).map(lambda v: codec.Value("int64_list", tuple(v))),
    st.lists(st.integers(1, 6), min_size=1, max_size=1).map(lambda v: codec.Value("int64_list", tuple(v))),
    st.lists(st.floats(width=32, allow_nan=False), max_size=8).map(lambda v: codec.Value("float_list", tuple(v))),
    st.lists(_BYTES, max_size=3).map(lambda v: codec.Value("bytes_list", tuple(v))),
    st.just(codec.Value("none", ())))
# Encodings protobuf reads but serializers do not write, and bytes it refuses: left to protobuf.
_UNUSUAL = [
    _ld(0x0A, _ld(0x0A, _ld(0x0A, b"a") + _ld(0x12, _ld(0x1A, _ld(0x0A, b"\x01")))) * 2),   # a key twice
    _ld(0x0A, _ld(0x0A, _ld(0x0A, b"a") + _ld(0x12, b""))) * 2,                                # features twice
    _ld(0x0A, _ld(0x0A, _ld(0x12, _ld(0x1A, b"")) + _ld(0x0A, b"a"))),                         # value first
    _ld(0x0A, _ld(0x0A, _ld(0x0A, b"\xff\xfe") + _ld(0x12, b""))),                             # key not UTF-8
    _ld(0x0A, _ld(0x0A, _ld(0x0A, b"a\x00") + _ld(0x12, b""))),                                # a NUL in a key
    _ld(0x0A, _ld(0x0A, _ld(0x0A, b"a") + _ld(0x12, _ld(0x1A, b"\x08\x05\x08\x07")))),         # not packed
    _ld(0x0A, _ld(0x0A, _ld(0x0A, b"a") + _ld(0x12, _ld(0x1A, _ld(0x0A, b"\xff" * 10 + b"\x01"))))),
    _ld(0x0A, _ld(0x0A, _ld(0x0A, b"a") + _ld(0x12, _ld(0x0A, b"\x12\x01x")))),                # unknown field
    b"\x0a\x05\x0a\x03", b"\x08\x01", b"\xff", b"",
]
_RECORD = st.one_of(st.dictionaries(_KEYS, _VALUE, max_size=6).map(_example), st.sampled_from(_UNUSUAL),
                    st.binary(max_size=40))


@st.composite
def _stream(draw: st.DrawFn) -> bytes:
    """Framed records, then damaged: bytes changed, zeroed, cut out or added, or the end cut off."""
    records = draw(st.lists(_RECORD, max_size=12))
    data = bytearray(b"".join(tfrecord.frame(r) for r in records))
    for _ in range(draw(st.integers(0, 3))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        how = draw(st.sampled_from(["flip", "zero", "cut", "add", "end"]))
        span = draw(st.integers(1, 40))
        if how == "flip":
            data[at] ^= draw(st.integers(1, 255))
        elif how == "zero":
            data[at:at + span] = bytes(len(data[at:at + span]))
        elif how == "cut":
            del data[at:at + span]
        elif how == "add":
            data[at:at] = draw(st.binary(min_size=1, max_size=span))
        else:
            del data[at:]
    return bytes(data)


def _pread(data: bytes) -> Callable[[int, int], bytes]:
    return lambda n, off: data[off:off + n]


def _header_walk(data: bytes) -> dict:
    walk = salvage.Walk(_pread(data), len(data))
    offsets = walk.offsets()
    return {"offsets": list(offsets), "problems": [p.fields() for p in walk.problems], "ends": walk.ends,
            "count": walk.count, "end": walk.end, "cut": walk.cut}


_SHARD = ShardFile("/made", "made", tfrecord.NONE, 0, 0)


def _verify(data: bytes, kind: str | None) -> dict:
    @contextlib.contextmanager
    def stream() -> Iterator[tuple[Any, int, None]]:
        yield _pread(data), len(data), None
    report = verify.verify_shard(_SHARD, stream, kind)
    return {**report.as_json(), "unparsable": sorted(report.unparsable), "data_bytes": report.data_bytes}


@settings(max_examples=400, deadline=None)
@given(_stream())
def test_a_header_walk_is_the_pythons(data: bytes) -> None:
    fast, slow = both(lambda: _header_walk(data))
    assert fast == slow


@settings(max_examples=400, deadline=None)
@given(_stream(), st.sampled_from([None, "example", "sequence", "raw"]))
def test_verify_reports_what_the_python_walk_reports(data: bytes, kind: str | None) -> None:
    fast, slow = both(lambda: _verify(data, kind))
    assert fast == slow


def test_a_record_larger_than_a_block_is_checked_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(salvage, "BLOCK", 64)
    big = _example({"text": codec.Value("bytes_list", (b"w" * 300,))})
    data = b"".join(tfrecord.frame(r) for r in [b"\x08\x01", big, _UNUSUAL[0], big])
    at = len(tfrecord.frame(b"\x08\x01"))   # the first large record
    damaged = bytearray(data)
    damaged[at + 100] ^= 1
    for stream in (data, bytes(damaged)):
        for kind in ("example", "raw"):
            fast, slow = both(lambda: _verify(stream, kind))
            assert fast == slow
    assert [p["reason"] for p in _verify(bytes(damaged), "example")["problems"]][:1] == \
        [f"data checksum failed for the record at offset {at}"]


# --- the tally ---------------------------------------------------------------------------------


def _tally(data: bytes, offsets: array, skipped: set[int], check: bool) -> tuple[dict, list[int] | None]:
    scanner = shardschema.Scanner("example")
    failed: list[int] | None = [] if check else None
    shardschema.scan_read(scanner, _pread(data), offsets, skipped, failed)
    return scanner.flush().to_json(), failed


def _framed(records: list[bytes]) -> tuple[bytes, array]:
    offsets = array("Q", [0])
    for r in records:
        offsets.append(offsets[-1] + tfrecord.OVERHEAD + len(r))
    return b"".join(tfrecord.frame(r) for r in records), offsets


@settings(max_examples=400, deadline=None)
@given(st.lists(_RECORD, max_size=20), st.sets(st.integers(0, 19), max_size=3), st.booleans(), st.data())
def test_a_tally_is_the_python_scanners(records: list[bytes], skipped: set[int], check: bool,
                                        draw: st.DataObject) -> None:
    data, offsets = _framed(records)
    if data and draw.draw(st.booleans()):   # a data checksum broken (the tally is the same; it is reported)
        flip = bytearray(data)
        flip[draw.draw(st.integers(0, len(flip) - 1))] ^= 0x40
        data = bytes(flip)
    fast, slow = both(lambda: _tally(data, offsets, skipped, check))
    assert fast == slow


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(_KEYS, _VALUE, max_size=6).map(_example), max_size=20), st.booleans())
def test_a_compiled_tally_gives_what_whole_records_give(records: list[bytes], decode_raw: bool) -> None:
    data, offsets = _framed(records)
    tally = shardschema.Tally.from_json(_tally(data, offsets, set(), True)[0])
    assert tally is not None
    assert schema_summary.summarize([tally], decode_raw) == reference(records, "example", decode_raw)


def test_offsets_as_u32_and_as_a_view() -> None:
    records = [_example({"id": codec.Value("int64_list", (n,)), "t": codec.Value("bytes_list", (b"x" * n,))})
               for n in range(50)]
    data, offsets = _framed(records)
    want = _tally(data, offsets, {3}, True)
    assert _tally(data, array("I", offsets), {3}, True) == want
    assert _tally(data, memoryview(offsets), {3}, True) == want   # type: ignore[arg-type]
    assert want[0]["records"] == 49


# --- realdata ----------------------------------------------------------------------------------


def _realdata_shards() -> list[Path]:
    out = []
    for path in sorted(p for p in REALDATA.rglob("*") if p.is_file() and p.stat().st_size > 16):
        with open(path, "rb") as f:
            if tfrecord.sniff(f.read(64)) == tfrecord.NONE:
                out.append(path)
    return out


@pytest.mark.skipif(not REALDATA.is_dir(), reason=f"{REALDATA} is absent (real TFRecord files)")
def test_every_plain_shard_of_realdata_walks_verifies_and_tallies_the_same() -> None:
    shards = _realdata_shards()
    assert len(shards) >= 5
    for path in shards:
        data = path.read_bytes()
        fast, slow = both(lambda: (_header_walk(data), _verify(data, None)))
        assert fast == slow, path
        walk = _header_walk(data)
        offsets = array("Q", walk["offsets"] + [walk["end"]]) if walk["offsets"] else array("Q", [0])
        fast, slow = both(lambda: _tally(data, offsets, {1}, True))
        assert fast == slow, path


def test_signatures_read_back_as_rows() -> None:
    sig = struct.pack("=I", 2) + b"id" + struct.pack("=BQBBB", 3, 1, bulk.SUFFIXES.index(".json"), 0, 0)
    assert list(bulk._rows(sig)) == [("id", ("int64_list", 1, ".json", False, False))]


def test_offsets_convert_as_the_python_path() -> None:
    from tfrfs.index import idxfile
    wide = array("Q", [0, 1, 16, 5000, (1 << 32) - 1])
    narrow = array("I", [0, 3, 4096, (1 << 32) - 1])
    for delta in (0, 7):
        fast = (idxfile._narrow(wide), idxfile.as_u64(narrow), list(idxfile.shifted(wide.tobytes(), delta)))
        with python_path():
            slow = (idxfile._narrow(wide), idxfile.as_u64(narrow), list(idxfile.shifted(wide.tobytes(), delta)))
        assert fast == slow
    assert list(idxfile.shifted(array("Q", [20, 30]).tobytes(), -20)) == [0, 10]
    assert bulk.offsets_as(memoryview(narrow), 4, 8, 1) == array("Q", [1, 4, 4097, 1 << 32]).tobytes()
