"""Files a job writes and makes durable later (one ``syncfs`` for ``reshard``'s new shards, one
``fsync`` at the end of a repaired shard) are handed to the disk as they are finished
(``durable.start_writeback``), so the disk writes while the job goes on: each new shard once,
a repaired shard as its copy goes. A hint only: nothing waits, errors are left to the final
sync."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support import reference
from tfrfs.cli.parser import main
from tfrfs.edit.repack import TMP_PREFIX
from tfrfs.format import proto
from tfrfs.storage import durable


class Started:
    """Stands in for the C call and notes which file each call was for; the real call follows."""

    def __init__(self) -> None:
        self.real = durable._sync_file_range()
        self.files: list[str] = []

    def __call__(self, fd: int, offset: int, nbytes: int, flags: int) -> int:
        assert (offset, nbytes, flags) == (0, 0, 2)   # the whole file, SYNC_FILE_RANGE_WRITE, no wait
        self.files.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        return self.real(fd, offset, nbytes, flags) if callable(self.real) else 0


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Started:
    if not os.path.exists("/proc/self/fd"):
        pytest.skip("no /proc/self/fd here to name a descriptor's file")
    s = Started()
    monkeypatch.setattr(durable, "_sync_file_range", lambda: s)
    return s


def _source(root: Path, shards: int = 3) -> None:
    root.mkdir()
    for s in range(shards):
        records = []
        for i in range(s * 40, (s + 1) * 40):
            ex = proto.Example()
            ex.features.feature["id"].int64_list.value.append(i)
            records.append(ex.SerializeToString())
        (root / f"src-{s:05d}-of-{shards:05d}.tfrecord").write_bytes(b"".join(reference.frame(r) for r in records))


def test_each_new_shard_of_a_reshard_is_handed_to_the_disk_once(tmp_path: Path, started: Started) -> None:
    _source(tmp_path / "src")
    assert main(["reshard", str(tmp_path / "src"), str(tmp_path / "dest"), "--shards", "5", "--workers", "1",
                 "--cache-dir", str(tmp_path / "cache")]) == 0
    shards = sorted(p.name for p in (tmp_path / "dest").glob("*.tfrecord*") if not p.name.endswith(".tfrfs-idx"))
    assert len(shards) == 5
    assert sorted(started.files) == shards


def test_a_repaired_shard_is_handed_to_the_disk_as_it_is_copied(tmp_path: Path, started: Started) -> None:
    _source(tmp_path / "src", 1)
    shard = next((tmp_path / "src").iterdir())
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF   # a record's data checksum fails
    shard.write_bytes(bytes(data))
    assert main(["repair", str(tmp_path / "src"), "--workers", "1", "--cache-dir", str(tmp_path / "cache")]) == 0
    if not hasattr(os, "copy_file_range"):
        assert started.files == []   # written by the Python path: its fsync does it all
        return
    assert started.files and set(started.files) == {f"{TMP_PREFIX}repair-{shard.name}"}


def test_a_bad_descriptor_is_no_error() -> None:
    durable.start_writeback(-1)
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    durable.start_writeback(w)   # closed
