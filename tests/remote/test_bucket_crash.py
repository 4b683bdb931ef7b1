"""A bucket commit killed at every durable step (SPEC 7.1): the bucket reads as the old dataset or
the new one, whole, and ``tfrfs commit SOURCE`` run again finishes the job (the edits committed
once, the objects the version before retired deleted, nothing else left behind).

The commit crashed is a dataset's second: the first gave it its manifest and retired an object,
so the second's clean-up is among the steps crashed at."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
from pathlib import Path

import pytest

import tfrfs
from conftest import daemon_pids, run_tfrfs, wait_ended
from support import forked, jobdata
from tfrfs import cli as tfrfs_cli
from tfrfs.edit import bucket_commit
from tfrfs.format import tfrecord

pytestmark = pytest.mark.mount

CRASHED = 86



def _dataset(root: Path) -> Path:
    """Three small shards: two the commit changes (one compressed), one it leaves."""
    root.mkdir()
    frames = [tfrecord.frame(jobdata.example(i)) for i in range(30)]
    (root / "a.tfrecord").write_bytes(b"".join(frames[:12]))
    (root / "b.tfrecord.gz").write_bytes(gzip.compress(b"".join(frames[12:24])))
    (root / "c.tfrecord").write_bytes(b"".join(frames[24:]))
    return root


def _records(url: str, cache: Path) -> dict[str, list[bytes]]:
    with tfrfs.open(url, cache_dir=str(cache)) as d:
        return {s.path: [bytes(d.record(s.path, i)) for i in range(s.records)] for s in d.shards}


def _counted(path: str) -> bool:
    """The steps crashed at: every write and delete in the bucket, and the commit's record in
    the journal (its other files are the local commit's, whose crash tests are tests/crash)."""
    return "://" in path or bucket_commit.RECORD in path


def _commit_in_child(url: str, cache: Path, hook) -> int:
    """``tfrfs commit URL`` in a forked process with ``durable.fault_hook`` set: its exit status."""
    return forked.exit_status(hook, lambda: tfrfs_cli.main(["commit", url, "--cache-dir", str(cache), "--workers", "1"]))


def _stop(mnt: Path) -> None:
    """Stop a mount's daemon with SIGTERM: unmounted, its edits left staged."""
    pids = daemon_pids(mnt)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    for pid in pids:
        wait_ended(pid)


def test_a_crash_at_every_step_leaves_old_or_new_and_a_rerun_finishes(s3, tfrfs_mount, tmp_path: Path) -> None:
    # The dataset after a first commit, and the edits of a second one staged (the mount stopped).
    s3.upload_tree(_dataset(tmp_path / "data"), "tpl")
    tpl_url, tpl_cache = s3.url("tpl"), tmp_path / "tpl-cache"
    mnt = tfrfs_mount(tpl_url, "--rw", "--cache-dir", str(tpl_cache))
    (mnt / "a.tfrecord/000000/n.json").write_text("[1000]\n")
    assert run_tfrfs("umount", str(mnt)).returncode == 0
    assert json.loads(s3.get("tpl/.tfrfs-manifest"))["retired"] == ["a.tfrecord"]
    old = _records(tpl_url, tmp_path / "c-old")
    mnt = tfrfs_mount(tpl_url, "--rw", "--cache-dir", str(tpl_cache), mountpoint=mnt)
    (mnt / "a.tfrecord/000001/n.json").write_text("[1001]\n")
    shutil.rmtree(mnt / "b.tfrecord.gz/000003")
    _stop(mnt)
    staged = bucket_commit.staging_root(tpl_url, tpl_cache)
    assert (staged / ".tfrfs-staging" / "shards").is_dir()

    def prepare(prefix: str) -> tuple[str, Path]:
        """The dataset at ``prefix`` and a cache folder holding the same staged edits for it."""
        s3.copy_prefix("tpl", prefix)
        url, cache = s3.url(prefix), tmp_path / f"cache-{prefix}"
        shutil.copytree(staged, bucket_commit.staging_root(url, cache))
        return url, cache

    # Committed whole, once, recording every step it takes (forked: they come back in a file).
    url, cache = prepare("count")
    log = tmp_path / "steps.json"
    steps: list[tuple[str, str]] = []

    def record(op: str, path: str) -> None:
        if _counted(path):
            steps.append((op, path))
            log.write_text(json.dumps(steps))
    assert _commit_in_child(url, cache, record) == 0
    seen = [tuple(s) for s in json.loads(log.read_text())]
    new = _records(url, tmp_path / "c-new")
    assert new != old and new["b.tfrecord.gz"] == old["b.tfrecord.gz"][:3] + old["b.tfrecord.gz"][4:]
    manifest_at = [n for n, (op, p) in enumerate(seen) if p.endswith("/.tfrfs-manifest")]
    assert len(manifest_at) == 1 and 0 < manifest_at[0] < len(seen) - 1, seen
    assert ("unlink", s3.url("count/a.tfrecord")) in seen[manifest_at[0]:], seen   # the clean-up
    assert len(seen) >= 7, seen

    for n in range(1, len(seen) + 1):
        op, path = seen[n - 1]
        where = f"crash at step {n}/{len(seen)} ({op} {path.rsplit('/', 2)[-2:]})"
        url, cache = prepare(f"crash{n}")
        count = [0]

        def die(op: str, path: str) -> None:
            if _counted(path):
                count[0] += 1
                if count[0] == n:
                    os._exit(CRASHED)
        assert _commit_in_child(url, cache, die) == CRASHED, where
        now = _records(url, tmp_path / f"c{n}-after")
        assert now in (old, new), f"{where}: the bucket reads as neither the old dataset nor the new one"
        assert (now == new) == (n - 1 > manifest_at[0]), where   # the manifest's write is the commit
        proc = run_tfrfs("commit", url, "--cache-dir", str(cache))
        assert proc.returncode == 0, f"{where}: {proc.stderr}"
        assert _records(url, tmp_path / f"c{n}-rerun") == new, where
        assert not any((bucket_commit.staging_root(url, cache) / ".tfrfs-staging" / "shards").glob("*")), where
        prefix = f"crash{n}/"
        doc = json.loads(s3.get(prefix + ".tfrfs-manifest"))
        named = {e.get("object") or e["path"] for e in doc["shards"]} | {f["path"] for f in doc["files"]} | \
            {(e.get("object") or e["path"]) + ".tfrfs-idx" for e in doc["shards"] if e.get("index")}
        left = {k[len(prefix):] for k in s3.keys(prefix)} - named - {".tfrfs-manifest"} - set(doc["retired"])
        # What a commit the crash cut short uploaded is named by no manifest: it goes with a later
        # commit (once older than the version that commit replaces); nothing else is left.
        assert all(k.startswith(".tfrfs-objects/") for k in left), f"{where}: {sorted(left)}"
        assert "a.tfrecord" not in {k[len(prefix):] for k in s3.keys(prefix)}, f"{where}: not cleaned up"
