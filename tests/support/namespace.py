"""A private mount namespace for tests that change what processes see (/dev/fuse, /etc/fuse.conf,
a folder on the PATH mount(8) leaves its helpers, a /root another user can pass through) without
changing the machine: mounts made in it are seen only by the processes in it, and go with it.

Needs root. The namespace lives as long as a ``sleep`` started in it; every command runs in it
through ``nsenter``, as root or, with ``user=``, as that user (``setpriv``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable

REPO = Path(__file__).resolve().parent.parent.parent


def ensure_user(name: str) -> tuple[int, int]:
    """(uid, gid) of the system user ``name``, made if missing (no home, no login)."""
    import pwd
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                              capture_output=True, text=True)
        if made.returncode not in (0, 9):   # 9: made meanwhile by another run
            raise RuntimeError(f"useradd {name}: {made.stderr.strip()}")
        entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


class Namespace:
    def __init__(self, base: Path) -> None:
        import tempfile
        self.base = base
        self.work = Path(tempfile.mkdtemp(prefix="ns-", dir=base))   # its own mount points and files
        self.work.chmod(0o755)
        self.proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "infinity"])
        mine = os.readlink("/proc/self/ns/mnt")
        for _ in range(200):
            try:
                if os.readlink(f"/proc/{self.proc.pid}/ns/mnt") != mine:
                    break
            except OSError:
                pass
            time.sleep(0.01)
        else:
            self.close()
            raise RuntimeError("unshare did not make a mount namespace")
        self.ns = os.readlink(f"/proc/{self.proc.pid}/ns/mnt")
        # The copies of FUSE mounts made outside would keep their file systems alive after they
        # are unmounted there (a test run at the same time would wait for its daemon to end).
        for point, kind in reversed(self.table()):
            if kind in ("fuse", "fuseblk") or kind.startswith("fuse."):
                self.run("umount", "-l", point)
        self._stash = 0
        self._before = set(self.table())   # mounts copied from outside: not the test's

    def table(self) -> list[tuple[str, str]]:
        """(mount point, type) of every mount the namespace sees, in the order they were made."""
        with open(f"/proc/{self.proc.pid}/mounts") as f:
            return [(line.split()[1], line.split()[2]) for line in f]

    # -- running things in it ---------------------------------------------------------

    def command(self, *cmd: str, user: str | None = None, env: dict[str, str] | None = None,
                cwd: Path | str | None = None) -> list[str]:
        """The command line that runs ``cmd`` in the namespace, as ``user``, with exactly ``env``,
        in ``cwd`` (entering a mount namespace moves a process to its root, /)."""
        prefix = ["nsenter", "-t", str(self.proc.pid), "-m", *([f"--wd={cwd}"] if cwd is not None else []), "--"]
        if user is not None:
            prefix += ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"]
        if env is not None:
            prefix += ["env", "-i", *(f"{k}={v}" for k, v in env.items())]
        return [*prefix, *cmd]

    def run(self, *cmd: str, user: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.command(*cmd, user=user, env=env), capture_output=True, text=True,
                              timeout=timeout, cwd=self.base)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
        return proc

    def tfrfs(self, *args: str, user: str | None = None, home: Path | None = None) -> subprocess.CompletedProcess:
        """``python -m tfrfs ARGS`` in the namespace, with a plain environment."""
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8",
               "PYTHONPATH": str(REPO), "HOME": str(home or self.base)}
        return self.run(sys.executable, "-m", "tfrfs", *args, user=user, env=env)

    def python(self, code: str, *args: str, user: str | None = None) -> subprocess.CompletedProcess:
        return self.run(sys.executable, "-c", code, *args, user=user, env={"PYTHONPATH": str(REPO)})

    # -- shaping what it sees ----------------------------------------------------------

    def tmpfs(self, where: Path, mode: str = "0755") -> None:
        where.mkdir(parents=True, exist_ok=True)
        self.run("mount", "-t", "tmpfs", "-o", f"mode={mode},size=1m", "tmpfs", str(where), check=True)

    def bind(self, source: Path | str, target: Path | str) -> None:
        self.run("mount", "--bind", str(source), str(target), check=True)

    def fuse_device(self, mode: int) -> None:
        """/dev/fuse in the namespace: the same device, with permissions ``mode``."""
        dev = os.stat("/dev/fuse").st_rdev
        folder = self.work / "dev"
        self.tmpfs(folder)
        self.run("mknod", "-m", f"{mode:o}", str(folder / "fuse"), "c", str(os.major(dev)), str(os.minor(dev)),
                 check=True)
        self.bind(folder / "fuse", "/dev/fuse")

    def file_over(self, target: str, content: str) -> None:
        """``target`` shows ``content`` in the namespace."""
        self._stash += 1
        f = self.work / f"file-{self._stash}"
        f.write_text(content)
        f.chmod(0o644)
        self.bind(f, target)

    def reach(self, paths: Iterable[str | Path]) -> None:
        """Let every user pass through the folders above ``paths`` (this Python, say, under a
        /root only root may enter): each such folder is covered, in the namespace, by an open
        tmpfs holding only the entries on the way, mounted there from the real ones."""
        blocked: dict[Path, set[str]] = {}
        for p in paths:
            parts = Path(os.path.realpath(p)).parts
            for i in range(1, len(parts)):
                above = Path(*parts[:i])
                if not os.stat(above).st_mode & 0o001:
                    blocked.setdefault(above, set()).add(parts[i])
        for above in sorted(blocked, key=lambda a: len(a.parts)):
            held = []
            for name in sorted(blocked[above]):
                self._stash += 1
                stash = self.work / f"stash-{self._stash}"
                is_dir = (above / name).is_dir()
                stash.mkdir() if is_dir else stash.touch()
                self.bind(above / name, stash)
                held.append((name, stash, is_dir))
            self.run("mount", "-t", "tmpfs", "-o", "mode=0755,size=1m", "tmpfs", str(above), check=True)
            for name, stash, is_dir in held:
                self.run("mkdir" if is_dir else "touch", str(above / name), check=True)
                self.run("mount", "--move", str(stash), str(above / name), check=True)

    def python_reachable(self) -> None:
        """This Python and the code under test, for every user in the namespace."""
        self.reach([os.path.realpath(sys.executable), sys.prefix, sys.base_prefix, REPO])

    # -- what is in it ------------------------------------------------------------------

    def mounts(self, fstype: str = "fuse.tfrfs") -> list[str]:
        """The mount points of ``fstype`` made in the namespace."""
        return [point for point, kind in self.table() if kind == fstype and (point, kind) not in self._before]

    def pids(self) -> list[int]:
        """The processes in the namespace, other than the one that keeps it."""
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != self.proc.pid:
                try:
                    if os.readlink(f"/proc/{entry}/ns/mnt") == self.ns:
                        out.append(int(entry))
                except OSError:
                    pass
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            for point in reversed(self.mounts()):
                self.run("fusermount3", "-u", point)
                self.run("umount", "-l", point)
            deadline = time.monotonic() + 5
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.05)
            for pid in self.pids():   # daemons started in the namespace by the test
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.kill()
        self.proc.wait()


def open_base(prefix: str) -> Path:
    """A folder every user can reach (pytest's tmp_path is root's alone)."""
    import tempfile
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    base.chmod(0o755)
    return base


def remove_base(base: Path) -> None:
    shutil.rmtree(base, ignore_errors=True)
