"""SPEC 8: ``tfrfs commit SOURCE`` gives the same shards and output whether the source's shards
are indexed in this process (``--workers 1``) or by a pool of local processes (the default)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from support import jobdata

pytestmark = pytest.mark.mount


def test_commit_source_gives_the_same_shards(tmp_path: Path, tfrfs_mount) -> None:
    data = jobdata.make(tmp_path / "data")
    a, b = shutil.copytree(data, tmp_path / "a"), shutil.copytree(data, tmp_path / "b")
    for src in (a, b):
        jobdata.stage_edits(Path(src), tfrfs_mount)
    one = jobdata.run("commit", "--workers", "1", str(a), cache=tmp_path / "c1")
    pool = jobdata.run("commit", str(b), cache=tmp_path / "c2")
    assert one == pool and one[0] == 0, one
    assert "committed 3 shard(s)" in one[1]
    got = jobdata.files(Path(a))
    assert got == jobdata.files(Path(b))
    assert got[jobdata.BIG] != (data / jobdata.BIG).read_bytes()
