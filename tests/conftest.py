"""Shared fixtures: real FUSE mounts that always unmount and fail on daemon tracebacks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from support import commands
from support.gcs_server import ENVIRONMENT as GCS_ENVIRONMENT

# No test reaches Google's own servers: gcsfs's probe of each bucket over gRPC (which waits out a
# timeout against the loopback GCS) is turned off before anything imports gcsfs.
os.environ.update(GCS_ENVIRONMENT)

# The loopback servers' fixtures (s3_server, s3_proxy, http_server, http_proxy, s3) for tests/remote.
pytest_plugins = ["support.remote_fixtures", "support.ray_fixtures"]


def pytest_collection_modifyitems(items: list) -> None:
    # One start-up of each kind of Ray cluster for the whole run (support/ray_fixtures.py).
    from support.ray_fixtures import order_by_cluster
    order_by_cluster(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """For `pytest -n N` (scripts/test): a worker takes a whole test module, so its module-scoped
    fixtures (datasets, TensorFlow workers) are made once, and all of tests/cluster goes to one
    worker, one module after another: a process holds one Ray session, each kind of cluster is
    then started once, and two clusters at once would only fight over two cores. (This is what
    ``--dist loadgroup`` with xdist_group marks would do, but pytest-xdist 3.8 cannot rename test
    ids under pytest 9, which its groups rely on.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/cluster" if path.startswith("tests/cluster/") else path
    return ByModule(config, log)


REPO = Path(__file__).resolve().parent.parent
REALDATA = Path(os.environ.get("TFRFS_REALDATA", REPO.parent / "shared" / "realdata"))


def run_tfrfs(*args: str, check: bool = False, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run the real command line (``python -m tfrfs``) and capture its output (a fork of this
    process's command server: support/commands.py)."""
    proc = commands.run(args, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"tfrfs {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def is_mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f)


def force_unmount(path: Path) -> None:
    for cmd in (["fusermount3", "-u", str(path)], ["fusermount3", "-uz", str(path)], ["umount", "-l", str(path)]):
        if not is_mounted(path):
            return
        subprocess.run(cmd, capture_output=True)
        for _ in range(50):
            if not is_mounted(path):
                return
            time.sleep(0.1)


def daemon_pids(mnt: Path) -> list[int]:
    """The processes serving ``mnt`` (a daemon started by ``tfrfs mount`` runs with --daemon)."""
    want = os.fsencode(str(mnt))
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"--daemon" in args and want in args:
                found.append(int(entry))
    return found


def wait_ended(pid: int, seconds: float = 30) -> None:
    """Wait for process ``pid`` to end (a zombie has ended); kill it after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return
        if any(line.split()[1:2] == ["Z"] for line in status.splitlines() if line.startswith("State:")):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, 9)
    except OSError:
        pass


class Mounts:
    """Mounts made by one test; each has its own log, checked at teardown."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.cache = base / "cache"
        self.made: list[tuple[Path, Path]] = []

    def __call__(self, source: Path | str, *args: str, mountpoint: Path | None = None,
                 expect_ok: bool = True) -> Path:
        n = len(self.made)
        mnt = mountpoint or self.base / f"mnt{n}"
        mnt.mkdir(parents=True, exist_ok=True)
        log = self.base / f"daemon{n}.log"
        proc = run_tfrfs("mount", str(source), str(mnt), "--cache-dir", str(self.cache), "--log", str(log), *args)
        self.made.append((mnt, log))
        if expect_ok:
            assert proc.returncode == 0, f"mount failed ({proc.returncode}): {proc.stderr}"
            assert is_mounted(mnt)
        return mnt

    def log_text(self, mnt: Path) -> str:
        for m, log in reversed(self.made):   # the last mount there
            if m == mnt and log.exists():
                return log.read_text(errors="replace")
        return ""

    def cleanup(self) -> list[str]:
        problems = []
        for mnt, log in self.made:
            pids = daemon_pids(mnt)
            if is_mounted(mnt):
                run_tfrfs("umount", str(mnt))
            force_unmount(mnt)
            # A daemon outlives its mount while a request it sent is still in flight (a stalled
            # store): it must be gone before the next test counts the requests a store receives.
            for pid in pids:
                wait_ended(pid)
            # Give the daemon a moment to finish writing its log on exit.
            time.sleep(0.05)
            if log.exists() and "Traceback" in log.read_text(errors="replace"):
                problems.append(f"daemon log {log} shows a traceback:\n{log.read_text(errors='replace')[-4000:]}")
        return problems


@pytest.fixture
def tfrfs_mount(tmp_path: Path) -> Iterator[Mounts]:
    """``tfrfs_mount(source, *args) -> mountpoint``: a real FUSE mount, unmounted at teardown.

    The test fails if any daemon log shows a traceback.
    """
    mounts = Mounts(tmp_path)
    try:
        yield mounts
    finally:
        problems = mounts.cleanup()
    if problems:
        pytest.fail("\n".join(problems))


@pytest.fixture(scope="session")
def _tf_written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/interop/tf_fixtures.py's shards, written once a run: starting TensorFlow to write
    them takes half a minute on a loaded machine, and four test modules read them."""
    pytest.importorskip("tensorflow")
    out = tmp_path_factory.mktemp("tf_written")
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "interop" / "tf_fixtures.py"), str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO)))
    if proc.returncode != 0:
        raise AssertionError(f"tf_fixtures.py exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return out


@pytest.fixture(scope="module")
def tf_written(_tf_written: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the TensorFlow-written fixtures (``clean/``, ``damaged/``, ``fixtures.json``) for
    this module alone: what a module does to its copy, no other module sees."""
    import shutil
    out = tmp_path_factory.mktemp("tf_fixtures")
    shutil.copytree(_tf_written, out, symlinks=True, dirs_exist_ok=True)
    return out


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in sample dataset (tfrfs.sample), written once for this module: what a module
    does to its copy, no other module sees."""
    from tfrfs.sample import write_sample
    dest = tmp_path_factory.mktemp("sample") / "data"
    write_sample(dest)
    return dest


def pytest_sessionfinish(session: pytest.Session) -> None:
    commands.stop()   # this process's command server (support/commands.py)
