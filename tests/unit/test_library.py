"""``tfrfs.open`` (SPEC 9) without a mount: shards and counts, stored bytes, records as plain
values with kinds kept, the schema, damaged records named by shard, index and offset, streaming.

Shards are written here from messages built with tfrfs's own proto classes and framed by hand, so
what each test expects comes from the bytes it made, never from tfrfs's reading.
"""

from __future__ import annotations

import gzip
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import tfrfs
from tfrfs import cli
from tfrfs.format import codec
from tfrfs.format import proto
from tfrfs.format import tfrecord
from tfrfs.errors import DamagedRecord, DataLoss, UsageError


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def example(i: int) -> bytes:
    ex = proto.Example()
    f = ex.features.feature
    f["id"].int64_list.value.append(i)                       # one element: stays a list
    f["score"].float_list.value.extend([0.1 * i, -2.5])
    f["name"].bytes_list.value.append(f"n{i}".encode())
    f["empty_ints"].int64_list.SetInParent()                 # a kind with no values
    f["nothing"].CopyFrom(proto.Feature())                   # no kind at all
    return ex.SerializeToString()


def expected(i: int) -> dict:
    return {"id": [i], "score": [f32(0.1 * i), -2.5], "name": [f"n{i}".encode()], "empty_ints": [], "nothing": None}


def sequence(i: int) -> bytes:
    se = proto.SequenceExample()
    se.context.feature["len"].int64_list.value.append(i)
    steps = se.feature_lists.feature_list["tok"].feature
    for t in range(i % 3):
        steps.add().bytes_list.value.append(b"t%d" % t)
    steps.add()   # a step with no kind
    return se.SerializeToString()


def write(path: Path, records: list[bytes], *, compress: bool = False) -> bytes:
    data = b"".join(tfrecord.frame(r) for r in records)
    path.write_bytes(gzip.compress(data) if compress else data)
    return data


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    write(root / "a.tfrecord", [example(i) for i in range(5)])
    write(root / "sub" / "b.tfrecord.gz", [example(i) for i in range(5, 8)], compress=True)
    write(root / "seq.tfrecord", [sequence(i) for i in range(4)])
    (root / "notes.txt").write_text("not a shard")
    return root


def test_shards_counts_and_kinds(dataset: Path, tmp_path: Path) -> None:
    with tfrfs.open(str(dataset), cache_dir=str(tmp_path / "cache")) as ds:
        assert [(s.path, s.records, s.compression, s.kind) for s in ds.shards] == [
            ("a.tfrecord", 5, "NONE", "example"), ("seq.tfrecord", 4, "NONE", "sequence"),
            ("sub/b.tfrecord.gz", 3, "GZIP", "example")]
        assert len(ds) == 12
        with pytest.raises(AttributeError):
            ds.shards[0].records = 3   # type: ignore[misc]


def test_records_are_the_stored_bytes(dataset: Path, tmp_path: Path) -> None:
    with tfrfs.open(str(dataset), cache_dir=str(tmp_path / "cache")) as ds:
        assert [ds.record("a.tfrecord", i) for i in range(5)] == [example(i) for i in range(5)]
        assert ds.record(2, 1) == example(6)   # by position; a GZIP shard
        assert list(ds.records("a.tfrecord", 1, 4)) == [example(i) for i in range(1, 4)]
        assert list(ds.records("sub/b.tfrecord.gz")) == [example(i) for i in range(5, 8)]
        assert list(ds.records("a.tfrecord", 2, 2)) == []


def test_example_values_keep_their_kinds(dataset: Path, tmp_path: Path) -> None:
    with tfrfs.open(str(dataset), cache_dir=str(tmp_path / "cache")) as ds:
        for i in range(5):
            got = ds.example("a.tfrecord", i)
            assert got == expected(i)
            assert all(type(v) is int for v in got["id"]) and all(type(v) is float for v in got["score"])
        assert list(ds.examples("sub/b.tfrecord.gz")) == [expected(i) for i in range(5, 8)]
        assert ds.example("seq.tfrecord", 2) == {"context": {"len": [2]},
                                                  "feature_lists": {"tok": [[b"t0"], [b"t1"], None]}}


def test_plain_values_is_a_pure_function_of_the_message() -> None:
    assert codec.plain_values(proto.Example.FromString(example(3))) == expected(3)
    assert codec.plain_values(proto.Example()) == {}
    assert codec.plain_values(proto.SequenceExample.FromString(sequence(0))) == \
        {"context": {"len": [0]}, "feature_lists": {"tok": [None]}}


def test_schema_is_the_mounts_schema_json(dataset: Path, tmp_path: Path) -> None:
    with tfrfs.open(str(dataset), cache_dir=str(tmp_path / "cache")) as ds:
        schema = ds.schema
    assert [s["shard"] for s in schema["shards"]] == ["a.tfrecord", "seq.tfrecord", "sub/b.tfrecord.gz"]
    assert schema["features"]["id"]["kind"] == "int64_list"
    assert schema["features"]["id"]["records"] == 8
    assert schema["features"]["nothing"]["kind"] == "none"
    assert schema["feature_lists"]["tok"]["records"] == 4


