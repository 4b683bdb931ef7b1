"""Run a command as an ordinary user, from root:  python tests/support/as_user.py USER -- CMD [ARGS...]

scripts/test runs its second pass of the mount tests this way, so the mount layer is tested once by
root and once by a user who is not. The machine is left as it is: the command runs in a private
mount namespace (support/namespace.py) where /dev/fuse is a copy every user may open, as most
distributions ship it, and where this Python and the working folder are reachable. USER is made if
missing; it gets a HOME and a TMPDIR of its own in a temporary folder, removed at the end, and the
rest of the caller's environment (PYTHONPATH, TFRFS_*, ...). When the command ends, what it left
mounted is unmounted and its processes are ended; the exit status is the command's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run as a script: find support/

from support.namespace import Namespace, ensure_user, open_base, remove_base   # noqa: E402

USAGE = "usage: python tests/support/as_user.py USER -- CMD [ARGS...]"


def user_env(home: Path, tmp: Path, user: str) -> dict[str, str]:
    """The caller's environment, with the user's own HOME and TMPDIR; root's XDG folders dropped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env.update(HOME=str(home), TMPDIR=str(tmp), USER=user, LOGNAME=user)
    # The virtualenv is root's, installed without byte-compiling (scripts/setup.sh): the user
    # cannot keep what Python compiles beside the modules, so it goes under TMPDIR, compiled once
    # for the whole run rather than again by every process the tests start.
    env.setdefault("PYTHONPYCACHEPREFIX", str(tmp / "pycache"))
    return env


def own_folder(path: Path, uid: int, gid: int) -> Path:
    path.mkdir(mode=0o700)
    os.chown(path, uid, gid)
    return path


def run_as(user: str, cmd: list[str]) -> int:
    uid, gid = ensure_user(user)
    cwd = os.getcwd()
    base = open_base("tfrfs-as-user-")
    ns = Namespace(base)
    try:
        env = user_env(own_folder(base / "home", uid, gid), own_folder(base / "tmp", uid, gid), user)
        ns.python_reachable()
        ns.reach([cwd, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)])
        ns.fuse_device(0o666)
        if ns.run("test", "-r", cwd, "-a", "-x", cwd, user=user).returncode != 0:
            print(f"as_user: {user} cannot read {cwd} (a folder's mode keeps other users out); "
                  "let other users read it, or run the command elsewhere", file=sys.stderr)
            return 2
        setup = set(ns.table())
        child = subprocess.Popen(ns.command(*cmd, user=user, env=env, cwd=cwd))
        try:
            status = child.wait()
        except KeyboardInterrupt:   # the command got the Ctrl-C too: let it end, then clean up
            status = child.wait()
        left = [point for point, kind in reversed(ns.table()) if (point, kind) not in setup]
        for point in left:
            if ns.run("fusermount3", "-u", point).returncode != 0:
                ns.run("umount", "-l", point)
        if left:
            print(f"as_user: unmounted what the command left mounted: {' '.join(left)}", file=sys.stderr)
        return 128 - status if status < 0 else status
    finally:
        ns.close()   # ends what still runs in it; its mounts go with it
        remove_base(base)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print(f"as_user: needs root (to make the user {argv[0]} and a mount namespace); "
              "as an ordinary user, run the command itself", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))   # still clean up
    return run_as(argv[0], argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
