"""Mounts by a user other than root, and mounts root makes for other users (allow_other, uid, gid,
umask, default_permissions), with a real second user.

Each test runs in a private mount namespace (tests/support/namespace.py) where /dev/fuse and
/etc/fuse.conf are what the test needs, and where the user can reach this Python; the machine's
own are left alone.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Iterator

import pytest

from tfrfs.sample import write_sample

from support.namespace import Namespace, ensure_user, open_base, remove_base

pytestmark = [pytest.mark.mount,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root: to make a second user and a mount namespace")]

USER = "tfrfs-test"
NO_USER_ALLOW_OTHER = "# tests: users may not use allow_other\n"


class Setup:
    def __init__(self, base: Path, ns: Namespace, uid: int, gid: int) -> None:
        self.base, self.ns, self.uid, self.gid = base, ns, uid, gid
        self.data = base / "data"
        self.home = base / "home"       # the user's
        self.label = "train/train-00000-of-00002.tfrecord/000000/image/object/class/label.json"
        self.made = 0
        self.expected = ""   # the label's text

    def user_dir(self, name: str) -> Path:
        d = self.base / name
        d.mkdir()
        os.chown(d, self.uid, self.gid)
        return d

    def mountpoint(self, *, owner: str = "user") -> Path:
        self.made += 1
        d = self.base / f"mnt{self.made}"
        d.mkdir()
        if owner == "user":
            os.chown(d, self.uid, self.gid)
        return d

    def tfrfs(self, *args: str, user: bool = True):
        cache = self.home / "cache" if user else self.base / "root-cache"
        return self.ns.tfrfs(*args, "--cache-dir", str(cache), user=USER if user else None, home=self.home)

    def read_as_user(self, path: Path) -> tuple[int, str]:
        """(0, content), or (errno, "") when the user's read fails."""
        proc = self.ns.python("import sys\ntry:\n    sys.stdout.write(open(sys.argv[1]).read())\n"
                              "except OSError as e:\n    sys.exit(f'errno {e.errno}')\n", str(path), user=USER)
        if proc.returncode == 0:
            return 0, proc.stdout
        return int(proc.stderr.strip().split()[-1]), ""

    def stat_as_user(self, path: Path) -> tuple[int, int, int]:
        proc = self.ns.python("import os, sys; s = os.stat(sys.argv[1]); print(s.st_uid, s.st_gid, s.st_mode)",
                              str(path), user=USER)
        assert proc.returncode == 0, proc.stderr
        uid, gid, mode = map(int, proc.stdout.split())
        return uid, gid, mode


@pytest.fixture(scope="module")
def users() -> Iterator[Setup]:
    uid, gid = ensure_user(USER)
    base = open_base("tfrfs-users-")
    ns = Namespace(base)
    try:
        setup = Setup(base, ns, uid, gid)
        write_sample(setup.data)
        setup.user_dir("home")
        ns.python_reachable()
        ns.fuse_device(0o666)   # usable by every user, as most distributions ship it
        ns.file_over("/etc/fuse.conf", NO_USER_ALLOW_OTHER)
        assert ns.tfrfs("--version", user=USER).returncode == 0, "the user cannot run this Python"
        mnt = setup.mountpoint(owner="root")   # what root reads: what the user must read
        assert setup.tfrfs("mount", str(setup.data), str(mnt), user=False).returncode == 0
        setup.expected = ns.run("cat", str(mnt / setup.label), check=True).stdout
        ns.run("fusermount3", "-u", str(mnt), check=True)
        yield setup
    finally:
        ns.close()
        remove_base(base)


@pytest.fixture
def u(users: Setup) -> Iterator[Setup]:
    yield users
    for point in users.ns.mounts():
        users.ns.run("fusermount3", "-u", point)


def one_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and proc.returncode == 2 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)
    return lines[0]


def test_a_user_mounts_read_only_and_reads(u: Setup) -> None:
    mnt = u.mountpoint()
    proc = u.tfrfs("mount", str(u.data), str(mnt))
    assert proc.returncode == 0, proc.stderr
    assert str(mnt) in u.ns.mounts()
    assert u.read_as_user(mnt / u.label) == (0, u.expected)
    uid, gid, mode = u.stat_as_user(mnt / u.label)
    assert (uid, gid, stat.S_IMODE(mode)) == (u.uid, u.gid, 0o444)
    assert u.ns.tfrfs("umount", str(mnt), user=USER, home=u.home).returncode == 0
    assert str(mnt) not in u.ns.mounts()


def test_allow_other_lets_another_user_read(u: Setup) -> None:
    closed = u.mountpoint(owner="root")
    assert u.tfrfs("mount", str(u.data), str(closed), user=False).returncode == 0
    assert u.read_as_user(closed / u.label) == (errno.EACCES, "")
    shared = u.mountpoint(owner="root")
    proc = u.tfrfs("mount", str(u.data), str(shared), "-o", "allow_other", user=False)
    assert proc.returncode == 0, proc.stderr
    assert u.read_as_user(shared / u.label) == (0, u.expected)
    assert u.stat_as_user(shared / u.label)[:2] == (0, 0)