def test_bad_shard_and_index(dataset: Path, tmp_path: Path) -> None:
    with tfrfs.open(str(dataset), cache_dir=str(tmp_path / "cache")) as ds:
        with pytest.raises(KeyError, match="no shard 'nope.tfrecord'"):
            ds.record("nope.tfrecord", 0)
        with pytest.raises(IndexError, match="a.tfrecord has no record 5: it holds 5 records"):
            ds.record("a.tfrecord", 5)
        with pytest.raises(IndexError, match="a.tfrecord has no record -1"):
            ds.example("a.tfrecord", -1)
        with pytest.raises(IndexError, match="no shard 3"):
            ds.record(3, 0)
        with pytest.raises(IndexError):
            list(ds.records("a.tfrecord", 3, 9))


def test_damaged_records_are_named_and_the_rest_served(tmp_path: Path) -> None:
    records = [example(i) for i in range(8)]
    frames = [tfrecord.frame(r) for r in records]
    starts = [sum(map(len, frames[:k])) for k in range(len(frames) + 1)]
    buf = bytearray(b"".join(frames))
    buf[starts[2] + 9] ^= 0x10     # record 2's length checksum: a gap, records resume at 3
    buf[starts[5] + 14] ^= 0x01    # record 5's data: its checksum fails
    (tmp_path / "d.tfrecord").write_bytes(bytes(buf))
    with tfrfs.open(str(tmp_path / "d.tfrecord"), cache_dir=str(tmp_path / "cache")) as ds:
        # 0 1 | gap | 3 4 5 6 7 numbered on: index 4 is record 5, whose data is damaged
        assert ds.shards[0].records == 7
        assert [ds.record(0, i) for i in (0, 1, 2, 3)] == [records[0], records[1], records[3], records[4]]
        with pytest.raises(DamagedRecord) as caught:
            ds.record("d.tfrecord", 4)
        err = caught.value
        assert (err.shard, err.index, err.offset) == ("d.tfrecord", 4, starts[5])
        assert isinstance(err, DataLoss) and isinstance(err, OSError)
        assert f"d.tfrecord: record 4 at offset {starts[5]}" in str(err)
        with pytest.raises(DamagedRecord):
            ds.example(0, 4)
        assert ds.example(0, 6) == expected(7)
        got = []
        with pytest.raises(DamagedRecord) as caught:
            for data in ds.records(0):
                got.append(data)
        assert got == [records[0], records[1], records[3], records[4]] and caught.value.index == 4
        assert list(ds.records(0, 5)) == records[6:]
        problems = ds.problems
        assert any(p["index"] == 2 and p["offset"] == starts[2] and p["resync_offset"] == starts[3]
                   for p in problems)


def test_records_option_and_raw_records(tmp_path: Path) -> None:
    write(tmp_path / "r.tfrecord", [b"\xff\xfe not a proto", b""])
    with tfrfs.open(str(tmp_path / "r.tfrecord"), cache_dir=str(tmp_path / "cache")) as ds:
        assert ds.shards[0].kind == "raw"
        assert ds.record(0, 0) == b"\xff\xfe not a proto"
        with pytest.raises(tfrfs.errors.Invalid, match="not Examples"):
            ds.example(0, 0)
    write(tmp_path / "e.tfrecord", [example(1)])
    with tfrfs.open(str(tmp_path / "e.tfrecord"), records="raw", cache_dir=str(tmp_path / "cache")) as ds:
        assert ds.shards[0].kind == "raw"
    with pytest.raises(UsageError, match="records='nope'"):
        tfrfs.open(str(tmp_path / "e.tfrecord"), records="nope")
    with pytest.raises(UsageError, match="no such file"):
        tfrfs.open(str(tmp_path / "missing"))
    with pytest.raises(UsageError, match="index_memory"):
        tfrfs.open(str(tmp_path / "e.tfrecord"), index_memory="lots")


def test_a_dataset_with_a_manifest_opens_from_it(dataset: Path, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    assert cli.main(["index", str(dataset), "--beside", "--cache-dir", cache]) == 0
    with tfrfs.open(str(dataset), cache_dir=cache, index_memory="1K") as ds:
        assert ds.source.manifest is not None
        assert [s.records for s in ds.shards] == [5, 4, 3]
        assert ds.example("a.tfrecord", 4) == expected(4)
    with tfrfs.open(str(dataset), cache_dir=cache, use_manifest=False) as ds:
        assert ds.source.manifest is None and len(ds) == 12


def test_import_tfrfs_stays_cheap() -> None:
    code = ("import sys, tfrfs\n"
            "print(sorted(m for m in ('tfrfs.library', 'tfrfs.view.records', 'google.protobuf', 'ray') if m in sys.modules))\n"
            "print(callable(tfrfs.open), 'tfrfs.library' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]"
    assert out[1] == "True True"
