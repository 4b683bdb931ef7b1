"""``tfrfs reshard --no-check``: byte ranges copied without looking at each record, giving the
same shards and index files as the checked copy, and damaged data copied as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

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


# --- the header walk of an unchecked copy (offsets found in the job, not sent with it) ---------

class _Sink:
    """What ``_copy_unchecked`` gives a shard writer: the bytes emitted and the offsets taken."""

    def __init__(self) -> None:
        from array import array
        self.offsets, self.stream, self.data_bytes, self.out = array("Q", [0]), 0, 0, bytearray()

    def emit_from(self, view: memoryview, fd: int | None, offset: int) -> None:
        self.out += view


def _unchecked(data: bytes, start: int, end: int, starts: bytes | None, count: int) -> _Sink:
    from tfrfs.jobs import reshard
    sink = _Sink()
    stream = reshard._Stream(None, lambda n, off: data[off:off + n], lambda: None)
    reshard._copy_unchecked(stream, start, end, starts, sink, count, "s.tfrecord")  # type: ignore[arg-type]
    return sink


def test_an_unchecked_copy_finds_the_offsets_its_index_has(monkeypatch: pytest.MonkeyPatch) -> None:
    import struct
    from tfrfs.jobs import reshard
    records = [bytes([i]) * (i * 7 % 50) for i in range(40)]
    frames = [tfrecord.frame(r) for r in records]
    data = b"".join(frames)
    heads = [sum(map(len, frames[:i])) for i in range(len(frames))]
    for block in (16, 23, 50, 64, 1000, 1 << 20):   # headers cut by a block's end, and none
        monkeypatch.setattr(reshard, "BLOCK", block)
        for first, last in ((0, 40), (3, 17), (39, 40)):
            start, end = heads[first], heads[last] if last < 40 else len(data)
            starts = struct.pack(f"<{last - first}Q", *heads[first:last])
            walked = _unchecked(data, start, end, None, last - first)
            sent = _unchecked(data, start, end, starts, last - first)
            assert bytes(walked.out) == bytes(sent.out) == data[start:end]
            assert walked.offsets == sent.offsets and walked.data_bytes == sent.data_bytes, (block, first)
            assert list(walked.offsets) == [0] + [h - start for h in heads[first + 1:last]] + [end - start]


def test_an_unchecked_copy_of_a_changed_shard_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    from tfrfs.errors import DataLoss
    from tfrfs.jobs import reshard
    frames = [tfrecord.frame(bytes(20)) for _ in range(10)]
    data = bytearray(b"".join(frames))
    data[len(frames[0]) * 4 + 2] ^= 1                    # record 4's header
    monkeypatch.setattr(reshard, "BLOCK", 64)
    with pytest.raises(DataLoss, match="changed since it was indexed"):
        _unchecked(bytes(data), 0, len(data), None, 10)
    with pytest.raises(DataLoss, match="its index says 11"):
        _unchecked(b"".join(frames), 0, len(data), None, 11)
