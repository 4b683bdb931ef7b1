"""SPEC 6: the walk past damaged bytes (resync) and inflating a damaged compressed stream.

The expected results are computed here from the SPEC's definition, with plain loops: a sound
record at ``p`` has a header whose checksum holds, a length that fits and a data checksum that
holds; a walk resumes at the first such offset after damage.
"""

from __future__ import annotations

import gzip
import io
import random
import struct
import zlib

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrfs.format import salvage
from tfrfs.format import tfrecord


def _mcrc(b: bytes) -> int:
    c = crc32c.crc32c(b)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _frame(data: bytes) -> bytes:
    n = struct.pack("<Q", len(data))
    return n + struct.pack("<I", _mcrc(n)) + data + struct.pack("<I", _mcrc(data))


def _sound_at(buf: bytes, p: int) -> bool:
    if p + 12 > len(buf):
        return False
    (n,) = struct.unpack_from("<Q", buf, p)
    if _mcrc(buf[p:p + 8]) != struct.unpack_from("<I", buf, p + 8)[0] or p + 16 + n > len(buf):
        return False
    return _mcrc(buf[p + 12:p + 12 + n]) == struct.unpack_from("<I", buf, p + 12 + n)[0]


def _brute_next_sound(buf: bytes, start: int) -> int | None:
    return next((p for p in range(start, len(buf)) if _sound_at(buf, p)), None)


def _walk(buf: bytes, with_data: bool = False) -> tuple[list[tuple[int, int, bytes | None]], salvage.Walk]:
    w = salvage.Walk(lambda n, off: buf[off:off + n], len(buf), with_data=with_data)
    return list(w), w


def test_sound_shard_walks_whole() -> None:
    recs = [b"a" * i for i in range(20)]
    buf = b"".join(_frame(r) for r in recs)
    got, w = _walk(buf, with_data=True)
    assert [d for _, _, d in got] == recs
    assert not w.problems and not w.ends and w.end == len(buf) and w.count == 20


def test_bad_header_mid_shard_resumes_at_the_next_record() -> None:
    recs = [f"record-{i}".encode() * 3 for i in range(6)]
    frames = [_frame(r) for r in recs]
    buf = bytearray(b"".join(frames))
    at = sum(map(len, frames[:3]))
    buf[at + 9] ^= 0x40                       # record 3's length checksum
    got, w = _walk(bytes(buf), with_data=True)
    assert [d for _, _, d in got] == recs[:3] + recs[4:]   # numbering continues: record 4 is now 3
    resume = at + len(frames[3])
    (p,) = w.problems
    assert (p.offset, p.index, p.resync_offset, p.skipped) == (at, 3, resume, len(frames[3]))
    assert "length checksum" in p.reason
    assert w.ends == {2: at}


def test_length_running_past_the_end_resumes() -> None:
    frames = [_frame(bytes([i]) * 50) for i in range(4)]
    buf = bytearray(b"".join(frames))
    at = len(frames[0])
    big = struct.pack("<Q", 1 << 30)
    buf[at:at + 12] = big + struct.pack("<I", _mcrc(big))   # a sound header whose length does not fit
    got, w = _walk(bytes(buf))
    assert [o for o, _, _ in got] == [0, at + len(frames[1]), at + len(frames[1]) + len(frames[2])]
    assert w.problems[0].offset == at and w.problems[0].resync_offset == at + len(frames[1])


def test_first_header_damaged_and_zeroed_range() -> None:
    frames = [_frame(bytes([65 + i]) * 40) for i in range(5)]
    buf = bytearray(b"".join(frames))
    buf[2] ^= 1                                   # record 0's length
    a, b = len(frames[0]) + len(frames[1]) + 10, len(frames[0]) + len(frames[1]) + len(frames[2]) + 20
    buf[a:b] = bytes(b - a)                       # zeros across records 2 and 3
    got, w = _walk(bytes(buf))
    starts = [sum(map(len, frames[:k])) for k in range(6)]
    assert [o for o, _, _ in got] == [starts[1], starts[4]]
    assert [(p.offset, p.resync_offset, p.index) for p in w.problems] == [(0, starts[1], 0), (starts[2], starts[4], 1)]


