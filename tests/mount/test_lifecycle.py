"""How a writable mount ends (SPEC 7 "Commit", "Discard", "Durability"; SPEC 8): only an unmount
commits; SIGTERM and Ctrl-C leave the edits staged; ``umount --discard`` drops them; ``commit
SOURCE`` commits a source that is not mounted; ``status`` tells the truth about a mount whose
daemon died, about a read-only mount of a source with staged edits, and about refused writes; no
empty staging folder is left behind; a dataset can be built from an empty folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tfrfs.format import tfrecord
from tfrfs.index.discovery import STAGING_DIR
from tfrfs.sample import write_sample

from conftest import force_unmount, is_mounted, run_tfrfs
from support.daemons import daemon_pid, wait_gone
from support.files import disk_files
from support import example_pb, reference

pytestmark = pytest.mark.mount

AGE = "tabular.tfrecord.gz/000000/age.json"
CLIP = "clips.tfrecord/000001"
EDITED = ("tabular.tfrecord.gz", "clips.tfrecord")


@pytest.fixture
def src(tmp_path: Path) -> Path:
    dest = tmp_path / "data"
    write_sample(dest)
    return dest


def records(path: Path) -> list[Any]:
    """A shard's records, read by the test suite's own reader and message classes (no TensorFlow,
    nothing of tfrfs)."""
    return [example_pb.Example.FromString(r) for r in reference.written_records(path)]


def int_feature(ex: Any, key: str) -> list[int]:
    return list(ex.features.feature[key].int64_list.value)


def sh(command: str) -> None:
    subprocess.run(["bash", "-c", command], check=True, timeout=60)


def stop(mnt: Path, sig: int) -> None:
    """Send ``sig`` to the daemon of ``mnt`` and wait until it has ended."""
    pid = daemon_pid(mnt)
    os.kill(pid, sig)
    wait_gone(pid)


def edit(mnt: Path) -> None:
    """Stage an edit in one shard and a deleted record in another."""
    sh(f"echo '[5]' > {mnt}/{AGE}")
    sh(f"rm -r {mnt}/{CLIP}")


def status_lines(target: Path) -> list[str]:
    proc = run_tfrfs("status", str(target))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_unmounts_without_committing(sig: int, src: Path, tfrfs_mount) -> None:
    before = disk_files(src)
    clips = len(reference.written_records(src / "clips.tfrecord"))
    mnt = tfrfs_mount(src, "--rw")
    edit(mnt)
    stop(mnt, sig)

    assert not is_mounted(mnt)
    assert disk_files(src) == before, "a stop signal committed"
    name = signal.Signals(sig).name
    assert f"stopped by {name}: 2 shard(s)' edits stay staged" in tfrfs_mount.log_text(mnt)
    assert sorted(status_lines(src)) == ["clips.tfrecord: 1 deleted", "tabular.tfrecord.gz: 1 edited"]

    mnt2 = tfrfs_mount(src, "--rw")          # the edits show again at the next mount
    assert json.loads((mnt2 / AGE).read_text()) == [5]
    assert "000001" not in os.listdir(mnt2 / "clips.tfrecord")
    proc = run_tfrfs("umount", str(mnt2))    # and tfrfs umount commits them, saying what it did
    assert proc.returncode == 0, proc.stderr
    assert "committed 2 shard(s), 2 record(s) changed" in proc.stdout, proc.stdout
    assert "rewritten  tabular.tfrecord.gz" in proc.stdout and f"unmounted {mnt2}" in proc.stdout
    assert int_feature(records(src / "tabular.tfrecord.gz")[0], "age") == [5]
    assert len(reference.written_records(src / "clips.tfrecord")) == clips - 1
    assert status_lines(src) == ["nothing staged"]
    assert not (src / STAGING_DIR).exists()


def test_fusermount_u_commits(src: Path, tfrfs_mount) -> None:
    before = disk_files(src)
    mnt = tfrfs_mount(src, "--rw")
    edit(mnt)
    pid = daemon_pid(mnt)
    subprocess.run(["fusermount3", "-u", str(mnt)], check=True)
    wait_gone(pid)
    assert int_feature(records(src / "tabular.tfrecord.gz")[0], "age") == [5]
    assert disk_files(src)["clips.tfrecord"] != before["clips.tfrecord"]
    assert "unmounted" in tfrfs_mount.log_text(mnt) and "stay staged" not in tfrfs_mount.log_text(mnt)
    assert status_lines(src) == ["nothing staged"]
    assert not (src / STAGING_DIR).exists()


def test_umount_discard(src: Path, tfrfs_mount) -> None:
    before = disk_files(src)
    mnt = tfrfs_mount(src, "--rw")
    edit(mnt)
    os.mkdir(mnt / "tabular.tfrecord.gz" / "000001" / "notes")   # a folder of the user's own

    # Busy: nothing is discarded, and a later unmount commits again.
    holder = subprocess.Popen(["sleep", "60"], cwd=mnt / "tabular.tfrecord.gz")
    try:
        proc = run_tfrfs("umount", "--discard", str(mnt))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "nothing was discarded" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert is_mounted(mnt) and json.loads((mnt / AGE).read_text()) == [5]
    finally:
        holder.kill()
        holder.wait()

    proc = run_tfrfs("umount", "--discard", str(mnt))
    assert proc.returncode == 0, proc.stderr
    assert "discarded the staged edits of 2 shard(s)" in proc.stdout, proc.stdout
    assert not is_mounted(mnt)
    assert disk_files(src) == before
    assert status_lines(src) == ["nothing staged"]
    assert not (src / STAGING_DIR).exists()
    mnt2 = tfrfs_mount(src, "--rw")
    assert json.loads((mnt2 / AGE).read_text()) != [5]
    assert "notes" not in os.listdir(mnt2 / "tabular.tfrecord.gz" / "000001")


def test_umount_after_a_failed_discard_commits(src: Path, tfrfs_mount) -> None:
    """umount --discard that cannot unmount takes its request back: the next unmount commits."""
    mnt = tfrfs_mount(src, "--rw")
    edit(mnt)
    holder = subprocess.Popen(["sleep", "60"], cwd=mnt)
    try:
        assert run_tfrfs("umount", "--discard", str(mnt)).returncode == 1
    finally:
        holder.kill()
        holder.wait()
    pid = daemon_pid(mnt)
    subprocess.run(["fusermount3", "-u", str(mnt)], check=True)
    wait_gone(pid)
    assert int_feature(records(src / "tabular.tfrecord.gz")[0], "age") == [5]


def test_commit_source_after_a_stop(src: Path, tfrfs_mount, tmp_path: Path) -> None:
    before = disk_files(src)
    proc = run_tfrfs("commit", str(src), "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0 and proc.stdout.strip() == "nothing staged", proc.stdout + proc.stderr

    mnt = tfrfs_mount(src, "--rw")
    edit(mnt)
    proc = run_tfrfs("commit", str(src), "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 2, proc.stdout + proc.stderr       # mounted writable: commit it there
    assert proc.stderr.count("\n") == 1 and f"tfrfs commit {mnt}" in proc.stderr, proc.stderr
    assert disk_files(src) == before

    stop(mnt, signal.SIGTERM)
    proc = run_tfrfs("commit", str(src), "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    assert "committed 2 shard(s), 2 record(s) changed" in proc.stdout, proc.stdout
    assert int_feature(records(src / "tabular.tfrecord.gz")[0], "age") == [5]
    assert disk_files(src)["clips.tfrecord"] != before["clips.tfrecord"]
    assert status_lines(src) == ["nothing staged"]
    assert not (src / STAGING_DIR).exists()


def test_discard_reports_the_shards_it_dropped(src: Path, tfrfs_mount) -> None:
    before = disk_files(src)
    mnt = tfrfs_mount(src, "--rw")
    edit(mnt)
    stop(mnt, signal.SIGTERM)
    proc = run_tfrfs("discard", str(src))
    assert proc.returncode == 0 and "discarded the staged edits of 2 shard(s)" in proc.stdout, proc.stdout
    assert disk_files(src) == before and not (src / STAGING_DIR).exists()

    # Folders made in a record live in the staging folder too: discard drops them, and says so.
    mnt2 = tfrfs_mount(src, "--rw")
    os.mkdir(mnt2 / "tabular.tfrecord.gz" / "000000" / "sub")
    stop(mnt2, signal.SIGTERM)
    proc = run_tfrfs("discard", str(src))
    assert proc.returncode == 0 and "discarded the staged edits of 1 shard(s)" in proc.stdout, proc.stdout
    assert not (src / STAGING_DIR).exists()
    mnt3 = tfrfs_mount(src, "--rw")
    assert "sub" not in os.listdir(mnt3 / "tabular.tfrecord.gz" / "000000")


def test_status_of_a_mount_whose_daemon_died(src: Path, tfrfs_mount) -> None:
    mnt = tfrfs_mount(src, "--rw")
    edit(mnt)
    pid = daemon_pid(mnt)
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)
    try:
        assert is_mounted(mnt)     # left as "Transport endpoint is not connected"
        proc = run_tfrfs("status", str(mnt))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        lines = proc.stdout.strip().splitlines()
        assert "daemon of this mount is gone" in lines[0] and f"fusermount3 -u {mnt}" in lines[0], lines
        assert f"commit or discard {src}" in lines[0], lines
        assert sorted(lines[2:]) == ["clips.tfrecord: 1 deleted", "tabular.tfrecord.gz: 1 edited"], lines
        assert "Traceback" not in proc.stderr

        proc = run_tfrfs("commit", str(mnt))
        assert proc.returncode == 1 and f"tfrfs commit {src}" in proc.stderr, proc.stderr
        proc = run_tfrfs("status", str(src))
        assert proc.returncode == 0 and f"fusermount3 -u {mnt}" in proc.stderr, proc.stderr
        assert sorted(proc.stdout.splitlines()) == ["clips.tfrecord: 1 deleted", "tabular.tfrecord.gz: 1 edited"]
    finally:
        force_unmount(mnt)
    proc = run_tfrfs("umount", str(mnt))
    assert proc.returncode == 2 and "not a tfrfs mount" in proc.stderr


def test_umount_of_a_mount_whose_daemon_died(src: Path, tfrfs_mount) -> None:
    before = disk_files(src)
    mnt = tfrfs_mount(src, "--rw")
    edit(mnt)
    pid = daemon_pid(mnt)
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)
    proc = run_tfrfs("umount", str(mnt))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "nothing was committed" in proc.stderr and "2 shard(s)' edits stay staged" in proc.stderr, proc.stderr
    assert not is_mounted(mnt)
    assert disk_files(src) == before


def test_read_only_mount_of_a_source_with_staged_edits(src: Path, tfrfs_mount, tmp_path: Path) -> None:
    mnt = tfrfs_mount(src, "--rw")
    edit(mnt)
    stop(mnt, signal.SIGTERM)

    ro = tmp_path / "ro"
    ro.mkdir()
    proc = run_tfrfs("mount", str(src), str(ro), "--cache-dir", str(tmp_path / "cache"),
                     "--log", str(tmp_path / "ro.log"))
    try:
        assert proc.returncode == 0, proc.stderr
        warning = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
        assert len(warning) == 1 and "staged edits" in warning[0] and "tabular.tfrecord.gz" in warning[0], proc.stderr
        assert "has staged edits that this read-only mount does not show" in (tmp_path / "ro.log").read_text()
        lines = status_lines(ro)
        assert lines[0] == f"{ro}: read-only mount, nothing staged by it"
        assert sorted(lines[2:]) == ["clips.tfrecord: 1 deleted", "tabular.tfrecord.gz: 1 edited"], lines
    finally:
        run_tfrfs("umount", str(ro))
        force_unmount(ro)


def test_status_lists_refused_writes(src: Path, tfrfs_mount) -> None:
    mnt = tfrfs_mount(src, "--rw")
    old = (mnt / AGE).read_bytes()
    sh(f"echo '[1, 2' > {mnt}/{AGE}")              # the shell's > cannot report close()'s EINVAL
    sh(f"echo '[\"x\"]' > {mnt}/{AGE}")             # strings for an int64 key
    assert (mnt / AGE).read_bytes() == old
    doc = json.loads((mnt / ".tfrfs" / "status").read_text())
    assert [r["path"] for r in doc["rejected"]] == [AGE, AGE]
    assert "JSON" in doc["rejected"][0]["reason"]

    lines = status_lines(mnt)
    assert lines[0] == "nothing staged"
    assert lines[1].startswith("refused writes (the last 2")
    assert lines[2].split("  ", 2)[2].startswith(f"{AGE}: ") and len(lines) == 4, lines


def test_no_empty_staging_folder_after_a_clean_unmount(src: Path, tfrfs_mount) -> None:
    mnt = tfrfs_mount(src, "--rw")
    os.listdir(mnt / "tabular.tfrecord.gz")
    assert (src / STAGING_DIR).is_dir()            # the lock lives there while mounted
    assert run_tfrfs("umount", str(mnt)).returncode == 0
    assert not (src / STAGING_DIR).exists()

    mnt2 = tfrfs_mount(src, "--rw")
    edit(mnt2)
    assert run_tfrfs("commit", str(mnt2)).returncode == 0
    pid = daemon_pid(mnt2)
    subprocess.run(["fusermount3", "-u", str(mnt2)], check=True)
    wait_gone(pid)
    assert not (src / STAGING_DIR).exists()


def test_rw_mount_of_an_empty_folder_builds_a_dataset(tmp_path: Path, tfrfs_mount) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    mnt = tfrfs_mount(empty, "--rw")
    assert os.listdir(mnt) == []
    os.mkdir(mnt / "a.tfrecord")
    os.mkdir(mnt / "a.tfrecord" / "first")
    sh(f"echo '[1, 2]' > {mnt}/a.tfrecord/first/x.json && printf cat > {mnt}/a.tfrecord/first/label.txt")
    proc = run_tfrfs("umount", str(mnt))
    assert proc.returncode == 0, proc.stderr
    assert "created  a.tfrecord  (1 records" in proc.stdout, proc.stdout
    assert sorted(os.listdir(empty)) == ["a.tfrecord"]
    (ex,) = records(empty / "a.tfrecord")
    assert int_feature(ex, "x") == [1, 2]
    assert list(ex.features.feature["label"].bytes_list.value) == [b"cat"]

    # A read-only mount of an empty folder is still refused: most likely a wrong path.
    other, ro = tmp_path / "other", tmp_path / "mnt-ro"
    other.mkdir()
    ro.mkdir()
    proc = run_tfrfs("mount", str(other), str(ro), "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 2 and "no TFRecord shard" in proc.stderr
