"""The schema as an index (SPEC 5, 7): each shard's tally read once, kept in its index file, summed
for schema.json, carried through commits without reading the shard again.

The tallies are checked against a reference that parses every record whole with protobuf and asks
the renderer how each value is shown: the scan's shortcuts (one level deep, numeric lists counted
from their bytes, values remembered, records grouped) must change nothing.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inprocess import Session
from support.reference import read_index_file   # the test suite's own reader of index files
from support.schema_reference import PNG, reference
from tfrfs.format import codec
from tfrfs.format import proto
from tfrfs.index import schema_summary, shardschema
from tfrfs.index.shard_index import IndexCache
from tfrfs.index.discovery import discover
from tfrfs.dataset.assembly import open_mount
from tfrfs.format.tfrecord import frame

# --- records to tally -------------------------------------------------------------------------

_keys = st.sampled_from(["id", "label", "text", "image", "image/height", "image/width", "image/encoded",
                         "height", "width", "depth", "scores", "a/b", ""])
_ints = st.lists(st.integers(-2**63, 2**63 - 1), max_size=40)
_floats = st.lists(st.floats(width=32, allow_nan=False), max_size=40)
_bytes = st.lists(st.one_of(st.binary(max_size=30), st.sampled_from([b"dog\n", b"cat", PNG, b"\xff\xd8\xff\xe0x",
                                                                   bytes(6), bytes(12), "é".encode()])),
                  max_size=4)


@st.composite
def _feature(draw: st.DrawFn) -> codec.Value:
    kind = draw(st.sampled_from(["int64_list", "float_list", "bytes_list", "none"]))
    if kind == "none":
        return codec.Value("none", ())
    values = draw({"int64_list": _ints, "float_list": _floats, "bytes_list": _bytes}[kind])
    return codec.Value(kind, tuple(values))


def _example(values: dict[str, codec.Value]) -> bytes:
    m = proto.Example()
    for key, value in values.items():
        codec.value_to_proto(value, m.features.feature[key])
    return m.SerializeToString()


_records = st.lists(st.dictionaries(_keys, _feature(), max_size=6).map(_example), max_size=30)


def _unpacked_int64(key: str, values: list[int]) -> bytes:
    """An Example whose int64 list is written unpacked (legal; some writers do)."""
    def varint(n: int) -> bytes:
        n &= (1 << 64) - 1
        out = b""
        while True:
            out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
            n >>= 7
            if not n:
                return out

    def ld(tag: int, body: bytes) -> bytes:
        return bytes([tag]) + varint(len(body)) + body
    body = b"".join(b"\x08" + varint(v) for v in values)
    return ld(0x0A, ld(0x0A, ld(0x0A, key.encode()) + ld(0x12, ld(0x1A, body))))


def tally_summary(records: list[bytes], kind: str = "example", decode_raw: bool = True) -> dict:
    tables = schema_summary.summarize([shardschema.scan_records(kind, records)], decode_raw)
    return {t: v for t, v in tables.items()}


@settings(max_examples=150, deadline=None)
@given(_records, st.booleans())
def test_a_tally_gives_what_whole_records_give(records: list[bytes], decode_raw: bool) -> None:
    assert tally_summary(records, decode_raw=decode_raw) == reference(records, "example", decode_raw)


def test_raw_pixels_unpacked_lists_and_damaged_records() -> None:
    raw = _example({"image/encoded": codec.Value("bytes_list", (bytes(2 * 3 * 3),)),
                    "image/height": codec.Value("int64_list", (2,)), "image/width": codec.Value("int64_list", (3,))})
    not_raw = _example({"image/encoded": codec.Value("bytes_list", (PNG,)),
                        "image/height": codec.Value("int64_list", (2,)), "image/width": codec.Value("int64_list", (3,))})
    records = [raw, not_raw, _unpacked_int64("ids", [1, 2, 300]), _unpacked_int64("ids", []), b"\x0a\x05garbage",
               _example({"big": codec.Value("int64_list", tuple(range(-100, 100)))})]
    got = tally_summary(records)
    assert got == reference(records, "example")
    assert got["features"]["image/encoded"]["shown_as"] == [".png", "raw pixels .png"]
    assert got["features"]["ids"]["min_values"] == 0 and got["features"]["ids"]["max_values"] == 3
    assert got["features"]["big"]["max_values"] == 200


def test_sequence_records() -> None:
    m = proto.SequenceExample()
    codec.value_to_proto(codec.Value("bytes_list", (b"clip\n",)), m.context.feature["id"])
    for step in (b"a", b"\xff\xd8\xff\xe0x"):
        codec.value_to_proto(codec.Value("bytes_list", (step,)), m.feature_lists.feature_list["frames"].feature.add())
    for n in range(3):
        codec.value_to_proto(codec.Value("int64_list", (n, n)), m.feature_lists.feature_list["n"].feature.add())
    m.feature_lists.feature_list["nothing"].SetInParent()
    empty_lists = proto.SequenceExample()
    records = [m.SerializeToString(), empty_lists.SerializeToString()]
    got = tally_summary(records, "sequence")
    assert got == reference(records, "sequence")
    assert got["feature_lists"]["frames"]["shown_as"] == [".steps"]
    assert got["feature_lists"]["nothing"]["kind"] == "empty"


@settings(max_examples=60, deadline=None)
@given(_records, _records)
def test_taking_records_out_is_exact(kept: list[bytes], removed: list[bytes]) -> None:
    """What a commit relies on: the tally of all, less the records it replaced, is the tally of the
    rest (minimum and maximum value counts included)."""
    whole = shardschema.scan_records("example", kept + removed)
    scanner = shardschema.Scanner("example")
    for data in removed:
        scanner.add(data, -1)
    whole.add(scanner.flush())
    rest = shardschema.scan_records("example", kept)
    assert whole.to_json() == rest.to_json()
    assert shardschema.Tally.from_json(whole.to_json()).to_json() == whole.to_json()


# --- kept in the index file --------------------------------------------------------------------


def _write_shard(path: Path, records: list[bytes]) -> None:
    path.write_bytes(b"".join(frame(r) for r in records))


def _examples(n: int, start: int = 0) -> list[bytes]:
    return [_example({"id": codec.Value("int64_list", (i,)), "label": codec.Value("bytes_list", (b"cat\n",))})
            for i in range(start, start + n)]


def _schema_of(root: Path, cache: Path, **options: str) -> tuple[bool, dict]:
    """Mounted (in process) with ``cache``: whether the schema was at hand without reading a
    record, and the schema."""
    m = open_mount(str(root), cache_dir=str(cache), **options)
    try:
        return m.tree.schema.ready(), m.tree.schema.summary()
    finally:
        m.close()


def test_the_tally_is_kept_in_the_index_file_and_read_back(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    _write_shard(root / "a.tfrecord", _examples(700))
    _write_shard(root / "b.tfrecord", _examples(5))
    cache = tmp_path / "cache"
    ready, first = _schema_of(root, cache)
    assert not ready
    assert first["features"]["id"]["records"] == 705
    assert first["features"]["label"]["ending_in_newline"] == 705
    for entry in (cache / "index").iterdir():
        meta, _ = read_index_file(entry.read_bytes())
        assert meta["schema"]["records"] in (700, 5)
    assert _schema_of(root, cache) == (True, first)      # nothing to read: the index files hold it


def test_a_changed_shard_is_read_again(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    _write_shard(root / "a.tfrecord", _examples(10))
    cache = tmp_path / "cache"
    _schema_of(root, cache)
    _write_shard(root / "a.tfrecord", _examples(10) + [_example({"new": codec.Value("float_list", (1.0,))})])
    ready, schema = _schema_of(root, cache)
    assert not ready
    assert schema["features"]["new"]["kind"] == "float_list"


def test_a_shipped_index_carries_the_tally(tmp_path: Path) -> None:
    """``tfrfs index --beside`` writes index files with the schema in them: a mount elsewhere (its
    own cache) reads no record for it."""
    from tfrfs.cli import main
    root = tmp_path / "data"
    root.mkdir()
    _write_shard(root / "a.tfrecord", _examples(50))
    assert main(["index", str(root), "--beside", "--cache-dir", str(tmp_path / "c1")]) == 0
    meta, _ = read_index_file((root / "a.tfrecord.tfrfs-idx").read_bytes())
    assert meta["schema"]["records"] == 50
    ready, schema = _schema_of(root, tmp_path / "c2")
    assert ready
    assert schema["features"]["id"]["records"] == 50


def test_a_tally_of_another_record_kind_is_not_used(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    _write_shard(root / "a.tfrecord", _examples(3))
    cache = tmp_path / "cache"
    _schema_of(root, cache)
    assert _schema_of(root, cache, records="raw") == (False, {"shards": [{"shard": "a.tfrecord", "records": 3,
                                                                          "kind": "raw", "compression": "NONE"}],
                                                               "features": {}})


# --- carried through a commit ------------------------------------------------------------------


def _fresh(root: Path, tmp: Path) -> dict:
    """The schema read from scratch (another cache): what the shards hold now."""
    ready, schema = _schema_of(root, tmp / "fresh-cache")
    assert not ready
    return schema


def test_a_commit_carries_the_tally_without_reading_the_shard(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    records = _examples(20)
    records[7] = _example({"id": codec.Value("int64_list", tuple(range(9))), "label": codec.Value("bytes_list", (b"x",))})
    _write_shard(root / "a.tfrecord", records)
    _write_shard(root / "b.tfrecord", _examples(4, 100))
    s = Session(root, tmp_path / "cache")
    try:
        s.tree.schema.summary()
        s.write("/a.tfrecord/000003/id.json", b"[1, 2, 3]")           # edited
        s.rm_r("/a.tfrecord/000007")                                 # the only record with 9 ids: max falls
        s.mkdir("/a.tfrecord/new")
        s.write("/a.tfrecord/new/weight.json", b"[0.5]")              # added, a new key
        s.mkdir("/c.tfrecord")                                        # a new shard
        s.mkdir("/c.tfrecord/r")
        s.write("/c.tfrecord/r/id.json", b"[5]")
        s.commit()
        assert s.tree.schema.ready()      # every shard's tally known: none is read again
        after = s.tree.schema.summary()
    finally:
        s.close()
    fresh = _fresh(root, tmp_path)
    assert after == fresh
    assert fresh["features"]["id"]["max_values"] == 3
    assert fresh["features"]["weight"]["records"] == 1


def test_the_background_build_and_a_new_key(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    _write_shard(root / "a.tfrecord", [_example({"score": codec.Value("float_list", (1.5,))})] * 3)
    s = Session(root, tmp_path / "cache")
    try:
        s.mount.attach(str(tmp_path / "mnt"))        # what the daemon does once the mount is up
        thread = s.tree.schema._background
        assert thread is not None
        thread.join(30)
        assert s.tree.schema.ready()
        s.write("/a.tfrecord/000000/score.json", b"[2]")     # the dataset's kind: stays float
        s.write("/a.tfrecord/000001/count.json", b"[2]")     # a new key: int64
        s.commit()
    finally:
        s.close()
    with open(root / "a.tfrecord", "rb") as f:
        data = f.read()
    first_len = struct.unpack_from("<Q", data, 0)[0]
    first = proto.Example.FromString(data[12:12 + first_len])
    assert list(first.features.feature["score"].float_list.value) == [2.0]


@pytest.fixture(autouse=True)
def _forget_mount_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home" / ".cache"))


def test_discover_is_unchanged_by_tallies(tmp_path: Path) -> None:
    """An index file without a schema (from before) still loads; its schema is read when needed."""
    root = tmp_path / "data"
    root.mkdir()
    _write_shard(root / "a.tfrecord", _examples(3))
    cache = IndexCache(tmp_path / "cache")
    shard = discover(str(root)).shards[0]
    idx, _ = cache.get(shard)
    assert idx.tally is None
    loaded = cache.load(shard)
    assert loaded is not None and loaded.tally is None


def test_workers_read_parts_of_shards_and_notice_a_replaced_file(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards split in parts over worker processes add up to the tally of the whole; a file replaced
    since its offsets were taken (a commit) gives no tally rather than a wrong one."""
    import os
    from array import array
    from tfrfs.jobs.runner import LocalPool
    monkeypatch.setattr(shardschema, "PART_RECORDS", 64)
    records = _examples(300) + [_example({"x": codec.Value("float_list", (1.0, 2.0))})]
    _write_shard(tmp_path / "a.tfrecord", records)
    _write_shard(tmp_path / "b.tfrecord", _examples(10))
    jobs = []
    for name in ("a.tfrecord", "b.tfrecord"):
        path = str(tmp_path / name)
        offsets, pos = array("Q"), 0
        data = (tmp_path / name).read_bytes()
        while pos < len(data):
            offsets.append(pos)
            pos += struct.unpack_from("<Q", data, pos)[0] + 16
        offsets.append(pos)
        jobs.append((path, shardschema.stamp_of(os.stat(path)), "example", offsets, {5}))
    seen: list[int] = []
    with LocalPool(2) as runner:
        got = shardschema.scan_local(jobs, lambda done, total: seen.append(done), runner)
        assert got[0] is not None and got[1] is not None
        assert got[0].to_json() == shardschema.scan_records("example", records[:5] + records[6:]).to_json()
        assert got[1].records == 9
        assert seen[-1] == 311
        _write_shard(tmp_path / "b.tfrecord", _examples(10, 50))   # same size, another file
        again = shardschema.scan_local(jobs, runner=runner)
        assert again[0] is not None and again[1] is None


