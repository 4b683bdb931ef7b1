"""README's example of moving a record to another shard, run as written in a --rw mount."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from tfrfs.format import proto
from tfrfs.format import tfrecord

from conftest import REPO, run_tfrfs
from support import reference

pytestmark = pytest.mark.mount


def _example_line() -> str:
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("mv shard-a/") and "another shard" in line:
            return line.split("#")[0].strip()
    raise AssertionError("README has no `mv shard-a/...` example")


def test_readme_mv_moves_a_record_to_another_shard(tmp_path: Path, tfrfs_mount) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for shard in ("shard-a", "shard-b"):   # shards by content, whatever their names (SPEC 1)
        frames = []
        for i in range(10):
            ex = proto.Example()
            ex.features.feature["from"].bytes_list.value.append(f"{shard}/{i}".encode())
            frames.append(tfrecord.frame(ex.SerializeToString()))
        (src / shard).write_bytes(b"".join(frames))
    mnt = tfrfs_mount(src, "--rw")
    proc = subprocess.run(shlex.split(_example_line()), cwd=mnt, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert len(list((mnt / "shard-a").iterdir())) == 9 and len(list((mnt / "shard-b").iterdir())) == 11
    assert run_tfrfs("umount", str(mnt)).returncode == 0
    moved = [reference.values(r, "from")[0] for r in reference.written_records(src / "shard-b")]
    assert moved == [f"shard-b/{i}".encode() for i in range(10)] + [b"shard-a/7"]
