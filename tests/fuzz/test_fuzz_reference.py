"""The fuzz layer's reference reader, on hand-made cases from the damaged-input contract, and a
few properties of it over the mutator's damaged shards (no mount here)."""

from __future__ import annotations

import gzip
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REALDATA
from support import example_pb
from mutator import compress, make_base, mutants, plain_fault
from reference import (GZIP, NONE, ZLIB, frame, inflate, masked_crc, named_like_shard, parse_example,
                       parse_sequence_example, read_file,
                       shard_view, walk)

RECS = [b"first record", b"", b"third, a bit longer " * 3, b"4", b"fifth record here"]
STREAM = b"".join(frame(r) for r in RECS)


def offsets(records: list[bytes]) -> list[int]:
    out, pos = [], 0
    for r in records:
        out.append(pos)
        pos += 16 + len(r)
    return out


OFFS = offsets(RECS)


def kinds(problems) -> list[tuple]:
    return [(p.kind, p.offset, p.index, p.resync_offset, p.skipped, p.compressed_offset) for p in problems]


# --- framing --------------------------------------------------------------------------------------

def test_masked_crc_and_frame_match_tensorflow_bytes():
    # The first record of tfrecord_lite's test.tfrecord, written by TensorFlow: 87 bytes of data.
    head = bytes.fromhex("5700000000000000")
    assert struct.pack("<I", masked_crc(head)) == frame(b"\0" * 87)[8:12]
    # crc32c("123456789") is 0xE3069283; masking is rotate right by 15 plus 0xA282EAD8
    c = 0xE3069283
    assert masked_crc(b"123456789") == (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_masked_crc_against_a_real_shard():
    path = REALDATA / "tfrecord_lite/tests/test.tfrecord"
    if not path.exists():
        pytest.skip("no real data")
    data = path.read_bytes()
    records, problems = walk(data)
    assert problems == [] and len(records) == 42
    assert b"".join(frame(r.data) for r in records) == data


def test_clean_stream():
    records, problems = walk(STREAM)
    assert problems == []
    assert [(r.number, r.offset, r.data, r.data_crc_ok) for r in records] == \
        [(i, OFFS[i], RECS[i], True) for i in range(5)]


def test_empty_stream():
    assert walk(b"") == ([], [])


def test_data_crc_failure_is_still_a_record():
    bad = bytearray(STREAM)
    bad[OFFS[2] + 12 + 5] ^= 0x10
    records, problems = walk(bytes(bad))
    assert [r.data_crc_ok for r in records] == [True, True, False, True, True]
    assert kinds(problems) == [("data_crc", OFFS[2], 2, None, None, None)]


def test_flipped_footer_is_a_data_crc_failure():
    bad = bytearray(STREAM)
    bad[OFFS[1] + 16 - 1] ^= 0x01           # the empty record's data crc
    records, problems = walk(bytes(bad))
    assert len(records) == 5 and not records[1].data_crc_ok
    assert kinds(problems) == [("data_crc", OFFS[1], 1, None, None, None)]


def test_header_crc_failure_resyncs_and_numbering_goes_on():
    bad = bytearray(STREAM)
    bad[OFFS[1] + 9] ^= 0x40                # record 1's length crc
    records, problems = walk(bytes(bad))
    assert [(r.number, r.offset, r.data) for r in records] == \
        [(0, OFFS[0], RECS[0]), (1, OFFS[2], RECS[2]), (2, OFFS[3], RECS[3]), (3, OFFS[4], RECS[4])]
    assert kinds(problems) == [("gap", OFFS[1], 1, OFFS[2], OFFS[2] - OFFS[1], None)]


def test_length_running_past_the_end_with_a_sound_header():
    # The last record claims more data than there is; its header crc holds.
    n = 1000
    head = struct.pack("<Q", n)
    tail = head + struct.pack("<I", masked_crc(head)) + b"only a little"
    data = STREAM + tail
    records, problems = walk(data)
    assert len(records) == 5
    assert kinds(problems) == [("cut", len(STREAM), 5, None, len(tail), None)]


def test_cut_short_mid_record():
    cut = OFFS[3] + 14
    records, problems = walk(STREAM[:cut])
    assert len(records) == 3
    assert kinds(problems) == [("cut", OFFS[3], 3, None, cut - OFFS[3], None)]


def test_cut_at_a_record_boundary_is_sound():
    records, problems = walk(STREAM[:OFFS[3]])
    assert len(records) == 3 and problems == []


@pytest.mark.parametrize("n", [1, 5, 11])
def test_fewer_than_12_trailing_bytes(n):
    records, problems = walk(STREAM + b"\x07" * n)
    assert len(records) == 5
    assert kinds(problems) == [("trailing", len(STREAM), 5, None, n, None)]


@pytest.mark.parametrize("n", [12, 15, 40])
def test_12_or_more_garbage_bytes_at_the_end_are_cut(n):
    records, problems = walk(STREAM + b"\x00" * n)
    assert len(records) == 5
    assert kinds(problems) == [("cut", len(STREAM), 5, None, n, None)]


def test_inserted_garbage_is_a_gap():
    junk = b"\x00" * 7 + b"junk"
    data = STREAM[:OFFS[2]] + junk + STREAM[OFFS[2]:]
    records, problems = walk(data)
    assert [r.data for r in records] == RECS
    assert [r.offset for r in records][2:] == [o + len(junk) for o in OFFS[2:]]
    assert kinds(problems) == [("gap", OFFS[2], 2, OFFS[2] + len(junk), len(junk), None)]


def test_zeroed_range_across_a_boundary():
    start, end = OFFS[1] + 3, OFFS[2] + 20
    data = STREAM[:start] + b"\x00" * (end - start) + STREAM[end:]
    records, problems = walk(data)
    assert [r.data for r in records] == [RECS[0], RECS[3], RECS[4]]
    assert [r.number for r in records] == [0, 1, 2]
    assert kinds(problems) == [("gap", OFFS[1], 1, OFFS[3], OFFS[3] - OFFS[1], None)]


def test_resync_needs_the_data_crc_too():
    # Garbage holding a header whose length crc holds but whose data crc does not: skipped over.
    fake = frame(b"abcd")
    fake = fake[:-4] + struct.pack("<I", masked_crc(b"abcd") ^ 1)
    junk = b"\xff\xfe" + fake + b"\x01"
    data = STREAM[:OFFS[4]] + junk + STREAM[OFFS[4]:]
    records, problems = walk(data)
    assert [r.data for r in records] == RECS
    assert kinds(problems) == [("gap", OFFS[4], 4, OFFS[4] + len(junk), len(junk), None)]


def test_resync_on_a_record_whose_data_crc_holds_inside_garbage():
    junk = b"\x01\x02" + frame(b"smuggled") + b"\x03"
    at = OFFS[1]
    data = STREAM[:at] + junk + STREAM[at:]
    records, problems = walk(data)
    assert [r.data for r in records] == [RECS[0], b"smuggled"] + RECS[1:]
    assert [r.number for r in records] == list(range(6))
    assert kinds(problems) == [("gap", at, 1, at + 2, 2, None), ("gap", at + 26, 2, at + 27, 1, None)]


def test_garbage_to_the_end_without_a_resync():
    data = STREAM[:OFFS[2]] + b"\x55" * 30
    records, problems = walk(data)
    assert len(records) == 2
    assert kinds(problems) == [("cut", OFFS[2], 2, None, 30, None)]


def test_tf_count_stops_at_the_first_damage():
    bad = bytearray(STREAM)
    bad[OFFS[2] + 13] ^= 1
    view = read_file(bytes(bad), "x.tfrecord")
    assert view.tf_count == 2 and len(view.sound_records) == 4
    view = read_file(STREAM + b"\x00", "x.tfrecord")
    assert view.tf_count == 5


# --- compressed streams ---------------------------------------------------------------------------

def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def test_gzip_clean_and_concatenated_members():
    view = read_file(gz(STREAM), "x.tfrecord.gz")
    assert view.compression == GZIP and view.problems == [] and len(view.records) == 5
    two = gz(STREAM[:OFFS[2]]) + gz(STREAM[OFFS[2]:])
    view = read_file(two, "x.tfrecord.gz")
    assert view.problems == [] and [r.data for r in view.records] == RECS


def test_gzip_cut_short_is_one_problem():
    data = gz(STREAM * 20)
    cut = data[: len(data) // 2]
    prefix, problem = inflate(cut, GZIP)
    assert (STREAM * 20).startswith(prefix) and len(prefix) > 0
    assert problem.kind == "stream" and problem.offset == len(prefix) and problem.compressed_offset == len(cut)
    view = read_file(cut, "x.tfrecord.gz")
    # one problem: the framing walk ends at the same damage, which is not reported twice
    assert kinds(view.problems) == [("stream", len(prefix), None, None, None, len(cut))]
    whole = len(prefix) // len(STREAM) * 5 + sum(1 for o, r in zip(OFFS, RECS)
                                                  if len(prefix) % len(STREAM) >= o + 16 + len(r))
    assert len(view.records) == whole


def test_gzip_flipped_trailer_crc():
    data = bytearray(gz(STREAM))
    data[-6] ^= 0x01
    view = read_file(bytes(data), "x.tfrecord.gz")
    assert [r.data for r in view.records] == RECS
    assert kinds(view.problems) == [("stream", len(STREAM), None, None, None, len(data) - 5)]


def test_gzip_damage_mid_stream_keeps_the_prefix():
    src = b"".join(frame(f"record number {i} ".encode() * 4) for i in range(200))
    data = bytearray(gz(src))
    at = len(data) // 2
    data[at] ^= 0xFF
    prefix, problem = inflate(bytes(data), GZIP)
    assert problem is not None and problem.kind == "stream"
    assert problem.compressed_offset >= at
    # what came out before the damage is the original stream's prefix
    view = read_file(bytes(data), "x.tfrecord.gz")
    good = [r for r in view.records if r.data_crc_ok]
    assert good and all(src[r.offset:r.framed_end] == frame(r.data) for r in good)


def test_gzip_trailing_garbage_is_one_problem():
    data = gz(STREAM) + b"garbage!"
    view = read_file(data, "x.tfrecord.gz")
    assert len(view.records) == 5
    assert kinds(view.problems) == [("stream_trailing", len(STREAM), None, None, None, len(data) - 8)]


def test_zlib_shard_and_its_damage():
    z = zlib.compress(STREAM)
    view = read_file(z, "x.tfrecord")
    assert view.compression == ZLIB and view.problems == []
    view = read_file(z + b"\x00\x01", "x.tfrecord")
    assert kinds(view.problems) == [("stream_trailing", len(STREAM), None, None, None, len(z))]
    bad = bytearray(z)
    bad[-1] ^= 0x80                         # adler32
    view = read_file(bytes(bad), "x.tfrecord")
    assert len(view.records) == 5 and kinds(view.problems) == [("stream", len(STREAM), None, None, None, len(z) - 1)]


def test_damage_inside_a_sound_compressed_stream_is_reported_as_usual():
    bad = bytearray(STREAM)
    bad[OFFS[1] + 2] ^= 0x04                # record 1's length
    view = read_file(gz(bytes(bad)), "x.tfrecord.gz")
    assert kinds(view.problems) == [("gap", OFFS[1], 1, OFFS[2], OFFS[2] - OFFS[1], None)]


def test_stream_problem_keeps_a_failing_header_where_the_records_stop():
    # Garbage after the records, compressed with them, the file cut short: what inflates ends in
    # garbage whose first header fails, with no record after it. That says where the records
    # stop, and is reported beside the stream's problem.
    junk = bytes((i * 37 + 11) % 256 for i in range(200))
    data = gz(STREAM + junk)[:-10]
    prefix, _ = inflate(data, GZIP)
    assert len(prefix) > len(STREAM) + 16
    view = read_file(data, "x.tfrecord.gz")
    assert kinds(view.problems) == [("stream", len(prefix), None, None, None, len(data)),
                                    ("cut", len(STREAM), 5, None, len(prefix) - len(STREAM), None)]
    assert len(view.records) == 5


def test_stream_problem_hides_a_last_record_cut_short_by_it():
    data = gz(STREAM)
    for cut in range(12, len(data)):
        prefix, problem = inflate(data[:cut], GZIP)
        view = read_file(data[:cut], "x.tfrecord.gz")
        assert [p.kind for p in view.problems] == ["stream"], (cut, view.problems)


def test_stream_problem_keeps_gaps_inside_the_prefix():
    bad = bytearray(STREAM)
    bad[OFFS[1] + 2] ^= 0x04
    data = gz(bytes(bad))
    data = data[:-3]                        # cut in the trailer: the whole stream inflated
    view = read_file(data, "x.tfrecord.gz")
    assert kinds(view.problems) == [("stream", len(STREAM), None, None, None, len(data)),
                                    ("gap", OFFS[1], 1, OFFS[2], OFFS[2] - OFFS[1], None)]


# --- which files are shards (SPEC 1) --------------------------------------------------------------

@pytest.mark.parametrize("name", ["a.tfrecord", "a.tfrecords", "a.tfrec", "a.record", "a.records",
                                  "a.tfrecord.gz", "a.tfrecord.gzip", "a.tfrecord.zlib", "x.tfrecord-00003",
                                  "mnist-train.tfrecord-00000-of-00001", "part-00001-of-00002",
                                  "data_tfrecord-00000-of-00012.gz"])
def test_named_like_a_shard(name):
    assert named_like_shard(name)


@pytest.mark.parametrize("name", ["a.txt", "blob.dat", "a.tfrecord.idx", "a.tfrecord.tfrfs-idx", "a.index",
                                  "a.tfindex", "tfrecord", "a.gz", "part-1-of-x", "dataset_info.json"])
def test_not_named_like_a_shard(name):
    assert not named_like_shard(name)


def test_sound_first_header_makes_a_shard_whatever_its_name():
    assert read_file(STREAM, "blob.dat").is_shard
    assert read_file(gz(STREAM), "blob.dat").compression == GZIP
    assert read_file(zlib.compress(STREAM), "blob.dat").compression == ZLIB


def test_plain_shard_starting_with_the_gzip_magic():
    rec = b"\x00" * (0x8B1F)
    view = read_file(frame(rec), "blob.dat")
    assert view.is_shard and view.compression == NONE


def test_damaged_first_header():
    bad = bytearray(STREAM)
    bad[3] ^= 0x01
    named = read_file(bytes(bad), "x.tfrecord")
    assert named.is_shard and named.compression == NONE and named.damaged_first_header
    assert len(named.records) == 4 and kinds(named.problems) == [("gap", 0, 0, OFFS[1], OFFS[1], None)]
    assert not read_file(bytes(bad), "blob.dat").is_shard
    assert read_file(bytes(bad), "blob.dat", source=True).is_shard       # a sound record later on


def test_garbage_alone_is_not_a_shard_unless_named_like_one():
    junk = b"this is not a TFRecord file, despite its name\n"
    assert not read_file(junk, "notes.txt", source=True).is_shard
    view = read_file(junk, "notes.tfrecord")
    assert view.is_shard and view.records == [] and kinds(view.problems) == [("cut", 0, 0, None, len(junk), None)]


def test_empty_files():
    assert read_file(b"", "x.tfrecord").is_shard
    assert not read_file(b"", "empty.txt").is_shard
    assert read_file(b"", "empty.txt", source=True).is_shard


def test_damaged_compression_of_a_shard_named_like_one():
    # gzip header damaged: GZIP by name; the stream fails at once
    data = bytearray(gz(STREAM))
    data[2] = 7                              # compression method 7: zlib refuses the header
    view = read_file(bytes(data), "x.tfrecord.gz")
    assert view.compression == GZIP and view.records == []
    # zlib reads the method and the flags together: it fails at the flags byte, the 4th
    assert kinds(view.problems) == [("stream", 0, None, None, None, 3)]
    view = read_file(bytes(data), "x.tfrecord")
    assert view.compression == NONE          # neither the name nor the header says GZIP
    # zlib stream cut to 1 byte: zlib fails on none of it (it waits for more): ZLIB by content
    assert read_file(zlib.compress(STREAM)[:1], "x.tfrecord").compression == ZLIB
    assert read_file(zlib.compress(STREAM)[:1], "x.tfrecord.zlib").compression == ZLIB
    # a plain shard whose first two bytes make a zlib header (a 376-byte first record: 78 01), its
    # header damaged: zlib refuses the zero length bytes after them at once, before any output
    plain = bytearray(frame(b"x" * 376) + frame(b"second"))
    assert plain[:2] == b"\x78\x01"
    plain[9] ^= 1
    view = read_file(bytes(plain), "x.tfrecord")
    assert view.compression == NONE and [r.data for r in view.records] == [b"second"]
    # a sound zlib header, damaged data: ZLIB by content
    data = bytearray(zlib.compress(STREAM))
    data[3] ^= 0xFF
    assert read_file(bytes(data), "x.tfrecord").compression == ZLIB


def test_empty_gzip_stream_is_an_empty_shard():
    view = read_file(gz(b""), "x.tfrecord.gz")
    assert view.is_shard and view.compression == GZIP and view.records == [] and view.problems == []


def test_shard_view_of_a_repaired_empty_file():
    assert shard_view(b"", "x.tfrecord", NONE).problems == []


# --- properties over the mutator's faults ---------------------------------------------------------

BASE = make_base("hand", "hand.tfrecord", b"".join(frame(f"rec {i} ".encode() * (i % 5)) for i in range(12)), NONE)
BASES = [BASE, make_base("hand_gz", "hand.tfrecord.gz", compress(BASE.data, GZIP), GZIP),
         make_base("hand_zlib", "hand-00000-of-00001", compress(BASE.data, ZLIB), ZLIB)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plain_fault(BASE.stream, BASE.spans))
def test_records_away_from_a_flip_or_zeroed_range_are_all_found(fault):
    """A single fault that keeps the file's length leaves every record it does not touch where
    it was, and the reference finds it there; a record it touches is found with a bad data crc,
    or not at all."""
    data, what = fault
    records, problems = walk(data)
    if len(data) != len(BASE.stream):
        return
    found = {r.offset: r for r in records}
    diff = [i for i in range(len(data)) if data[i] != BASE.stream[i]]
    for off, n in BASE.spans:
        touched = any(off <= i < off + 16 + n for i in diff)
        rec = found.get(off)
        if not touched:
            assert rec is not None and rec.data_crc_ok, (what, off)
        elif rec is not None:
            assert not rec.data_crc_ok, (what, off)
    assert bool(problems) == bool(diff), what


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutants(BASES))
def test_reference_of_any_mutant_is_consistent(m):
    """Records are numbered in order, lie inside the stream, do not overlap; problem indexes are
    the numbers the next record would get; sound records are original records."""
    view = read_file(m.data, m.name)
    if not view.is_shard:
        assert m.name == "blob.dat"
        return
    end = 0
    for i, r in enumerate(view.records):
        assert r.number == i and r.offset >= end and r.framed_end <= len(view.stream)
        end = r.framed_end
        if r.data_crc_ok:
            assert frame(r.data) in BASE.stream, m
    for p in view.problems:
        if p.kind in ("gap", "cut", "trailing"):
            assert p.index == sum(1 for r in view.records if r.offset < p.offset)
    assert view.tf_count <= len(view.sound_records)
    if not view.problems:
        assert view.tf_count == len(view.records)