def test_record_after_damage_must_have_a_sound_data_checksum() -> None:
    frames = [_frame(bytes([i]) * 30) for i in range(4)]
    buf = bytearray(b"".join(frames))
    buf[5] ^= 1                                   # record 0's header
    buf[len(frames[0]) + 20] ^= 1                 # record 1's data
    got, w = _walk(bytes(buf))
    assert [o for o, _, _ in got] == [len(frames[0]) + len(frames[1]), sum(map(len, frames[:3]))]
    # A record reached by walking (not by resync) may still fail its data checksum: it is listed.
    buf2 = bytearray(b"".join(frames))
    buf2[len(frames[0]) + 20] ^= 1
    got2, w2 = _walk(bytes(buf2), with_data=True)
    assert len(got2) == 4 and not w2.problems


@pytest.mark.parametrize("tail", [b"\x00\x01\x02", b"", b"\xff" * 11])
def test_truncated_and_trailing(tail: bytes) -> None:
    frames = [_frame(b"x" * 100) for _ in range(3)]
    buf = b"".join(frames)
    got, w = _walk(buf[:-7])
    assert len(got) == 2 and w.problems[0].offset == 2 * len(frames[0]) and w.problems[0].resync_offset is None
    assert w.problems[0].skipped == len(frames[0]) - 7 and w.end == 2 * len(frames[0])
    got, w = _walk(buf + tail)
    assert len(got) == 3 and (len(w.problems) == 1) == bool(tail)


@given(seed=st.integers(0, 2**32), n=st.integers(1, 12), cut=st.integers(0, 11), kind=st.sampled_from(["random", "zeros", "ones"]),
       glen=st.integers(1, 5000))
@settings(max_examples=150, deadline=None)
def test_garbage_between_records_is_skipped(seed: int, n: int, cut: int, kind: str, glen: int) -> None:
    rng = random.Random(seed)
    recs = [rng.randbytes(rng.randrange(0, 300)) for _ in range(n)]
    at = min(cut, n)
    garbage = {"random": rng.randbytes(glen), "zeros": bytes(glen), "ones": b"\xff" * glen}[kind]
    buf = b"".join(_frame(r) for r in recs[:at]) + garbage + b"".join(_frame(r) for r in recs[at:])
    got, w = _walk(buf, with_data=True)
    if at < n:
        assert [d for _, _, d in got] == recs
        assert len(w.problems) == 1 and w.problems[0].skipped == glen
    else:
        assert [d for _, _, d in got] == recs and len(w.problems) == 1 and w.problems[0].resync_offset is None


@given(seed=st.integers(0, 2**32), size=st.integers(12, 6000), plant=st.integers(0, 3), zeros=st.booleans())
@settings(max_examples=200, deadline=None)
def test_find_sound_agrees_with_a_byte_by_byte_search(seed: int, size: int, plant: int, zeros: bool) -> None:
    rng = random.Random(seed)
    buf = bytearray(rng.randbytes(size) if not zeros else bytes(rng.choice([0, 0, 1]) for _ in range(size)))
    for _ in range(plant):
        rec = _frame(rng.randbytes(rng.randrange(0, 40)))
        at = rng.randrange(0, max(1, size - len(rec)))
        buf[at:at + len(rec)] = rec[:size - at]
    data = bytes(buf)
    for start in (0, rng.randrange(0, size)):
        assert salvage.find_sound(lambda n, off: data[off:off + n], len(data), start) == _brute_next_sound(data, start)


def test_find_sound_crosses_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(salvage, "CHUNK", 64)
    rec = _frame(b"hello")
    for at in range(40, 140):
        data = bytes(at) + rec + bytes(30)
        assert salvage.find_sound(lambda n, off: data[off:off + n], len(data), 1) == at


# --- compressed streams -------------------------------------------------------------------------

def _raw(n: int = 200) -> bytes:
    rng = random.Random(7)
    return b"".join(_frame(rng.randbytes(rng.randrange(10, 80))) for _ in range(n))


def _longest_prefix(packed: bytes, wbits: int) -> bytes:
    """What inflates before the damage: byte by byte."""
    d = zlib.decompressobj(wbits)
    out = b""
    for i in range(len(packed)):
        try:
            out += d.decompress(packed[i:i + 1])
        except zlib.error:
            break
        if d.eof:
            break
    return out


