"""Mount options (-o) on real mounts, and an fstab line mounted by the real mount(8) and umount(8)."""

from __future__ import annotations

import errno
import os
import stat
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tfrfs.fuse.canmount import user_allow_other
from tfrfs.sample import write_sample

from conftest import REPO, is_mounted, run_tfrfs
from support.namespace import Namespace, open_base, remove_base

pytestmark = pytest.mark.mount

LABEL = "train/train-00000-of-00002.tfrecord/000000/image/object/class/label.json"


def _table_line(mnt: Path) -> list[str]:
    with open("/proc/self/mounts") as f:
        return next(line.split() for line in f if line.split()[1] == os.path.realpath(mnt))


def test_owner_and_modes_from_o(sample: Path, tfrfs_mount) -> None:
    mnt = tfrfs_mount(sample, "-o", "uid=1234,gid=4321,umask=027,fsname=mydata")
    for path, mode in ((mnt, 0o550), (mnt / "train", 0o550), (mnt / LABEL, 0o440)):
        st = os.stat(path)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 4321, mode), path
    assert _table_line(mnt)[0] == "mydata"
    # Listings carry the same attributes as a stat.
    entry = next(os.scandir(mnt / "train"))
    assert stat.S_IMODE(entry.stat().st_mode) == 0o550 and entry.stat().st_uid == 1234
    plain = tfrfs_mount(sample)
    st = os.stat(plain / LABEL)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (os.getuid(), os.getgid(), 0o444)


@pytest.mark.skipif(os.geteuid() != 0 and not user_allow_other(),
                    reason="allow_other: needs root, or user_allow_other in /etc/fuse.conf")
def test_fuse_and_tfrfs_options_in_o_form(sample: Path, tfrfs_mount) -> None:
    mnt = tfrfs_mount(sample, "-o", "allow_other,default_permissions,no_decode_raw,records=raw,nofail,dev,suid")
    line = _table_line(mnt)
    assert line[2] == "fuse.tfrfs"
    assert {"ro", "allow_other", "default_permissions"} <= set(line[3].split(","))
    assert os.listdir(mnt / "clips.tfrecord")[0].endswith(".bin")   # records=raw


def test_rw_and_umask_in_o_form(sample: Path, tmp_path: Path, tfrfs_mount) -> None:
    rw = tfrfs_mount(_copy(sample, tmp_path), "-o", "rw,umask=0")
    assert "rw" in _table_line(rw)[3].split(",")
    assert stat.S_IMODE(os.stat(rw / LABEL).st_mode) == 0o666
    (rw / "train" / "train-00000-of-00002.tfrecord" / "000000" / "note.txt").write_text("hi")


def _copy(sample: Path, tmp_path: Path) -> Path:
    import shutil
    dest = tmp_path / "copy"
    shutil.copytree(sample, dest)
    return dest


def test_read_only_by_o_ro(sample: Path, tfrfs_mount) -> None:
    mnt = tfrfs_mount(sample, "-o", "rw,ro")   # the later wins, as with mount(8)
    with pytest.raises(OSError) as e:
        (mnt / "train" / "x").mkdir()
    assert e.value.errno == errno.EROFS


@pytest.mark.parametrize("args, says", [
    (("-o", "allow_others"), "unknown mount option 'allow_others'"),
    (("-o", "anon=true"), "unknown mount option 'anon=true'"),
    (("--rw", "-o", "ro"), "--rw and -o ro disagree"),
    (("-o", "umask=8"), "octal"),
])
def test_bad_options_are_one_line(sample: Path, tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = run_tfrfs("mount", str(sample), str(mnt), "--cache-dir", str(tmp_path / "c"), *args)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert not is_mounted(mnt)


def test_mount_without_the_command_word(sample: Path, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = run_tfrfs(str(sample), str(mnt), "-o", f"ro,cache_dir={tmp_path / 'c'},log={tmp_path / 'log'}")
    try:
        assert proc.returncode == 0, proc.stderr
        assert is_mounted(mnt) and (mnt / LABEL).read_text().startswith("[")
    finally:
        run_tfrfs("umount", str(mnt))
    assert not is_mounted(mnt)
    assert run_tfrfs("bogus").returncode == 2


@pytest.fixture
def fstab_ns() -> Iterator[tuple[Namespace, Path]]:
    if os.geteuid() != 0:
        pytest.skip("needs root: mount(8) of an fstab line, in a private mount namespace")
    base = open_base("tfrfs-fstab-")
    ns = Namespace(base)
    try:
        yield ns, base
    finally:
        ns.close()
        remove_base(base)


def test_fstab_line_with_mount_and_umount(fstab_ns: tuple[Namespace, Path]) -> None:
    """`SOURCE MOUNTPOINT fuse.tfrfs ro,allow_other,nofail 0 0` through the real mount(8), which
    runs mount.fuse3, which runs `tfrfs SOURCE MOUNTPOINT -o ...` through /bin/sh. mount(8)
    clears PATH, so the shell looks where its default PATH does (/usr/local/sbin first): the
    namespace shows a launcher of this tfrfs there."""
    ns, base = fstab_ns
    data, mnt, log = base / "data", base / "mnt", base / "daemon.log"
    write_sample(data)
    mnt.mkdir()
    launcher = base / "sbin"
    launcher.mkdir()
    (launcher / "tfrfs").write_text(f"#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m tfrfs \"$@\"\n")
    (launcher / "tfrfs").chmod(0o755)
    ns.bind(launcher, "/usr/local/sbin")
    fstab = base / "fstab"
    fstab.write_text(f"# a dataset\n{data} {mnt} fuse.tfrfs ro,allow_other,nofail,cache_dir={base / 'cache'},"
                     f"log={log} 0 0\n")

    proc = ns.run("mount", "--fstab", str(fstab), str(mnt))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ns.mounts() == [str(mnt)]
    with open(f"/proc/{ns.proc.pid}/mounts") as f:
        opts = next(line.split()[3] for line in f if line.split()[1] == str(mnt)).split(",")
    assert "ro" in opts and "allow_other" in opts
    assert ns.run("cat", str(mnt / LABEL), check=True).stdout.startswith("[")
    assert ns.run("touch", str(mnt / "train" / "x")).returncode != 0   # read-only

    proc = ns.run("umount", str(mnt))
    assert proc.returncode == 0, proc.stderr
    assert ns.mounts() == []
    deadline = time.monotonic() + 10
    while ns.pids() and time.monotonic() < deadline:   # the daemon ends with its mount
        time.sleep(0.05)
    assert not ns.pids()
    text = log.read_text()
    assert "unmounted" in text and "Traceback" not in text
