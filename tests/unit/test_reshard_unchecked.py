"""``tfrfs reshard --no-check``: byte ranges copied without looking at each record, giving the
same shards and index files as the checked copy, and damaged data copied as it is."""

from __future__ import annotations

from pathlib import Path

from conftest import REPO, run_tfrfs
from support import reference
from tfrfs.format import proto
from tfrfs.format import tfrecord


def _record(i: int) -> bytes:
    ex = proto.Example()
    ex.features.feature["id"].int64_list.value.append(i)
    ex.features.feature["text"].bytes_list.value.append(b"x" * (i % 37))
    return ex.SerializeToString()


def _source(root: Path, damage: bool = False) -> list[bytes]:
    root.mkdir()
    records = [_record(i) for i in range(400)]
    for s in range(4):
        frames = [tfrecord.frame(r) for r in records[s * 100:(s + 1) * 100]]
        buf = bytearray(b"".join(frames))
        if damage and s == 1:
            at = sum(map(len, frames[:7]))
            buf[at + tfrecord.HEADER + 2] ^= 0x40       # record 107's data: its data checksum fails
            at = sum(map(len, frames[:40]))
            buf[at + 3] ^= 1                            # record 140's header: a gap
        (root / f"src-{s:05d}-of-00004.tfrecord").write_bytes(bytes(buf))
    return records


def _reshard(src: Path, dest: Path, *extra: str) -> tuple[int, str]:
    proc = run_tfrfs("reshard", str(src), str(dest), "--shards", "7", "--no-schema", "--cache-dir",
                     str(dest.parent / "cache"), *extra, cwd=REPO)
    assert "Traceback" not in proc.stderr
    return proc.returncode, proc.stdout


def _content(folder: Path) -> dict[str, tuple[bytes, list[int], int]]:
    """Each shard the manifest names: its bytes, its shipped index's offsets and its record count,
    read by the test suite's own reader."""
    out = {}
    for e in reference.read_manifest(folder)["shards"]:
        meta, offsets = reference.read_index_file((folder / (e["path"] + ".tfrfs-idx")).read_bytes())
        out[e["path"]] = ((folder / e["path"]).read_bytes(), offsets, e["count"])
    return out


def _records(folder: Path) -> list[bytes]:
    out = []
    for name in sorted(p.name for p in folder.iterdir() if p.name.endswith(".tfrecord")):
        data = (folder / name).read_bytes()
        pos = 0
        while pos < len(data):
            length = int.from_bytes(data[pos:pos + 8], "little")
            out.append(data[pos + 12:pos + 12 + length])
            pos += length + tfrecord.OVERHEAD
    return out


def test_unchecked_gives_the_checked_copy(tmp_path: Path) -> None:
    records = _source(tmp_path / "src")
    assert _reshard(tmp_path / "src", tmp_path / "checked")[0] == 0
    assert _reshard(tmp_path / "src", tmp_path / "fast", "--workers", "2", "--no-check")[0] == 0
    checked, fast = _content(tmp_path / "checked"), _content(tmp_path / "fast")
    assert len(fast) == 7 and fast == checked
    assert _records(tmp_path / "fast") == records


def test_unchecked_copies_damaged_data_as_it_is_and_leaves_gaps_out(tmp_path: Path) -> None:
    records = _source(tmp_path / "src", damage=True)
    code, out = _reshard(tmp_path / "src", tmp_path / "fast", "--no-check")
    assert code == 1, out
    got = _records(tmp_path / "fast")
    # The gap (record 140's header) is left out, as the checked copy leaves it out; record 107's
    # damaged data is copied as it is, so its checksum still fails where it lands.
    assert len(got) == len(records) - 1
    assert got[:107] == records[:107] and got[108:] == [r for i, r in enumerate(records) if i > 107 and i != 140]
    assert got[107] != records[107]
    code, checked_out = _reshard(tmp_path / "src", tmp_path / "checked")
    assert code == 1 and len(_records(tmp_path / "checked")) == len(records) - 2


def test_unchecked_refuses_what_needs_each_record(tmp_path: Path) -> None:
    _source(tmp_path / "src")
    for extra in (("--shuffle", "1"), ("--compression", "gzip")):
        code, _ = _reshard(tmp_path / "src", tmp_path / "x", "--no-check", *extra)
        assert code == 2
