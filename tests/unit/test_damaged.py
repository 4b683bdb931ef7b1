"""Damaged shards without a mount (SPEC 1, 6): which files are damaged shards, the index of a
shard with gaps (built, persisted, reloaded), verify's report, repair (backup, records kept,
TFDS metadata, refusals) and the commands' exit codes and output.

Expected records are written out here from the bytes each test builds, never from tfrfs's walk.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
from pathlib import Path

import pytest

from tfrfs import cli
from tfrfs.index import discovery
from tfrfs.index import shard_index as index
from tfrfs.format import proto
from tfrfs.index import tfds_info as tfds
from tfrfs.format import tfrecord
from tfrfs.errors import UsageError
from tfrfs.dataset.sources import open_source
from tfrfs.edit.journal import Staging

from support import reference


def example(i: int) -> bytes:
    ex = proto.Example()
    ex.features.feature["n"].int64_list.value.append(i)
    ex.features.feature["text"].bytes_list.value.append(f"record number {i}".encode())
    return ex.SerializeToString()


RECORDS = [example(i) for i in range(8)]
FRAMES = [tfrecord.frame(r) for r in RECORDS]
STARTS = [sum(map(len, FRAMES[:k])) for k in range(len(FRAMES) + 1)]


def damaged_bytes() -> bytes:
    """Record 2's length checksum broken, record 5's data flipped: sound are 0, 1, 3, 4, 6, 7."""
    buf = bytearray(b"".join(FRAMES))
    buf[STARTS[2] + 9] ^= 0x10
    buf[STARTS[5] + 14] ^= 0x01
    return bytes(buf)


SOUND = [0, 1, 3, 4, 6, 7]


@pytest.mark.parametrize("name,like", [
    ("a.tfrecord", True), ("a.tfrecords", True), ("a.tfrec", True), ("a.record", True), ("a.records", True),
    ("a.tfrecord.gz", True), ("a.tfrecord.gzip", True), ("a.tfrecord.zlib", True), ("x.tfrecord-00003", True),
    ("mnist-train.tfrecord-00000-of-00001", True), ("data_tfrecord-00000-of-00012.gz", True),
    ("part-00001-of-00010", True), ("a.tfrecord.idx", False), ("a.tfrecord.tfrfs-idx", False),
    ("a.tfrecord.index", False), ("a.tfindex", False), ("a.tfrecord.bak", False), ("data_tfrecord_eval.gz", False),
    ("notes.txt", False), ("a.recordings", False), ("x.tfrecord-00003.bak", False)])
def test_named_like_a_shard(name: str, like: bool) -> None:
    assert discovery.named_like_shard(name) is like


def test_damaged_first_header_named_like_a_shard_is_a_shard(tmp_path: Path) -> None:
    bad = bytearray(b"".join(FRAMES))
    bad[2] ^= 1
    (tmp_path / "a.tfrecord").write_bytes(bytes(bad))
    (tmp_path / "a.bin").write_bytes(bytes(bad))            # not named like one: a plain file
    (tmp_path / "z.tfrecord.gz").write_bytes(b"\x1f\x8b\x08\x00" + bytes(40))   # gzip, hopeless
    d = discovery.discover(str(tmp_path))
    assert {s.relpath: s.compression for s in d.shards} == {"a.tfrecord": "NONE", "z.tfrecord.gz": "GZIP"}
    assert d.plain_files == ("a.bin",)
    # Given alone: a.bin holds sound records after its damaged start, so it is a damaged shard.
    assert [s.relpath for s in discovery.discover(str(tmp_path / "a.bin")).shards] == ["a.bin"]
    (tmp_path / "junk.bin").write_bytes(os.urandom(5000))
    with pytest.raises(UsageError, match="not a TFRecord file"):
        discovery.discover(str(tmp_path / "junk.bin"))


def test_index_of_a_damaged_shard_is_persisted_with_its_gaps(tmp_path: Path) -> None:
    (tmp_path / "d.tfrecord").write_bytes(damaged_bytes())
    shard = discovery.discover(str(tmp_path)).shards[0]
    cache = index.IndexCache(tmp_path / "cache")
    built, from_cache = cache.get(shard)
    assert not from_cache
    assert built.count == 7   # 0 1 | gap | 3 4 5 6 7: record 5's header is sound, its data is not
    want = [STARTS[i] for i in (0, 1, 3, 4, 5, 6, 7)]
    assert [built.span(i)[0] for i in range(built.count)] == want
    assert [built.span(i)[1] for i in range(built.count)] == [len(RECORDS[i]) for i in (0, 1, 3, 4, 5, 6, 7)]
    gap = built.problems[0]
    assert (gap.offset, gap.index, gap.resync_offset, gap.skipped) == (STARTS[2], 2, STARTS[3], len(FRAMES[2]))
    again, from_cache = index.IndexCache(tmp_path / "cache").get(shard)
    assert from_cache and list(again.offsets) == list(built.offsets) and again.ends == built.ends
    assert again.problems[0] == gap
    assert list(built.runs(range(7))) == [(STARTS[0], STARTS[2]), (STARTS[3], STARTS[8])]


def test_verify_and_repair_through_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "d.tfrecord").write_bytes(damaged_bytes())
    (src / "ok.tfrecord").write_bytes(b"".join(FRAMES))
    assert cli.main(["verify", str(src)]) == 1
    out = capsys.readouterr().out
    assert f"d.tfrecord: record 2 at offset {STARTS[2]}: length checksum failed" in out
    assert f"d.tfrecord: record 4 at offset {STARTS[5]}: data checksum failed" in out
    assert cli.main(["verify", "--json", str(src)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["problems"] == 2 and doc["records"] == 7 + 8
    d = next(s for s in doc["shards"] if s["shard"] == "d.tfrecord")
    assert d["problems"][0]["resync_offset"] == STARTS[3] and d["problems"][1]["index"] == 4

    assert cli.main(["repair", "--dry-run", str(src)]) == 0
    assert (src / "d.tfrecord").read_bytes() == damaged_bytes()
    capsys.readouterr()
    assert cli.main(["repair", str(src)]) == 0
    out = capsys.readouterr().out
    assert f"record 4 (bytes {STARTS[5]}..{STARTS[6]})" in out and f"bytes {STARTS[2]}..{STARTS[3]}" in out
    assert (src / "d.tfrecord").read_bytes() == b"".join(FRAMES[i] for i in SOUND)
    assert (src / ".tfrfs-damaged" / "d.tfrecord").read_bytes() == damaged_bytes()
    assert (src / "ok.tfrecord").read_bytes() == b"".join(FRAMES)
    assert not [p for p in os.listdir(src) if p.startswith(".tfrfs-commit-")]
    assert cli.main(["verify", str(src)]) == 0
    # The backup folder is never a shard folder of the mount, and repairing again finds nothing.
    assert [s.relpath for s in discovery.discover(str(src)).shards] == ["d.tfrecord", "ok.tfrecord"]
    assert cli.main(["repair", str(src)]) == 0


def test_repair_of_a_gzip_shard_damaged_mid_stream(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    many = [example(i) * 20 for i in range(3000)]
    raw = b"".join(tfrecord.frame(r) for r in many)
    packed = bytearray(gzip.compress(raw))
    packed[len(packed) // 2: len(packed) // 2 + 8] = b"garbage!"
    (tmp_path / "g.tfrecord.gz").write_bytes(bytes(packed))
    assert cli.main(["repair", "--no-backup", str(tmp_path / "g.tfrecord.gz")]) == 0
    assert not (tmp_path / ".tfrfs-damaged").exists()
    got = reference.written_records(tmp_path / "g.tfrecord.gz")
    assert len(got) > 1000 and got == many[:len(got)]
    assert "compressed bytes" in capsys.readouterr().out


def test_repair_refuses_staged_edits_a_writable_mount_and_urls(tmp_path: Path) -> None:
    (tmp_path / "d.tfrecord").write_bytes(damaged_bytes())
    staging = Staging(tmp_path)
    staging.acquire()
    try:
        assert cli.main(["repair", str(tmp_path)]) == 2   # mounted writable (the lock is held)
    finally:
        staging.release()
    from tfrfs.jobs.repair import check_repairable
    check_repairable(open_source(str(tmp_path)))          # lock released: allowed
    assert cli.main(["repair", "http://127.0.0.1:9/x.tfrecord"]) == 2
    assert (tmp_path / "d.tfrecord").read_bytes() == damaged_bytes()


def test_tfds_metadata_follows_a_repair(tmp_path: Path) -> None:
    info = {"name": "toy", "fileFormat": "tfrecord", "splits": [
        {"name": "train", "numBytes": "999", "shardLengths": ["8", "8"],
         "filepathTemplate": "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"},
        {"name": "test", "numBytes": "5", "shardLengths": ["8"]}]}
    (tmp_path / tfds.INFO).write_text(json.dumps(info))
    (tmp_path / "toy-train.tfrecord-00000-of-00002").write_bytes(b"".join(FRAMES))
    (tmp_path / "toy-train.tfrecord-00001-of-00002").write_bytes(damaged_bytes())
    (tmp_path / "toy-test.tfrecord-00000-of-00001").write_bytes(b"".join(FRAMES))
    assert cli.main(["repair", str(tmp_path)]) == 0
    got = json.loads((tmp_path / tfds.INFO).read_text())
    train, test = got["splits"]
    assert train["shardLengths"] == ["8", str(len(SOUND))]
    assert train["numBytes"] == str(sum(map(len, RECORDS)) + sum(len(RECORDS[i]) for i in SOUND))
    assert test == info["splits"][1]
    assert tfds.place(got, "toy-test.tfrecord-00000-of-00001") is not None
    assert tfds.place(got, "other.tfrecord") is None


def test_zeroed_tail_of_a_preallocated_shard(tmp_path: Path) -> None:
    """A writer that died after preallocating: sound records, then zeros to the end."""
    (tmp_path / "p.tfrecord").write_bytes(b"".join(FRAMES[:3]) + bytes(100_000))
    shard = discovery.discover(str(tmp_path)).shards[0]
    idx, _ = index.IndexCache(tmp_path / "cache").get(shard)
    assert idx.count == 3 and len(idx.problems) == 1
    p = idx.problems[0]
    assert (p.offset, p.resync_offset, p.skipped) == (STARTS[3], None, 100_000)
    assert struct.unpack_from("<Q", b"".join(FRAMES), 0)[0] == len(RECORDS[0])


def test_a_commit_in_a_damaged_shard_writes_what_the_mount_shows(tmp_path: Path) -> None:
    """--rw on a damaged shard: the gap is not copied into the new shard; a record whose data
    checksum fails cannot be listed, but rmdir drops it; the other records are copied as they are."""
    from inprocess import Session
    from tfrfs.errors import DataLoss

    src = tmp_path / "src"
    src.mkdir()
    (src / "d.tfrecord").write_bytes(damaged_bytes())
    s = Session(src, tmp_path / "cache")
    try:
        # Shown: records 0 1 3 4 5 6 7 of the file as 000000..000006; 000004 is record 5 (bad data).
        with pytest.raises(DataLoss):
            s.tree.names(s.tree.lookup("/d.tfrecord/000004"))
        s.rmdir("/d.tfrecord/000004")
        s.write("/d.tfrecord/000000/n.json", b"[100]")
        s.commit()
    finally:
        s.close()
    edited = proto.Example.FromString(RECORDS[0])
    edited.features.feature["n"].int64_list.value[:] = [100]
    got = reference.written_records(src / "d.tfrecord")
    assert got[1:] == [RECORDS[i] for i in (1, 3, 4, 6, 7)]
    assert reference.parse_example(got[0]) == reference.parse_example(edited.SerializeToString())


def test_verify_into_a_closed_pipe_stops_quietly(tmp_path: Path) -> None:
    """`tfrfs verify SRC | head -1`: exit as SIGPIPE would (141), and no traceback."""
    import subprocess
    import sys
    frames = [bytearray(tfrecord.frame(example(i))) for i in range(4000)]
    for f in frames:
        f[14] ^= 1                       # every record's data: 4,000 lines, more than a pipe holds
    (tmp_path / "bad.tfrecord").write_bytes(b"".join(frames))
    proc = subprocess.Popen([sys.executable, "-m", "tfrfs", "verify", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert b"bad.tfrecord: record 0" in proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in err, err


def test_a_damaged_plain_shard_that_starts_like_zlib_stays_plain(tmp_path: Path) -> None:
    """A 376-byte first record starts with 78 01, a valid zlib header; its header damaged, the
    shard is still walked plain, and the records after it are salvaged."""
    first = tfrecord.frame(b"x" * 376)
    assert first[:2] == b"\x78\x01"
    buf = bytearray(first + tfrecord.frame(b"second") + tfrecord.frame(b"third"))
    buf[9] ^= 1
    (tmp_path / "x.tfrecord").write_bytes(bytes(buf))
    (tmp_path / "y.tfrecord").write_bytes(gzip.compress(bytes(buf)))       # a gzip shard, not so named
    (tmp_path / "z.tfrecord.gz").write_bytes(b"\x1f\x8b\x08\x00" + bytes(40))  # hopeless, but named gzip
    got = {s.relpath: s.compression for s in discovery.discover(str(tmp_path)).shards}
    assert got == {"x.tfrecord": "NONE", "y.tfrecord": "GZIP", "z.tfrecord.gz": "GZIP"}
    idx, _ = index.IndexCache(tmp_path / "c").get(next(s for s in discovery.discover(str(tmp_path)).shards
                                                        if s.relpath == "x.tfrecord"))
    assert idx.count == 2
