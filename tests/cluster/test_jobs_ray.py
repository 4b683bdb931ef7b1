"""SPEC 8 on a Ray cluster (one node, two CPUs): ``--ray ADDRESS`` gives what ``--workers 1``
gives for index --beside, verify, inspect --json and repair, also when a Ray worker is killed
while it runs a job, and for a dataset in a bucket."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from support import jobdata


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return jobdata.make(tmp_path_factory.mktemp("jobs") / "data")


def _files(root: Path) -> dict[str, bytes]:
    got = jobdata.files(root)
    if ".tfrfs-manifest" in got:   # times of the folders and index files the command wrote
        doc = json.loads(got[".tfrfs-manifest"])
        for d in doc["dirs"] + doc["files"]:
            d.pop("mtime_ns")
        got[".tfrfs-manifest"] = json.dumps(doc, sort_keys=True).encode()
    return got


@pytest.mark.parametrize("args", [("verify",), ("inspect", "--json")])
def test_reading_commands_on_ray(ray_local_s3, dataset: Path, tmp_path: Path, args: tuple[str, ...]) -> None:
    for cache in ("c1", "c2"):   # indexed first: the large shard is verified in parts
        assert jobdata.run_on("index", "--no-schema", "--workers", "1", src=dataset, cache=tmp_path / cache)[0] == 1
    one = jobdata.run_on(*args, "--workers", "1", src=dataset, cache=tmp_path / "c1")
    on_ray = jobdata.run_on(*args, "--ray", ray_local_s3.address, src=dataset, cache=tmp_path / "c2")
    assert one == on_ray
    assert one[0] == (1 if args[0] == "verify" else 0)


@pytest.mark.parametrize("args", [("index", "--beside"), ("repair",)])
def test_writing_commands_on_ray(ray_local_s3, dataset: Path, tmp_path: Path, args: tuple[str, ...]) -> None:
    a, b = shutil.copytree(dataset, tmp_path / "a"), shutil.copytree(dataset, tmp_path / "b")
    one = jobdata.run_on(*args, "--workers", "1", src=a, cache=tmp_path / "c1")
    on_ray = jobdata.run_on(*args, "--ray", ray_local_s3.address, src=b, cache=tmp_path / "c2")
    assert one == on_ray
    assert _files(Path(a)) == _files(Path(b))


def test_a_killed_ray_worker_changes_nothing(ray_local_s3, tmp_path: Path) -> None:
    src = jobdata.make_slow(tmp_path / "slow")
    one = jobdata.run_on("verify", "--workers", "1", src=src, cache=tmp_path / "c1")
    killed: list[int] = []

    def kill() -> None:
        end = time.monotonic() + 60
        while time.monotonic() < end and not killed:
            for pid in jobdata.ray_task_pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
                except ProcessLookupError:
                    pass
            time.sleep(0.005)
    killer = threading.Thread(target=kill)
    killer.start()
    on_ray = jobdata.run_on("verify", "--ray", ray_local_s3.address, src=src, cache=tmp_path / "c2")
    killer.join()
    assert killed, "no Ray task was seen running"
    assert one == on_ray == (0, "2 shards, 300,000 records checked, 0 problem(s)\n")


def test_verify_of_a_bucket_on_ray(ray_local_s3, dataset: Path, s3, tmp_path: Path) -> None:
    s3.upload_tree(dataset)
    one = jobdata.run_on("verify", "--workers", "1", src=s3.url() + "/", cache=tmp_path / "c1")
    on_ray = jobdata.run_on("verify", "--ray", ray_local_s3.address, src=s3.url() + "/", cache=tmp_path / "c2")
    assert one == on_ray
    assert one[0] == 1 and "big.tfrecord: record 400" in one[1]


def _staged(tmp_path: Path, tfrfs_mount, gz_records: int = 2_000) -> tuple[Path, Path]:
    data = jobdata.make_commit(tmp_path / "data", gz_records=gz_records)
    assert jobdata.run("index", "--beside", "--workers", "1", str(data), cache=tmp_path / "c0")[0] == 1
    a, b = Path(shutil.copytree(data, tmp_path / "a")), Path(shutil.copytree(data, tmp_path / "b"))
    for src in (a, b):
        jobdata.stage_many(src, tfrfs_mount)
    return a, b


def test_commit_source_on_ray(ray_local_s3, tmp_path: Path, tfrfs_mount) -> None:
    """Ten changed shards of every kind (a new one, a removed one, GZIP ones, TFDS metadata, index
    files and a manifest beside them): what --workers 1 gives."""
    a, b = _staged(tmp_path, tfrfs_mount)
    one = jobdata.run_on("commit", "--workers", "1", src=a, cache=tmp_path / "c1")
    on_ray = jobdata.run_on("commit", "--ray", ray_local_s3.address, src=b, cache=tmp_path / "c2")
    assert one == on_ray and one[0] == 0
    assert "committed 10 shard(s)" in one[1]
    assert jobdata.committed_files(a) == jobdata.committed_files(b)


def test_commit_source_with_a_ray_worker_killed(ray_local_s3, tmp_path: Path, tfrfs_mount) -> None:
    """A Ray worker killed (SIGKILL) while it writes a new shard file: Ray runs its task again,
    and the output and files are what --workers 1 gives."""
    a, b = _staged(tmp_path, tfrfs_mount, gz_records=25_000)
    one = jobdata.run_on("commit", "--workers", "1", src=a, cache=tmp_path / "c1")
    # Indexed first: the only Ray tasks of the commit are then its write jobs.
    assert jobdata.run_on("index", "--no-schema", "--workers", "1", src=b, cache=tmp_path / "c2")[0] == 1
    cmd = jobdata.start("commit", "--ray", ray_local_s3.address, str(b), cache=tmp_path / "c2")
    with jobdata.WriterWatch(b, kill_one=True, spare=cmd.pid) as watch:
        code, out = jobdata.finish(cmd)
    assert watch.killed is not None, watch.seen
    assert one == (code, out.replace(str(b), "SRC"))
    assert jobdata.committed_files(a) == jobdata.committed_files(b)
