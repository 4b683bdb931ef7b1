"""A bucket mounted from its manifest (SPEC 1.2): no LIST request, nothing read per shard until a
record of it is looked up, then one request for that shard's index, counted at the loopback S3
server's proxy."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from remote_support import cli, gets_of, request_path, show

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from test_index import example, write_shard  # noqa: E402

pytestmark = pytest.mark.mount

SHARDS = 6
RECORDS = 200


def make_dataset(root: Path) -> None:
    for folder in ("train", "test"):
        (root / folder).mkdir(parents=True)
        for s in range(SHARDS // 2):
            write_shard(root / folder / f"part-{s:05d}.tfrecord",
                        [example(id=s * 1000 + i) for i in range(RECORDS)])
    (root / "dataset_info.json").write_text('{"name": "demo"}\n')


def listings(proxy) -> list:
    return [r for r in proxy.requests if "list-type" in r.path or "delimiter=" in r.path or
            ("prefix=" in r.path and r.method == "GET")]


def test_a_bucket_mounted_from_its_manifest_lists_nothing_and_reads_one_index_per_shard_touched(
        s3, tfrfs_mount, tmp_path: Path) -> None:
    local = tmp_path / "ds"
    make_dataset(local)
    s3.upload_tree(local, "ds")
    proc = cli("index", s3.url("ds"), "--beside", "--cache-dir", str(tmp_path / "indexer"))
    assert proc.returncode == 0, proc.stderr
    assert "wrote the dataset's manifest" in proc.stdout
    assert ".tfrfs-manifest" in set(k.rsplit("/", 1)[-1] for k in s3.keys("ds/"))

    s3.proxy.reset()
    mnt = tfrfs_mount(s3.url("ds"))   # a fresh cache
    assert sorted(os.listdir(mnt)) == ["dataset_info.json", "test", "train"]
    assert sorted(n for n in os.listdir(mnt / "train") if not n.endswith(".tfrfs-idx")) == \
        [f"part-{s:05d}.tfrecord" for s in range(SHARDS // 2)]
    assert len(os.listdir(mnt / "test" / "part-00001.tfrecord")) == RECORDS   # counts from the manifest
    assert not listings(s3.proxy), f"LIST requests:\n{show(listings(s3.proxy))}"
    read = {request_path(r) for r in s3.proxy.requests}
    assert read == {s3.path("ds/.tfrfs-manifest")}, f"before any record is looked up:\n{show(s3.proxy.requests)}"

    touched = ["train/part-00002.tfrecord", "test/part-00000.tfrecord"]
    for rel in touched:
        s = int(rel[-14:-9])
        for i in (0, 150, 199):
            assert json.loads((mnt / rel / f"{i:06d}" / "id.json").read_text()) == [s * 1000 + i]
    assert json.loads((mnt / "dataset_info.json").read_text()) == {"name": "demo"}
    assert not listings(s3.proxy), f"LIST requests:\n{show(listings(s3.proxy))}"
    for rel in touched:
        got = gets_of(s3.proxy, s3.path(f"ds/{rel}.tfrfs-idx"))
        assert len(got) == 1, f"{rel}: one request for its index, got:\n{show(got)}"
    for folder in ("train", "test"):
        for s in range(SHARDS // 2):
            rel = f"{folder}/part-{s:05d}.tfrecord"
            if rel in touched:
                continue
            late = [r for r in s3.proxy.requests if request_path(r).startswith(s3.path(f"ds/{rel}"))]
            assert not late, f"{rel} was never touched, yet:\n{show(late)}"
    assert (mnt / ".tfrfs" / "errors").read_text() == ""


def test_a_bucket_without_a_manifest_is_listed_as_before(s3, tfrfs_mount, tmp_path: Path) -> None:
    local = tmp_path / "ds"
    make_dataset(local)
    s3.upload_tree(local, "ds")
    s3.proxy.reset()
    mnt = tfrfs_mount(s3.url("ds"))
    assert listings(s3.proxy), "no manifest: the prefix is listed"
    assert json.loads((mnt / "train" / "part-00001.tfrecord" / "000003" / "id.json").read_text()) == [1003]