def test_uid_gid_umask_show_in_stat_and_default_permissions_enforces_them(u: Setup) -> None:
    private = u.mountpoint(owner="root")
    proc = u.tfrfs("mount", str(u.data), str(private), "-o", "allow_other,default_permissions,umask=077",
                   user=False)
    assert proc.returncode == 0, proc.stderr
    uid, gid, mode = u.stat_as_user(private)
    assert (uid, gid, stat.S_IMODE(mode)) == (0, 0, 0o500)
    assert u.read_as_user(private / u.label) == (errno.EACCES, "")
    given = u.mountpoint(owner="root")
    proc = u.tfrfs("mount", str(u.data), str(given), "-o",
                   f"allow_other,default_permissions,uid={u.uid},gid={u.gid},umask=077", user=False)
    assert proc.returncode == 0, proc.stderr
    uid, gid, mode = u.stat_as_user(given / u.label)
    assert (uid, gid, stat.S_IMODE(mode)) == (u.uid, u.gid, 0o400)
    assert u.read_as_user(given / u.label) == (0, u.expected)
    # Without default_permissions the modes are what stat shows, and the mount lets the user in.
    shown = u.mountpoint(owner="root")
    assert u.tfrfs("mount", str(u.data), str(shown), "-o", "allow_other,umask=077", user=False).returncode == 0
    assert stat.S_IMODE(u.stat_as_user(shown / u.label)[2]) == 0o400
    assert u.read_as_user(shown / u.label) == (0, u.expected)


def test_allow_other_by_a_user_needs_user_allow_other(u: Setup) -> None:
    mnt = u.mountpoint()
    line = one_line(u.tfrfs("mount", str(u.data), str(mnt), "-o", "allow_other"))
    assert "user_allow_other" in line and "/etc/fuse.conf" in line, line
    assert str(mnt) not in u.ns.mounts()


def test_unwritable_mount_point(u: Setup) -> None:
    mnt = u.mountpoint(owner="root")
    line = one_line(u.tfrfs("mount", str(u.data), str(mnt)))
    assert str(mnt) in line and "not writable" in line, line
    assert str(mnt) not in u.ns.mounts()


def test_permission_denied_is_said_as_such(u: Setup) -> None:
    private = u.base / "private"
    private.mkdir(mode=0o700)
    (private / "mnt").mkdir()
    write_sample(private / "data")
    mnt = u.mountpoint()
    for args in (("mount", str(private / "data"), str(mnt)), ("inspect", str(private / "data")),
                 ("verify", str(private / "data")), ("index", str(private / "data")),
                 ("mount", str(u.data), str(private / "mnt"))):
        line = one_line(u.tfrfs(*args))
        assert "ermission denied" in line and "no such file" not in line and "does not exist" not in line, line
    rootowned = u.base / "rootowned"
    rootowned.mkdir(exist_ok=True)
    for args in (("inspect", str(u.data)), ("index", str(u.data)), ("verify", str(u.data)),
                 ("mount", str(u.data), str(mnt))):
        proc = u.ns.tfrfs(*args, "--cache-dir", str(rootowned / "cache"), user=USER, home=u.home)
        line = one_line(proc)
        assert "--cache-dir" in line and "Permission denied" in line, line
    line = one_line(u.tfrfs("mount", str(u.data), str(mnt), "--log", str(rootowned / "x.log")))
    assert "--log" in line and "Permission denied" in line, line
    assert not u.ns.mounts()


def test_unusable_dev_fuse(users: Setup) -> None:
    ns = Namespace(users.base)
    try:
        ns.python_reachable()
        ns.fuse_device(0o000)   # the device is there, and no user but root may open it
        mnt = users.mountpoint()
        proc = ns.tfrfs("mount", str(users.data), str(mnt), "--cache-dir", str(users.home / "cache"),
                        user=USER, home=users.home)
        line = one_line(proc)
        assert "/dev/fuse" in line and "Permission denied" in line, line
        assert not ns.mounts()
    finally:
        ns.close()


def test_what_fusermount3_refuses_is_one_line(users: Setup) -> None:
    ns = Namespace(users.base)
    try:
        ns.python_reachable()
        ns.fuse_device(0o666)
        ns.file_over("/etc/fuse.conf", "mount_max = 0\n")   # no FUSE mount for users at all
        mnt = users.mountpoint()
        proc = ns.tfrfs("mount", str(users.data), str(mnt), "--cache-dir", str(users.home / "cache"),
                        user=USER, home=users.home)
        lines = [x for x in proc.stderr.strip().splitlines() if not x.startswith("indexing: ")]   # progress
        assert proc.returncode == 1 and len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"tfrfs: cannot mount {mnt}: fusermount3: too many FUSE filesystems mounted")
        assert not ns.mounts()
    finally:
        ns.close()
