"""A shard folder lists as a stream, each entry with its attributes (readdirplus): what ``ls -l``
and ``find`` see without a lookup per name must be what a stat of each name gives."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from tfrfs.format import tfrecord

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from test_index import example, write_shard  # noqa: E402

pytestmark = pytest.mark.mount


def listed(folder: Path) -> dict[str, tuple[int, int, int]]:
    """(mode type, size, inode) of each entry as the listing gave it."""
    with os.scandir(folder) as it:
        return {e.name: (stat.S_IFMT(e.stat(follow_symlinks=False).st_mode), e.stat().st_size, e.inode())
                for e in it}


def test_the_attributes_a_listing_gives_are_those_of_each_record(tmp_path: Path, tfrfs_mount) -> None:
    root = tmp_path / "ds"
    root.mkdir()
    raw = [bytes([7]) * n for n in (0, 1, 511, 512, 513, 40_000, 3)]   # not Examples: a raw shard
    write_shard(root / "raw.tfrecord", raw)
    records = [example(id=i) for i in range(1200)]
    write_shard(root / "ex.tfrecord", records)
    mnt = tfrfs_mount(root)
    got = listed(mnt / "raw.tfrecord")
    assert sorted(got) == [f"{i:06d}.bin" for i in range(len(raw))]
    for i, data in enumerate(raw):
        kind, size, ino = got[f"{i:06d}.bin"]
        st = os.stat(mnt / "raw.tfrecord" / f"{i:06d}.bin")
        assert (kind, size, ino) == (stat.S_IFREG, len(data), st.st_ino)
        assert st.st_blocks == (len(data) + 511) // 512
    got = listed(mnt / "ex.tfrecord")
    assert len(got) == len(records)
    inos = [got[f"{i:06d}"][2] for i in range(len(records))]
    assert inos == sorted(inos) and len(set(inos)) == len(inos), "numbered in record order (cp -r reads in order)"
    for i in (0, 1, 599, 1199):
        st = os.stat(mnt / "ex.tfrecord" / f"{i:06d}")
        assert (stat.S_ISDIR(st.st_mode), st.st_ino) == (True, inos[i])
        assert got[f"{i:06d}"][0] == stat.S_IFDIR
    assert (mnt / "ex.tfrecord" / "000599" / "id.json").read_text() == "[599]\n"


def test_an_empty_record_whose_checksum_fails_is_listed_and_its_stat_fails(tmp_path: Path, tfrfs_mount) -> None:
    root = tmp_path / "ds"
    root.mkdir()
    shard = root / "raw.tfrecord"
    write_shard(shard, [b"\x01\x02", b"", b"\x03"])
    data = bytearray(shard.read_bytes())
    empty_at = tfrecord.OVERHEAD + 2
    data[empty_at + tfrecord.HEADER] ^= 0xFF      # the empty record's data checksum
    shard.write_bytes(bytes(data))
    mnt = tfrfs_mount(root)
    assert sorted(os.listdir(mnt / "raw.tfrecord")) == ["000000.bin", "000001.bin", "000002.bin"]
    with pytest.raises(OSError) as err:
        os.stat(mnt / "raw.tfrecord" / "000001.bin")
    assert err.value.errno == 5
    assert (mnt / "raw.tfrecord" / "000002.bin").read_bytes() == b"\x03"
