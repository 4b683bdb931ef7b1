"""``tfrfs mount gs://... --rw`` (SPEC 7.1) against a loopback GCS (gcp-storage-emulator behind
the gate that keeps GCS's ``ifGenerationMatch``, ``support.gcs_server``): the manifest is
written on its generation, so commits follow one another and two writers cannot both win."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_tfrfs
from test_bucket_rw import LABEL, SAME_SHARD, SHARD, _edit, _label, _parsed, _records, committed_locally

pytestmark = pytest.mark.mount


def _manifest(gcs) -> dict:
    return json.loads(gcs.get("ds/.tfrfs-manifest"))


def _indexed(sample: Path, gcs, tmp_path: Path) -> str:
    """The sample dataset in the bucket under ``ds/`` with a manifest (``index --beside``): its URL."""
    gcs.upload_tree(sample, "ds")
    url = gcs.url("ds")
    assert run_tfrfs("index", url, "--beside", "--cache-dir", str(tmp_path / "ci")).returncode == 0
    return url


def test_commits_on_gcs_follow_one_another_and_hold_the_local_commit(sample: Path, gcs, tfrfs_mount,
                                                                     tmp_path: Path) -> None:
    expected = committed_locally(sample, tfrfs_mount, tmp_path)

    gcs.upload_tree(sample, "ds")
    url = gcs.url("ds")
    mnt = tfrfs_mount(url, "--rw", "--cache-dir", str(tmp_path / "cw"))
    _edit(mnt)
    assert json.loads((mnt / LABEL).read_text()) == [7, 7]       # shown at once
    proc = run_tfrfs("umount", str(mnt))
    assert proc.returncode == 0, proc.stderr
    first = _manifest(gcs)
    assert {e["path"]: e for e in first["shards"]}[SHARD]["object"].startswith(".tfrfs-objects/")
    # The manifest was created on generation 0 (it must not have existed) ...
    assert gcs.gate.count("POST", "ifGenerationMatch=0") == 1
    assert _parsed(_records(url, tmp_path / "c0")) == expected

    # ... and the next commit replaces it on the generation that mount read.
    mnt = tfrfs_mount(url, "--rw", "--cache-dir", str(tmp_path / "cw"), mountpoint=mnt)
    (mnt / SAME_SHARD).write_text("[4]\n")
    gcs.gate.reset()
    proc = run_tfrfs("umount", str(mnt))
    assert proc.returncode == 0, proc.stderr
    conditional = [r for r in gcs.gate.requests if "ifGenerationMatch=" in r.path]
    assert len(conditional) == 1 and "ifGenerationMatch=0" not in conditional[0].path, conditional
    assert conditional[0].status == 200 and ".tfrfs-manifest" in conditional[0].path
    now = _records(url, tmp_path / "c1")
    assert _label(now, SHARD, 1) == [7, 7] and _label(now, SHARD, 2) == [4]
    assert all(f"ds/{r}" not in gcs.keys("ds/") for r in first["retired"])   # removed by the next commit


def test_two_writers_on_gcs_one_wins_and_the_other_keeps_its_edits(sample: Path, gcs, tfrfs_mount,
                                                                   tmp_path: Path) -> None:
    url = _indexed(sample, gcs, tmp_path)
    a = tfrfs_mount(url, "--rw", "--cache-dir", str(tmp_path / "ca"))
    b = tfrfs_mount(url, "--rw", "--cache-dir", str(tmp_path / "cb"))
    (a / LABEL).write_text("[1]\n")
    (b / SAME_SHARD).write_text("[3]\n")
    assert run_tfrfs("umount", str(a)).returncode == 0
    won = _manifest(gcs)

    proc = run_tfrfs("commit", str(b))
    assert proc.returncode == 1, proc.stderr
    assert "another writer committed" in proc.stderr and SHARD in proc.stderr, proc.stderr
    assert _manifest(gcs) == won
    assert json.loads((b / SAME_SHARD).read_text()) == [3]       # still staged, still shown
    assert _label(_records(url, tmp_path / "c0"), SHARD, 1) == [1]


def test_a_lost_race_for_the_manifest_itself_is_refused_by_the_store(sample: Path, gcs, tfrfs_mount,
                                                                     tmp_path: Path) -> None:
    # The other writer's manifest lands after this commit read the generation it starts from, and
    # before its own write: only the store's precondition can refuse it (412).
    url = _indexed(sample, gcs, tmp_path)
    mnt = tfrfs_mount(url, "--rw", "--cache-dir", str(tmp_path / "cw"))
    _edit(mnt)
    body = gcs.get("ds/.tfrfs-manifest")
    other = gcs.fs(past_the_gate=True)
    gcs.gate.meanwhile(".tfrfs-manifest",
                       lambda: other.pipe_file(f"{gcs.bucket}/ds/.tfrfs-manifest", body))   # a new generation
    gcs.gate.reset()
    proc = run_tfrfs("commit", str(mnt))
    assert proc.returncode == 1 and "another writer committed" in proc.stderr, proc.stderr
    assert [r.status for r in gcs.gate.requests if "ifGenerationMatch=" in r.path] == [412]
    assert gcs.get("ds/.tfrfs-manifest") == body                 # the other writer's, untouched
    assert json.loads((mnt / LABEL).read_text()) == [7, 7]       # still staged, still shown
