"""Whether this user can make a FUSE mount here, asked before anything is started, so that what
stands in the way is said in one line with what to do (libfuse and fusermount3 would say it in
the daemon's log, after the shards were indexed).

Root mounts with mount(2) directly; any other user through fusermount3, which opens /dev/fuse
as that user, wants a mount point the user may write to, and lets ``allow_other`` and
``allow_root`` through only when /etc/fuse.conf says ``user_allow_other``.
"""

from __future__ import annotations

import errno
import os
import pwd
import re

FUSE_DEVICE = "/dev/fuse"
FUSE_CONF = "/etc/fuse.conf"   # where Debian's, Fedora's and libfuse's own builds read it


def user_name(uid: int | None = None) -> str:
    uid = os.geteuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def fuse_device_problem(device: str = FUSE_DEVICE) -> str | None:
    """Why FUSE cannot be used through ``device``, or None when it can be opened."""
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENODEV, errno.ENXIO):
            return (f"FUSE is not available here: {device} does not exist (load the kernel module: "
                    "modprobe fuse; in a container, give it the device, e.g. docker run --device /dev/fuse)")
        if exc.errno in (errno.EACCES, errno.EPERM):
            return (f"{device}: Permission denied for {user_name()}: FUSE is not usable by this user here; "
                    f"ask an administrator to make it so (chmod 0666 {device}, as most distributions "
                    "ship it), or mount as root")
        return f"{device}: cannot be opened: {exc.strerror}"
    os.close(fd)   # opened and closed unmounted: the kernel drops the connection it made
    return None


_FUSE_DEVICE_NUMBER = (10, 229)   # the misc device /dev/fuse is, in every namespace


def passed_fd(mountpoint: str) -> int | None:
    """The descriptor of ``/dev/fd/N`` given as the mount point: a ``/dev/fuse`` connection
    opened, and mounted, by a privileged parent (libfuse >= 3.3 serves it as it is); else None."""
    m = re.fullmatch(r"/dev/fd/(\d+)", mountpoint)
    return int(m.group(1)) if m else None


def passed_fd_problem(fd: int) -> str | None:
    """Why descriptor ``fd`` is not a /dev/fuse connection this process can serve, or None."""
    import stat
    try:
        st = os.fstat(fd)
    except OSError:
        return (f"/dev/fd/{fd}: no such open descriptor in this process (the parent that opened "
                "/dev/fuse and mounted it must pass the descriptor on, not close it or mark it close-on-exec)")
    if not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != _FUSE_DEVICE_NUMBER:
        return f"/dev/fd/{fd}: not a /dev/fuse descriptor (the mount point /dev/fd/N names an open /dev/fuse)"
    return None


def mountpoint_problem(mountpoint: str) -> str | None:
    """Why fusermount3 would refuse ``mountpoint`` to this (non-root) user, or None."""
    if os.geteuid() == 0:
        return None
    st = os.stat(mountpoint)
    if st.st_mode & 0o1000 and st.st_uid != os.geteuid():
        return (f"{mountpoint}: mount point is not owned by {user_name()} (a sticky folder must be the user's "
                "own): mount on a folder you own, e.g. mkdir ~/mnt")
    if not os.access(mountpoint, os.W_OK):
        return (f"{mountpoint}: mount point is not writable by {user_name()}, which FUSE requires of a user "
                "other than root: mount on a folder you may write to, e.g. mkdir ~/mnt")
    return None


def allow_other_problem(fuse_options: dict, conf: str = FUSE_CONF) -> str | None:
    """Why ``allow_other``/``allow_root`` would be refused to this (non-root) user, or None."""
    wanted = [name for name in ("allow_other", "allow_root") if fuse_options.get(name)]
    if not wanted or os.geteuid() == 0 or user_allow_other(conf):
        return None
    return (f"-o {wanted[0]}: a user other than root may use it only when {conf} has the line "
            f"user_allow_other; ask an administrator to add it (or mount without {wanted[0]})")


def user_allow_other(conf: str = FUSE_CONF) -> bool:
    """Whether ``conf`` allows users to use allow_other, as fusermount3 reads it: a line that
    is, but for spaces around it, exactly ``user_allow_other``."""
    try:
        with open(conf, encoding="utf-8", errors="replace") as f:
            return any(line.strip() == "user_allow_other" for line in f)
    except OSError:
        return False
