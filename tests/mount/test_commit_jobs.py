"""SPEC 8: ``tfrfs commit SOURCE`` gives the same shards and output whether the changed shards
are written in this process (``--workers 1``) or by shard jobs in a pool of local processes (the
default), also when a worker is killed while it writes; and the writing really happens in the
workers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from support import jobdata

pytestmark = pytest.mark.mount


def _staged_copies(tmp_path: Path, tfrfs_mount, names: tuple[str, ...], **make) -> list[Path]:
    """Copies of ``make_commit``'s dataset (with index files beside and a manifest), each with
    ``stage_many``'s changes staged."""
    data = jobdata.make_commit(tmp_path / "data", **make)
    assert jobdata.run("index", "--beside", "--workers", "1", str(data), cache=tmp_path / "c0")[0] == 1
    out = []
    for name in names:
        src = Path(shutil.copytree(data, tmp_path / name))
        jobdata.stage_many(src, tfrfs_mount, make.get("gz_shards", 3))
        out.append(src)
    return out


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


def test_many_changed_shards_the_same_in_a_pool(tmp_path: Path, tfrfs_mount) -> None:
    """Edits, deletions and added records in plain, damaged, GZIP and sequence shards, a new
    shard and a removed one: the same output, shard files, index files, manifest and TFDS
    metadata, byte for byte."""
    a, b = _staged_copies(tmp_path, tfrfs_mount, ("a", "b"))
    before = jobdata.files(a)
    one = jobdata.run("commit", "--workers", "1", str(a), cache=tmp_path / "c1")
    pool = jobdata.run("commit", "--workers", "2", str(b), cache=tmp_path / "c2")
    assert one[0] == 0, one
    assert one == (pool[0], pool[1].replace(str(b), str(a))), pool
    assert "committed 10 shard(s)" in one[1] and "removed  d.tfrecord.zlib" in one[1], one[1]
    got = jobdata.committed_files(a)
    assert got == jobdata.committed_files(b)
    assert "d.tfrecord.zlib" not in got and "new.tfrecord" in got and "new.tfrecord.tfrfs-idx" in got
    assert not [n for n in got if n.startswith(".tfrfs-staging") or ".tfrfs-commit-" in n]
    for name in ("a-train.tfrecord-00000-of-00002", "c.tfrecord.gz", "g0.tfrecord.gz", "seq/s.tfrecord",
                 "dataset_info.json", "big.tfrecord.tfrfs-idx"):
        assert got[name] != before[name], name
    info = json.loads(got["dataset_info.json"])
    assert info["splits"][0]["shardLengths"] == ["50", "69"]
    checked = [jobdata.run("verify", "--workers", "1", str(src), cache=tmp_path / "c3")[1] for src in (a, b)]
    assert checked[0] == checked[1].replace(str(b), str(a)) and "new.tfrecord" not in checked[0]


def test_the_new_files_are_written_by_the_workers(tmp_path: Path, tfrfs_mount) -> None:
    """Seen in /proc while the commands run: with a pool, processes other than the command hold
    the new shards' temporary files open (write them); with ``--workers 1``, the command alone."""
    a, b = _staged_copies(tmp_path, tfrfs_mount, ("a", "b"), gz_records=25_000)
    here_cmd = jobdata.start("commit", "--workers", "1", str(a), cache=tmp_path / "c1")
    with jobdata.WriterWatch(a) as here:
        one = jobdata.finish(here_cmd)
    pool_cmd = jobdata.start("commit", "--workers", "2", str(b), cache=tmp_path / "c2")
    with jobdata.WriterWatch(b) as pool:
        two = jobdata.finish(pool_cmd)
    assert one[0] == two[0] == 0
    assert set(here.seen) == {here_cmd.pid}, here.seen
    workers = {pid: names for pid, names in pool.seen.items() if pid != pool_cmd.pid}
    assert workers, pool.seen
    assert len(set().union(*workers.values())) >= 2, workers   # more than one shard written there
    assert jobdata.committed_files(a) == jobdata.committed_files(b)


def test_a_killed_worker_changes_nothing(tmp_path: Path, tfrfs_mount) -> None:
    """A pool worker killed (SIGKILL) while it writes a new shard file: its job runs again, and
    the commit's output and files are what ``--workers 1`` gives."""
    a, b = _staged_copies(tmp_path, tfrfs_mount, ("a", "b"), gz_records=25_000)
    one = jobdata.run("commit", "--workers", "1", str(a), cache=tmp_path / "c1")
    cmd = jobdata.start("commit", "--workers", "2", str(b), cache=tmp_path / "c2")
    with jobdata.WriterWatch(b, kill_one=True, spare=cmd.pid) as watch:
        two = jobdata.finish(cmd)
    assert watch.killed is not None, watch.seen
    assert one == (two[0], two[1].replace(str(b), str(a)))
    assert jobdata.committed_files(a) == jobdata.committed_files(b)
