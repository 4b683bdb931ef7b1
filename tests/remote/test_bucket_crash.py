"""A bucket commit killed at every durable step (SPEC 7.1): the bucket reads as the old dataset or
the new one, whole, and ``tfrfs commit SOURCE`` run again finishes the job (the edits committed
once, nothing left behind but what the manifest says it retired)."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

import tfrfs
from conftest import daemon_pids, run_tfrfs, wait_ended
from tfrfs import cli as tfrfs_cli
from tfrfs.edit import bucket_commit
from tfrfs.storage import durable

pytestmark = pytest.mark.mount

CRASHED = 86
EDITS = {"train/train-00000-of-00002.tfrecord/000001/image/object/class/label.json": "[5, 6]\n",
         "val/val-00000-of-00001.tfrecord/000000/image/object/class/label.json": "[9]\n"}
REMOVED = "train/train-00001-of-00002.tfrecord/000003"


def _records(url: str, cache: Path) -> dict[str, list[bytes]]:
    with tfrfs.open(url, cache_dir=str(cache)) as d:
        return {s.path: [bytes(d.record(s.path, i)) for i in range(s.records)] for s in d.shards}


def _counted(path: str) -> bool:
    """The steps crashed at: every write and delete in the bucket, and the commit's record in
    the journal (its other files are the local commit's, whose crash tests are tests/crash)."""
    return "://" in path or bucket_commit.RECORD in path


def _commit_in_child(url: str, cache: Path, hook) -> int:
    """``tfrfs commit URL`` in a forked process with ``durable.fault_hook`` set: its exit status."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            durable.fault_hook = hook
            code = tfrfs_cli.main(["commit", url, "--cache-dir", str(cache), "--workers", "1"])
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), status
    return os.WEXITSTATUS(status)


def test_a_crash_at_every_step_leaves_old_or_new_and_a_rerun_finishes(sample: Path, s3, tfrfs_mount,
                                                                       tmp_path: Path) -> None:
    # The edits, staged once by a mount that is stopped (SIGTERM: staged, not committed) ...
    s3.upload_tree(sample, "tpl")
    tpl_url, tpl_cache = s3.url("tpl"), tmp_path / "tpl-cache"
    old = _records(tpl_url, tmp_path / "c-old")
    mnt = tfrfs_mount(tpl_url, "--rw", "--cache-dir", str(tpl_cache))
    for rel, text in EDITS.items():
        (mnt / rel).write_text(text)
    shutil.rmtree(mnt / REMOVED)
    pids = daemon_pids(mnt)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    for pid in pids:
        wait_ended(pid)
    staged = bucket_commit.staging_root(tpl_url, tpl_cache)
    assert (staged / ".tfrfs-staging" / "shards").is_dir()

    def prepare(prefix: str) -> tuple[str, Path]:
        """The dataset at ``prefix`` and a cache folder holding the same staged edits for it."""
        s3.upload_tree(sample, prefix)
        url, cache = s3.url(prefix), tmp_path / f"cache-{prefix}"
        shutil.copytree(staged, bucket_commit.staging_root(url, cache))
        return url, cache

    # ... and committed whole, once, recording every durable step it takes.
    url, cache = prepare("count")
    steps: list[tuple[str, str]] = []

    def record(op: str, path: str) -> None:
        if _counted(path):
            steps.append((op, path))
    # (forked: the steps come back through a file)
    log = tmp_path / "steps.json"

    def record_to_file(op: str, path: str) -> None:
        record(op, path)
        log.write_text(json.dumps(steps))
    assert _commit_in_child(url, cache, record_to_file) == 0
    seen = [tuple(s) for s in json.loads(log.read_text())]
    new = _records(url, tmp_path / "c-new")
    assert new != old
    manifest_at = [n for n, (op, p) in enumerate(seen) if p.endswith("/.tfrfs-manifest")]
    assert len(manifest_at) == 1 and 0 < manifest_at[0] < len(seen) - 1, seen

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
        assert "nothing staged" in run_tfrfs("status", url, "--cache-dir", str(cache)).stdout, where
        doc = json.loads(s3.get(f"crash{n}/.tfrfs-manifest"))
        named = {e.get("object") or e["path"] for e in doc["shards"]} | {f["path"] for f in doc["files"]}
        stray = [k for k in s3.keys(f"crash{n}/") if k.split("/", 1)[1].startswith(".tfrfs-objects/")
                 and k.split("/", 1)[1] not in named and not k.endswith(".tfrfs-idx")]
        # Uploads of the commit the crash cut short are named by no manifest: the next commit
        # removes them (they are older than the version it replaces).
        assert all(".tfrfs-objects/" in k for k in stray), f"{where}: {stray}"