@pytest.mark.parametrize("comp,wbits", [(tfrecord.GZIP, 31), (tfrecord.ZLIB, 15)])
def test_inflate_round_trip(comp: str, wbits: int) -> None:
    raw = _raw()
    packed = gzip.compress(raw) if comp == tfrecord.GZIP else zlib.compress(raw)
    out = io.BytesIO()
    assert salvage.inflate(io.BytesIO(packed), out, comp, chunk=999) is None
    assert out.getvalue() == raw


@pytest.mark.parametrize("comp,wbits", [(tfrecord.GZIP, 31), (tfrecord.ZLIB, 15)])
@pytest.mark.parametrize("where", [0.3, 0.7])
def test_inflate_keeps_everything_before_mid_stream_damage(comp: str, wbits: int, where: float) -> None:
    raw = _raw(2000)
    packed = bytearray(gzip.compress(raw) if comp == tfrecord.GZIP else zlib.compress(raw))
    at = int(len(packed) * where)
    packed[at:at + 8] = b"\xff\x00\xaa\x55\x12\x34\x56\x78"
    expect = _longest_prefix(bytes(packed), wbits)
    out = io.BytesIO()
    problem = salvage.inflate(io.BytesIO(bytes(packed)), out, comp, chunk=1 << 20)
    assert problem is not None and problem.offset == len(expect) and problem.compressed_offset is not None
    assert out.getvalue() == expect
    # Deflate may turn a few damaged bytes into wrong output before it notices (the records'
    # checksums catch those); everything before the damage is right.
    good = next(i for i in range(len(expect) + 1) if i == len(expect) or expect[i] != raw[i])
    assert good > len(raw) * (where - 0.15)


def test_inflate_flipped_gzip_trailer_keeps_all_data() -> None:
    raw = _raw()
    packed = bytearray(gzip.compress(raw))
    packed[-6] ^= 1                       # the CRC-32 of the data, in the trailer
    out = io.BytesIO()
    problem = salvage.inflate(io.BytesIO(bytes(packed)), out, tfrecord.GZIP)
    assert problem is not None and out.getvalue() == raw
    assert problem.compressed_offset is not None and problem.compressed_offset >= len(packed) - 8


def test_inflate_cut_short_and_members() -> None:
    raw = _raw()
    packed = gzip.compress(raw)
    out = io.BytesIO()
    problem = salvage.inflate(io.BytesIO(packed[:len(packed) // 2]), out, tfrecord.GZIP)
    assert problem is not None and "cut short" in problem.reason and raw.startswith(out.getvalue())
    assert problem.compressed_offset == len(packed) // 2
    two = gzip.compress(raw[:1000]) + gzip.compress(raw[1000:])
    out = io.BytesIO()
    assert salvage.inflate(io.BytesIO(two), out, tfrecord.GZIP, chunk=100) is None and out.getvalue() == raw
    out = io.BytesIO()
    problem = salvage.inflate(io.BytesIO(packed + b"junk"), out, tfrecord.GZIP)
    assert problem is not None and "trailing" in problem.reason and out.getvalue() == raw


def test_stream_damage_absorbs_the_cut_record_at_its_end() -> None:
    stream = tfrecord.Problem(100, "GZIP stream is damaged", compressed_offset=40)
    recs = b"".join(_frame(b"r" * 30) for _ in range(3))
    cut = recs[:-5]
    _, w = _walk(cut)
    assert w.cut and salvage.merge_stream_problem(stream, w) == [stream]
    assert salvage.merge_stream_problem(None, w) == w.problems
    bad_header = recs[:46] + b"\xff" * 20      # records stop at a header that fails, well before the end
    _, w = _walk(bad_header)
    assert not w.cut and salvage.merge_stream_problem(stream, w) == [stream, *w.problems] and len(w.problems) == 1


@pytest.mark.parametrize("zeros_before", [0, 1, 5, 8, 11, 12, 100, 70000])
def test_an_empty_record_after_zeros_is_found(zeros_before: int) -> None:
    data = b"\x01" * 3 + bytes(zeros_before) + _frame(b"") + bytes(20) + _frame(b"x")
    assert salvage.find_sound(lambda n, off: data[off:off + n], len(data), 1) == 3 + zeros_before
