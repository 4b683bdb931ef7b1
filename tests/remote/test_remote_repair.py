"""``tfrfs repair s3://...`` (SPEC 6, 1.1, 1.2): each damaged shard in a bucket is replaced whole by
exactly the bytes a local repair of the same file writes, the original kept under
``.tfrfs-damaged/``, the sound shards never written, the shipped indexes, the manifest and TFDS
``dataset_info.json`` in step; a crash at any step leaves each shard old or new, whole, and a
rerun finishes. Requests are counted at the loopback S3 server's proxy."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from remote_support import request_path, show
from support import forked, jobdata
from tfrfs import cli as tfrfs_cli

pytestmark = pytest.mark.mount

DAMAGED = ["a-train.tfrecord-00001-of-00002", "big.tfrecord", "d.tfrecord.zlib"]
SOUND = ["a-train.tfrecord-00000-of-00002", "c.tfrecord.gz", "seq/s.tfrecord"]
INFO = {"name": "a", "fileFormat": "tfrecord",
        "splits": [{"name": "train", "numBytes": "1", "shardLengths": ["50", "70"]}]}
WRITES = ("PUT", "POST", "DELETE")


def make(root: Path) -> Path:
    jobdata.make(root)
    (root / "dataset_info.json").write_text(json.dumps(INFO))
    return root


def run(*args: str, cache: Path, src: str) -> tuple[int, str]:
    code, out = jobdata.run(*args, src, cache=cache)
    return code, out.replace(src, "SRC")


def local_repair(tmp_path: Path, *extra: str) -> tuple[Path, tuple[int, str]]:
    """A local copy of the dataset, repaired: what the bucket must come to."""
    local = make(tmp_path / "local")
    return local, run("repair", "--workers", "1", *extra, cache=tmp_path / "lc", src=str(local))


def writes_to(proxy, path: str) -> list:
    return [r for r in proxy.requests if r.method in WRITES and request_path(r) == path]


@pytest.mark.parametrize("shipped", [False, True], ids=["listed", "with-index-and-manifest"])
def test_a_bucket_is_repaired_as_a_local_copy_is(s3, tfrfs_mount, tmp_path: Path, shipped: bool) -> None:
    original = make(tmp_path / "orig")
    expected, (local_code, local_out) = local_repair(tmp_path)
    assert local_code == 0
    s3.upload_tree(original, "ds")
    url = s3.url("ds")
    if shipped:
        assert run("index", "--beside", "--workers", "1", cache=tmp_path / "ic", src=url)[0] == 1   # damaged
        assert ".tfrfs-manifest" in {k.rsplit("/", 1)[-1] for k in s3.keys("ds/")}
    s3.proxy.reset()

    code, out = run("repair", "--workers", "1", cache=tmp_path / "c", src=url)
    assert (code, out) == (local_code, local_out)
    for rel in DAMAGED:
        assert s3.get(f"ds/{rel}") == (expected / rel).read_bytes(), rel
        assert s3.get(f"ds/.tfrfs-damaged/{rel}") == (original / rel).read_bytes(), rel
    for rel in SOUND:
        assert s3.get(f"ds/{rel}") == (original / rel).read_bytes(), rel
        assert not writes_to(s3.proxy, s3.path(f"ds/{rel}")), f"{rel} is sound, yet:\n{show(s3.proxy.requests)}"
    assert json.loads(s3.get("ds/dataset_info.json")) == json.loads((expected / "dataset_info.json").read_text())
    assert json.loads(s3.get("ds/dataset_info.json"))["splits"][0]["shardLengths"] == ["50", "68"]
    keys = s3.keys("ds/")
    assert not [k for k in keys if ".tfrfs-commit-" in k], keys
    assert not [k for k in keys if "~" in k], keys

    if shipped:
        doc = json.loads(s3.get("ds/.tfrfs-manifest"))
        entries = {e["path"]: e for e in doc["shards"]}
        for rel in DAMAGED:
            assert entries[rel]["size"] == len(s3.get(f"ds/{rel}")), rel
            assert entries[rel]["problems"] == [] and entries[rel]["gaps"] == [], rel
        # A mount from the manifest: its counts, the shipped indexes used as they are, nothing reported.
        mnt = tfrfs_mount(url)
        for rel in DAMAGED + SOUND:
            count = sum(1 for _ in _records(expected / rel))
            assert len(os.listdir(mnt / rel)) == count, rel
        assert (mnt / ".tfrfs" / "errors").read_text() == ""
    else:
        assert not [k for k in keys if k.endswith((".tfrfs-idx", ".tfrfs-manifest"))], keys
    assert run("verify", "--workers", "1", cache=tmp_path / "vc", src=url)[0] == 0
    # Nothing left to do: a second run writes nothing.
    s3.proxy.reset()
    assert run("repair", cache=tmp_path / "c2", src=url)[0] == 0
    assert not [r for r in s3.proxy.requests if r.method in WRITES], show(s3.proxy.requests)


def _records(path: Path) -> list[bytes]:
    """A repaired shard's records, read by the test suite's own reader: it must be whole."""
    from support import reference
    return reference.written_records(path)


def test_a_dry_run_of_a_bucket_says_what_a_local_one_says_and_writes_nothing(s3, tmp_path: Path) -> None:
    original = make(tmp_path / "orig")
    _, local = local_repair(tmp_path, "--dry-run")
    s3.upload_tree(original, "ds")
    s3.proxy.reset()
    assert run("repair", "--dry-run", "--workers", "1", cache=tmp_path / "c", src=s3.url("ds")) == local
    assert local[0] == 0 and "would keep" in local[1]
    assert not [r for r in s3.proxy.requests if r.method in WRITES], show(s3.proxy.requests)
    for rel in DAMAGED + SOUND:
        assert s3.get(f"ds/{rel}") == (original / rel).read_bytes()


def test_without_backup_nothing_is_kept(s3, tmp_path: Path) -> None:
    original = make(tmp_path / "orig")
    expected, (code, out) = local_repair(tmp_path, "--no-backup")
    s3.upload_tree(original, "ds")
    assert run("repair", "--no-backup", "--workers", "1", cache=tmp_path / "c", src=s3.url("ds")) == (code, out)
    assert not [k for k in s3.keys("ds/") if ".tfrfs-damaged" in k]
    for rel in DAMAGED:
        assert s3.get(f"ds/{rel}") == (expected / rel).read_bytes(), rel


def test_a_web_server_is_refused(http_server, tmp_path: Path) -> None:
    root = make(tmp_path / "orig")
    server = http_server(root)
    code, out = run("repair", "--workers", "1", cache=tmp_path / "c", src=f"{server.url}/big.tfrecord")
    assert code == 2 and out == ""


# --- a crash at every step -----------------------------------------------------------------------

CRASHED = 86
SMALL_DAMAGED = ["a-train.tfrecord-00001-of-00002", "d.tfrecord.zlib"]


def _small(root: Path) -> Path:
    """Two damaged shards (plain, ZLIB), a sound one, TFDS metadata."""
    full = make(root.parent / (root.name + "-full"))
    root.mkdir()
    for rel in SMALL_DAMAGED + ["a-train.tfrecord-00000-of-00002", "dataset_info.json"]:
        shutil.copy(full / rel, root / rel)
    shutil.rmtree(full)
    return root


def _repair_here(url: str, cache: Path) -> int:
    os.environ["XDG_CACHE_HOME"] = str(cache)
    return tfrfs_cli.main(["repair", "--workers", "1", url])


def _in_child(url: str, cache: Path, hook) -> int:
    """``tfrfs repair`` in a forked process with ``durable.fault_hook`` set: its exit status."""
    return forked.exit_status(hook, lambda: _repair_here(url, cache))


def test_a_crash_at_any_step_leaves_each_shard_whole_and_a_rerun_finishes(s3, tmp_path: Path) -> None:
    original = _small(tmp_path / "orig")
    expected = shutil.copytree(original, tmp_path / "expected")
    assert run("repair", "--workers", "1", cache=tmp_path / "lc", src=str(expected))[0] == 0

    s3.upload_tree(original, "seed")
    assert run("index", "--beside", "--workers", "1", cache=tmp_path / "ic", src=s3.url("seed"))[0] == 1
    shipped = {k[len("seed/"):]: s3.get(k) for k in s3.keys("seed/") if k.endswith((".tfrfs-idx", ".tfrfs-manifest"))}
    assert len(shipped) == 4

    def upload(prefix: str) -> str:
        """The dataset with its shipped indexes and manifest (they name sizes and ETags, the same
        for the same bytes anywhere in the bucket)."""
        s3.upload_tree(original, prefix)
        for rel, data in shipped.items():
            s3.put(f"{prefix}/{rel}", data)
        return s3.url(prefix)

    steps: list[tuple[str, str]] = []
    pid_file = tmp_path / "steps.json"

    def record(op: str, path: str) -> None:
        if "://" in path:
            steps.append((op, path))
            pid_file.write_text(json.dumps(steps))
    assert _in_child(upload("count"), tmp_path / "c0", record) == 0
    seen = [tuple(s) for s in json.loads(pid_file.read_text())]
    names = [p.rsplit("/", 1)[-1] for _, p in seen]
    # The order the module promises: temporary object, backup, replace, delete; the metadata after.
    for rel in SMALL_DAMAGED:
        tmp = names.index(".tfrfs-commit-repair-" + rel)
        assert seen[tmp][0] == "write"
        assert ("write", s3.url(f"count/.tfrfs-damaged/{rel}")) in seen
        assert seen.index(("write", s3.url(f"count/.tfrfs-damaged/{rel}"))) < seen.index(("rename", s3.url(f"count/{rel}")))
    assert names[-1] == ".tfrfs-manifest"
    assert len(seen) >= 10

    for n in range(1, len(seen) + 1):
        where = f"crash at step {n}/{len(seen)} ({seen[n - 1][0]} {names[n - 1]})"
        prefix = f"crash{n}"
        url = upload(prefix)
        count = [0]

        def die(op: str, path: str) -> None:
            if "://" in path:
                count[0] += 1
                if count[0] == n:
                    os._exit(CRASHED)
        assert _in_child(url, tmp_path / f"c{n}", die) == CRASHED, where
        for rel in SMALL_DAMAGED:
            now = s3.get(f"{prefix}/{rel}")
            assert now in ((original / rel).read_bytes(), (expected / rel).read_bytes()), f"{where}: {rel} is torn"
            kept = f"{prefix}/.tfrfs-damaged/{rel}"
            if kept in s3.keys(prefix + "/"):
                assert s3.get(kept) == (original / rel).read_bytes(), f"{where}: the kept original is torn"
        code, _ = run("repair", "--workers", "1", cache=tmp_path / f"r{n}", src=url)
        assert code == 0, where
        keys = s3.keys(prefix + "/")
        for rel in SMALL_DAMAGED:
            assert s3.get(f"{prefix}/{rel}") == (expected / rel).read_bytes(), where
            assert s3.get(f"{prefix}/.tfrfs-damaged/{rel}") == (original / rel).read_bytes(), where
        assert not [k for k in keys if "~" in k or ".tfrfs-commit-" in k], f"{where}: {keys}"
        assert json.loads(s3.get(f"{prefix}/dataset_info.json")) == \
            json.loads((expected / "dataset_info.json").read_text()), where
        doc = json.loads(s3.get(f"{prefix}/.tfrfs-manifest"))
        for e in doc["shards"]:
            assert e["size"] == len(s3.get(f"{prefix}/{e['path']}")) and not e["problems"], f"{where}: {e}"
        if n == len(seen):
            assert run("verify", "--workers", "1", cache=tmp_path / f"v{n}", src=url)[0] == 0, where
