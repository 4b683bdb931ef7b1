"""A FUSE init that fails ends the mount: the daemon logs why and exits 1, nothing stays
mounted, and ``tfrfs mount`` reports the failure with exit status 1 (never "mounted")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfrfs.format import proto
from tfrfs.format import tfrecord

from conftest import REPO, force_unmount, is_mounted, run_tfrfs

pytestmark = pytest.mark.mount

# Imported first by every Python started with this folder first on PYTHONPATH: the operations'
# init fails, as a bug or a libfuse that refuses a request there would make it fail.
_FAIL_INIT = '''
from tfrfs.fuse import operations as fuse_ops

class InitFails(fuse_ops.Operations):
    def init(self, conn):
        raise RuntimeError("init fails on purpose")

fuse_ops.Operations = InitFails
'''


@pytest.fixture
def failing_env(tmp_path: Path) -> dict[str, str]:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_FAIL_INIT)
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(hook), str(REPO), os.environ.get("PYTHONPATH", "")]))


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    ex = proto.Example()
    ex.features.feature["i"].int64_list.value.append(1)
    (src / "a.tfrecord").write_bytes(tfrecord.frame(ex.SerializeToString()))
    return src


def test_the_daemon_exits_1_and_says_why(source: Path, tmp_path: Path, failing_env: dict[str, str]) -> None:
    mnt, log = tmp_path / "mnt", tmp_path / "daemon.log"
    mnt.mkdir()
    try:
        proc = subprocess.run([sys.executable, "-m", "tfrfs", "mount", str(source), str(mnt), "-f", "--daemon",
                               "--log", str(log), "--cache-dir", str(tmp_path / "cache")],
                              env=failing_env, capture_output=True, text=True, timeout=60)
        text = log.read_text(errors="replace")
        assert proc.returncode == 1, text
        assert "FUSE init failed, so the mount ends: init fails on purpose" in text
        assert "FUSE failed: init failed (RuntimeError: init fails on purpose), so the mount ended" in text
        assert "unmounted" not in text   # no clean end reported
        assert not is_mounted(mnt)
    finally:
        force_unmount(mnt)


def test_tfrfs_mount_reports_it(source: Path, tmp_path: Path, failing_env: dict[str, str]) -> None:
    mnt, log = tmp_path / "mnt", tmp_path / "daemon.log"
    mnt.mkdir()
    try:
        proc = run_tfrfs("mount", str(source), str(mnt), "--log", str(log), "--cache-dir", str(tmp_path / "cache"),
                         env=failing_env, timeout=60)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "mounted" not in proc.stdout
        assert "mount failed (daemon exited with status 1)" in proc.stderr
        assert "FUSE failed: init failed" in proc.stderr   # the log's last lines come with it
        assert not is_mounted(mnt)
    finally:
        force_unmount(mnt)


def test_a_mount_libfuse_refuses_is_reported_by_what_failed(source: Path, tmp_path: Path) -> None:
    from tfrfs.fuse import operations as fuse_ops
    from tfrfs.dataset.assembly import open_mount

    m = open_mount(str(source), cache_dir=str(tmp_path / "cache"))
    try:
        with pytest.raises(fuse_ops.MountFailed, match="libfuse could not mount"):
            fuse_ops.mount(m, str(tmp_path / "no such folder"))
        with pytest.raises(fuse_ops.MountFailed, match="libfuse refused the mount options"):
            fuse_ops.mount(m, str(tmp_path), options={"fsname": "a,no_such_option"})
    finally:
        m.close()
    assert not is_mounted(tmp_path)
