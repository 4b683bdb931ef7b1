"""Shard discovery, kind detection and the persisted index."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest

from tfrfs.index import discovery
from tfrfs.index import shard_index as index
from tfrfs.format.record_kinds import choose_kind
from tfrfs.format import proto
from tfrfs.format import tfrecord
from tfrfs.errors import UsageError


def write_shard(path: Path, records: list[bytes], compression: str = tfrecord.NONE) -> Path:
    buf = io.BytesIO()
    w = tfrecord.StreamWriter(buf, compression)
    for r in records:
        w.write(r)
    w.close()
    path.write_bytes(buf.getvalue())
    return path


def example(**ints: int) -> bytes:
    ex = proto.Example()
    for k, v in ints.items():
        ex.features.feature[k].int64_list.value.append(v)
    return ex.SerializeToString()


def sequence() -> bytes:
    seq = proto.SequenceExample()
    seq.feature_lists.feature_list["f"].feature.add().int64_list.value.append(1)
    return seq.SerializeToString()


def test_discover_dir_mirrors_tree_and_skips_staging(tmp_path: Path) -> None:
    write_shard(tmp_path / "a.data", [example(x=1)])          # recognised by content, not name
    (tmp_path / "sub").mkdir()
    write_shard(tmp_path / "sub" / "b.tfrecord.gz", [example(x=2)], tfrecord.GZIP)
    (tmp_path / "sub" / "info.json").write_text("{}")
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / discovery.STAGING_DIR).mkdir()
    write_shard(tmp_path / discovery.STAGING_DIR / "x.tfrecord", [example(x=3)])
    d = discovery.discover(str(tmp_path))
    assert {s.relpath: s.compression for s in d.shards} == {
        "a.data": "NONE", "empty.tfrecord": "NONE", "sub/b.tfrecord.gz": "GZIP"}
    assert set(d.plain_files) == {"sub/info.json", "empty.txt"}
    assert set(d.dirs) == {"", "sub"}


def test_discover_errors(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(UsageError, match="no such file"):
        discovery.discover(str(tmp_path / "missing"))
    with pytest.raises(UsageError, match="not a TFRecord file"):
        discovery.discover(str(tmp_path / "notes.txt"))
    with pytest.raises(UsageError, match="no TFRecord shard"):
        discovery.discover(str(tmp_path))
    with pytest.raises(UsageError, match="no file matches"):
        discovery.discover(str(tmp_path / "*.tfrecord"))


def test_named_empty_file_is_a_shard(tmp_path: Path) -> None:
    (tmp_path / "plain").write_bytes(b"")
    d = discovery.discover(str(tmp_path / "plain"))
    assert [s.relpath for s in d.shards] == ["plain"]


def test_glob(tmp_path: Path) -> None:
    for n in range(3):
        write_shard(tmp_path / f"s-{n}.rec", [example(x=n)])
    (tmp_path / "readme.rec.txt").write_text("not a shard")
    d = discovery.discover(str(tmp_path / "*.rec*"))
    assert [s.relpath for s in d.shards] == ["s-0.rec", "s-1.rec", "s-2.rec"]


@pytest.mark.parametrize("records,kind", [
    ([example(a=1), b""], "example"),
    ([example(a=1), sequence()], "sequence"),
    ([example(a=1), b"\xff\xff\xff"], "raw"),
    ([b""] * 3, "example"),
])
def test_detect_kind(records: list[bytes], kind: str) -> None:
    assert choose_kind(r for r in records if r) == kind


def test_index_cache_round_trip_and_invalidation(tmp_path: Path) -> None:
    shard_path = write_shard(tmp_path / "s.tfrecord", [example(i=i) for i in range(100)])
    cache = index.IndexCache(tmp_path / "cache")
    shard = discovery.discover(str(shard_path)).shards[0]
    built, cached = cache.get(shard)
    assert not cached and built.count == 100 and built.detected_kind == "example"
    again, cached = cache.get(shard)
    assert cached and list(again.offsets) == list(built.offsets)
    # A changed shard (new size and mtime) is indexed again.
    write_shard(shard_path, [example(i=i) for i in range(5)])
    os.utime(shard_path, ns=(time.time_ns(), time.time_ns() + 10**9))
    shard = discovery.discover(str(shard_path)).shards[0]
    fresh, cached = cache.get(shard)
    assert not cached and fresh.count == 5


def test_compressed_shard_indexes_plain_stream(tmp_path: Path) -> None:
    recs = [example(i=i) for i in range(10)]
    p = write_shard(tmp_path / "s.tfrecord.zz", recs, tfrecord.ZLIB)
    cache = index.IndexCache(tmp_path / "cache")
    idx, _ = cache.get(discovery.discover(str(p)).shards[0])
    fd = os.open(idx.data_path, os.O_RDONLY)
    try:
        got = [tfrecord.read_record(fd, *idx.span(i)) for i in range(idx.count)]
    finally:
        os.close(fd)
    assert got == recs


def test_damaged_shard_problems(tmp_path: Path) -> None:
    recs = [example(i=i) for i in range(4)]
    p = write_shard(tmp_path / "d.tfrecord", recs)
    data = bytearray(p.read_bytes())
    data[12 + 2] ^= 0xFF            # data of record 0
    p.write_bytes(bytes(data) + b"\x01\x02")   # and trailing bytes
    idx = index.IndexCache(tmp_path / "c").build(discovery.discover(str(p)).shards[0])
    assert idx.count == 4
    assert 0 in idx.bad
    reasons = [pr.reason for pr in idx.problems]
    assert any("data checksum" in r for r in reasons)
    assert any("trailing" in r for r in reasons)


def test_index_memory_is_eight_bytes_a_record(tmp_path: Path) -> None:
    p = write_shard(tmp_path / "m.tfrecord", [b""] * 1000)
    idx = index.IndexCache(tmp_path / "c").build(discovery.discover(str(p)).shards[0])
    assert idx.offsets.itemsize * len(idx.offsets) <= 8 * (idx.count + 1)


def _scans(source: Path, cache: Path, index_dir: str | None = None) -> tuple[int, list]:
    from tfrfs.dataset.sources import index_source, open_source
    src = open_source(str(source), cache_dir=cache)
    try:
        indexes, built = index_source(src, index_dir=index_dir)
        return built.scans, [list(i.offsets) for i in indexes]
    finally:
        src.close()


def test_index_files_beside_a_shard_save_the_scan_and_are_shown_as_plain_files(tmp_path: Path) -> None:
    from tfrfs.index import loader_files as loaderidx
    from tfrfs.dataset.sources import index_source, open_source, ship_indexes
    data = tmp_path / "data"
    data.mkdir()
    write_shard(data / "a.tfrecord", [example(x=i) for i in range(50)])
    write_shard(data / "b.tfrecord", [example(y=i) for i in range(7)])
    scans, offsets = _scans(data, tmp_path / "c1")
    assert scans == 2
    src = open_source(str(data), cache_dir=tmp_path / "c1")
    indexes, cache = index_source(src)
    ship_indexes(src, indexes, cache)
    (data / "empty.tfrecord.idx").write_bytes(b"")            # an index file is never a shard
    d = discovery.discover(str(data))
    assert [s.relpath for s in d.shards] == ["a.tfrecord", "b.tfrecord"]
    assert sorted(d.plain_files) == ["a.tfrecord.tfrfs-idx", "b.tfrecord.tfrfs-idx", "empty.tfrecord.idx"]
    assert _scans(data, tmp_path / "c2") == (0, offsets)     # a new cache: the shipped files are used

    # A shard changed after its index was shipped: that index is ignored, the shard scanned.
    write_shard(data / "b.tfrecord", [example(y=i) for i in range(9)])
    scans, again = _scans(data, tmp_path / "c3")
    assert scans == 1 and again[0] == offsets[0] and len(again[1]) == 10

    # The loaders' text index, as DALI's tfrecord2idx writes it, in an index folder.
    (data / "a.tfrecord.tfrfs-idx").unlink()
    (data / "b.tfrecord.tfrfs-idx").unlink()
    idx_dir = tmp_path / "idx"
    idx_dir.mkdir()
    lines = "".join(f"{o} {n - o}\n" for o, n in zip(offsets[0], offsets[0][1:]))
    (idx_dir / "a.idx").write_text(lines)                     # STEM.idx: .tfrecord replaced
    (idx_dir / "b.tfrecord.idx").write_text(lines)            # another shard's: does not fit, ignored
    scans, got = _scans(data, tmp_path / "c4", index_dir=str(idx_dir))
    assert scans == 1 and got[0] == offsets[0] and len(got[1]) == 10
    assert loaderidx.format_lines(got[0]).decode() == lines