@settings(max_examples=25, deadline=None)
@given(st.dictionaries(_keys, _feature(), max_size=4), st.sampled_from([b"x" * 5, "é\n".encode(), b"\x00\x01",
                                                                       PNG, b"BM", b"\xff\xd8\xff\xe0"]),
       st.sampled_from(["bytes1", "bytes2", "ints", "floats"]))
def test_a_large_record_is_read_by_spans_as_a_small_one_is_read(values: dict, head: bytes, big: str) -> None:
    """Records past ``LARGE`` are read where their values lie (the kind, count, suffix and newline of
    a large value from its bytes in place): they tally as the whole-record reference says."""
    size = shardschema.LARGE + 100
    if big == "bytes1":
        value = codec.Value("bytes_list", (head + b"a" * size + head[-1:],))
    elif big == "bytes2":
        value = codec.Value("bytes_list", (head + b"b" * size, b"tail\n"))
    elif big == "ints":
        value = codec.Value("int64_list", tuple(range(-size // 8, size // 8)))
    else:
        value = codec.Value("float_list", (0.5,) * (size // 4))
    record = _example({**values, "big": value})
    assert len(record) > shardschema.LARGE
    scanner = shardschema.Scanner("example")
    scanner.add_large(memoryview(record))
    got = schema_summary.summarize([scanner.flush()], True)
    assert got == reference([record], "example")