# --- records as features: the hand-written wire decoder, against TensorFlow's own classes ----------

_kinds = st.sampled_from(["bytes_list", "float_list", "int64_list", None])
_values = {"bytes_list": st.lists(st.binary(max_size=20), max_size=4),
           "float_list": st.lists(st.floats(width=32, allow_nan=False), max_size=4),
           "int64_list": st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=4),
           None: st.just([])}
_feature = _kinds.flatmap(lambda k: st.tuples(st.just(k), _values[k]))
_features = st.dictionaries(st.text(max_size=8), _feature, max_size=4)


def _tf_feature(kind, vals):
    from tensorflow.core.example import feature_pb2
    f = feature_pb2.Feature()
    if kind is not None:
        getattr(f, kind).value.extend(vals)
    return f


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(features=_features, steps=st.dictionaries(st.text(max_size=8), st.lists(_feature, max_size=3), max_size=3))
def test_example_decoder_reads_what_tensorflow_writes(features, steps):
    """``parse_example`` and ``parse_sequence_example`` are the test suite's reader of the records
    tfrfs writes; here they read records that TensorFlow's generated classes serialized."""
    pb = pytest.importorskip("tensorflow.core.example.example_pb2")
    ex = pb.Example()
    for key, (kind, vals) in features.items():
        ex.features.feature[key].CopyFrom(_tf_feature(kind, vals))
    assert parse_example(ex.SerializeToString()) == {k: (kind, list(v)) for k, (kind, v) in features.items()}
    # The suite's own message classes (support/example_pb.py) read and write the same bytes.
    assert example_pb.Example.FromString(ex.SerializeToString()).SerializeToString(deterministic=True) == \
        ex.SerializeToString(deterministic=True)
    seq = pb.SequenceExample()
    seq.context.CopyFrom(ex.features)
    for key, fl in steps.items():
        seq.feature_lists.feature_list[key].feature.extend(_tf_feature(k, v) for k, v in fl)
    context, lists = parse_sequence_example(seq.SerializeToString())
    assert context == parse_example(ex.SerializeToString())
    assert lists == {k: [(kind, list(v)) for kind, v in fl] for k, fl in steps.items()}


def test_example_decoder_merges_and_reads_unpacked_values():
    """What a parser must accept though TensorFlow does not write it: unpacked repeated scalars,
    a message field given twice (merged), a map key given twice (the last wins)."""
    def key(n, t):
        return bytes([n << 3 | t])

    def ld(n, body):
        return key(n, 2) + bytes([len(body)]) + body

    ints = ld(3, key(1, 0) + b"\x05" + key(1, 0) + b"\x7f")                 # int64_list 5, 127
    floats = ld(2, key(1, 5) + struct.pack("<f", 1.5))
    entry = lambda k, f: ld(1, ld(1, k) + ld(2, f))                          # noqa: E731
    data = ld(1, entry(b"a", ints) + entry(b"b", floats)) + ld(1, entry(b"a", floats))
    assert parse_example(data) == {"a": ("float_list", [1.5]), "b": ("float_list", [1.5])}
    assert parse_example(ld(1, entry(b"n", ints))) == {"n": ("int64_list", [5, 127])}
