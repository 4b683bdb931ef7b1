"""``tfrfs mount SOURCE /dev/fd/N`` (SPEC 10): a privileged parent opens /dev/fuse and mounts it
(as a container runtime's helper or a Kubernetes FUSE device plugin does); tfrfs serves the
descriptor it is passed and needs no privilege of its own. The parent here is this test, as
root, with mount(2) itself. Afterwards nothing may be mounted on /dev/fuse: libfuse's
``fuse_main`` resolves /dev/fd/N to /dev/fuse and mounts over the device node, which breaks every
later mount on the machine; ``fuse_session_mount`` takes the descriptor as it is."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the parent that mounts /dev/fuse must be root here")

_libc = ctypes.CDLL(None, use_errno=True)


def _mounted_on(path: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line for line in f if line.split()[4] == path]


def _mount_fd(fd: int, mnt: Path) -> None:
    data = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
    if _libc.mount(b"tfrfs", str(mnt).encode(), b"fuse.tfrfs", ctypes.c_ulong(1), data) != 0:   # MS_RDONLY
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(mnt))


def _umount(mnt: Path) -> None:
    if _libc.umount2(str(mnt).encode(), 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(mnt))


def test_a_passed_descriptor_is_served_and_unmounts_cleanly(sample: Path, tmp_path: Path) -> None:
    assert not _mounted_on("/dev/fuse"), "something was mounted on /dev/fuse before the test"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    fd = os.open("/dev/fuse", os.O_RDWR)   # inheritable: passed on below
    os.set_inheritable(fd, True)
    daemon = None
    try:
        _mount_fd(fd, mnt)
        log = tmp_path / "daemon.log"
        daemon = subprocess.Popen([sys.executable, "-m", "tfrfs", "mount", str(sample), f"/dev/fd/{fd}", "-f",
                                   "--cache-dir", str(tmp_path / "cache"), "--log", str(log)],
                                  pass_fds=(fd,), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(fd)   # the daemon holds it now
        fd = -1
        deadline = time.monotonic() + 60
        while True:   # the first request waits for the daemon to answer init
            try:
                names = sorted(os.listdir(mnt))
                break
            except OSError:
                assert daemon.poll() is None, daemon.stderr.read().decode() if daemon.stderr else ""
                assert time.monotonic() < deadline, "the mount never answered"
                time.sleep(0.1)
        assert "train" in names and "dataset_info.json" in names
        jpeg = mnt / "train/train-00000-of-00002.tfrecord/000000/image/encoded.jpg"
        assert jpeg.read_bytes()[:2] == b"\xff\xd8"
        _umount(mnt)
        assert daemon.wait(30) == 0, log.read_text()
        assert "Traceback" not in log.read_text()
    finally:
        if fd >= 0:
            os.close(fd)
        if _mounted_on(str(mnt)):
            subprocess.run(["umount", "-l", str(mnt)], check=False)
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert not _mounted_on("/dev/fuse"), "the daemon mounted over /dev/fuse"


def test_a_descriptor_that_is_not_dev_fuse_is_refused(tmp_path: Path, sample: Path) -> None:
    r, w = os.pipe()
    try:
        proc = subprocess.run([sys.executable, "-m", "tfrfs", "mount", str(sample), f"/dev/fd/{r}",
                               "--cache-dir", str(tmp_path / "cache")], pass_fds=(r,), cwd=REPO,
                              capture_output=True, text=True, timeout=60)
    finally:
        os.close(r)
        os.close(w)
    assert proc.returncode == 2
    assert f"/dev/fd/{r}: not a /dev/fuse descriptor" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "tfrfs", "mount", str(sample), "/dev/fd/97",
                           "--cache-dir", str(tmp_path / "cache")], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "/dev/fd/97: no such open descriptor" in proc.stderr
    assert not _mounted_on("/dev/fuse")


def test_mount_fuse3_drop_privileges(sample: Path, tmp_path: Path) -> None:
    """libfuse's own helper as the parent: ``mount.fuse3 "tfrfs#SOURCE" MNT -o drop_privileges``
    (as an fstab line ``tfrfs#SOURCE MNT fuse3 drop_privileges,...`` runs it) opens /dev/fuse,
    mounts, drops its privileges and runs ``tfrfs SOURCE /dev/fd/N -o ...``, which returns once
    the daemon serves."""
    helper = shutil.which("mount.fuse3")
    if helper is None:
        pytest.skip("no mount.fuse3 here (the fuse3 package has it)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    try:
        proc = subprocess.run([helper, f"tfrfs#{sample}", str(mnt), "-o",
                               f"drop_privileges,cache_dir={tmp_path / 'cache'}"],
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "train" in os.listdir(mnt)
        jpeg = mnt / "train/train-00000-of-00002.tfrecord/000000/image/encoded.jpg"
        assert jpeg.read_bytes()[:2] == b"\xff\xd8"
        daemons = [p for p in _tfrfs_daemons() if "/dev/fd/" in p[1]]
        assert daemons
        for pid, _ in daemons:   # the daemon holds no capability: it needs none
            caps = {k: v for k, _, v in (line.partition(":\t") for line in
                                         Path(f"/proc/{pid}/status").read_text().splitlines())}
            assert int(caps["CapEff"], 16) == 0, caps["CapEff"]
        _umount(mnt)
        deadline = time.monotonic() + 30
        while any(os.path.exists(f"/proc/{pid}") for pid, _ in daemons):
            assert time.monotonic() < deadline, "the daemon did not end after the unmount"
            time.sleep(0.1)
    finally:
        if _mounted_on(str(mnt)):
            subprocess.run(["umount", "-l", str(mnt)], check=False)
    assert not _mounted_on("/dev/fuse")


def _tfrfs_daemons() -> list[tuple[int, str]]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "tfrfs" in cmd and "--daemon" in cmd:
            out.append((int(pid), cmd))
    return out
