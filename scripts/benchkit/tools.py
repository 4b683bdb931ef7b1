"""The file systems under test and the processes behind them: a Tool mounts, unmounts and finds
its daemon (tfrfs; ratarmount, installed into its own venv; plain files on the local disk as the
ceiling), plus what the measurements read from /proc about a daemon (memory, CPU, I/O counters),
PeakWatch for its peak memory over one span of work, and Profiler for py-spy (--profile)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tfrfs.fuse.mounttab import fstype_at

from .common import OUT, WORK, progress, run


def find_pids(mnt: Path, needle: str) -> list[int]:
    out = []
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if str(mnt) in args and any(needle in a for a in args):
            out.append(int(d))
    return out


def proc_mem(pid: int) -> dict[str, float]:
    mem = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    k, v = line.split(":", 1)
                    mem[k] = int(v.split()[0]) / 1024.0
    except OSError:
        pass
    return mem


def wait_exit(pid: int | None, timeout: float = 30.0) -> None:
    if pid is None:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except OSError:
            return
        time.sleep(0.02)


def force_unmount(mnt: Path) -> None:
    if fstype_at(mnt):
        progress(f"unmounting leftover mount {mnt}")
        subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True)
        if fstype_at(mnt):
            subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)


class Tool:
    """One filesystem under test: mount, unmount, and its daemon's memory."""

    name = ""

    def __init__(self, mnt: Path) -> None:
        self.mnt = mnt
        self.pid: int | None = None
        self.mem: dict[str, list[dict[str, float]]] = {}   # phase -> {VmHWM, VmRSS} of each run

    def _mount(self) -> None:
        raise NotImplementedError

    def _umount(self) -> None:
        raise NotImplementedError

    def _needle(self) -> str:
        raise NotImplementedError

    def reset_index(self) -> None:
        """Forget the index, so that the next mount builds it."""
        raise NotImplementedError

    def mount(self) -> float:
        force_unmount(self.mnt)
        self.mnt.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        self._mount()
        deadline = time.monotonic() + 600
        while not fstype_at(self.mnt):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {self.mnt} not mounted")
            time.sleep(0.005)
        # A first stat of the root: the mount answers.
        os.stat(self.mnt)
        elapsed = time.perf_counter() - t0
        pids = find_pids(self.mnt, self._needle())
        self.pid = pids[-1] if pids else None
        if self.pid is None:
            progress(f"warning: cannot find the {self.name} daemon for {self.mnt}")
        return elapsed

    def record_mem(self, phase: str) -> None:
        """The daemon's VmHWM (its peak since it started, i.e. over this mount) and VmRSS, now."""
        if self.pid is not None:
            self.mem.setdefault(phase, []).append(proc_mem(self.pid))

    def umount(self) -> None:
        if fstype_at(self.mnt):
            self._umount()
        wait_exit(self.pid)
        self.pid = None


class Tfrfs(Tool):
    name = "tfrfs"

    def __init__(self, mnt: Path, source: Path | str, cache_dir: Path, *, rw: bool = False,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(mnt)
        self.source, self.cache_dir, self.rw = source, cache_dir, rw
        self.env = env   # the mount command's whole environment (None: this process's)
        self.log = WORK / "tfrfs.log"

    def _needle(self) -> str:
        return "--daemon"

    def _mount(self) -> None:
        run([sys.executable, "-m", "tfrfs", "mount", str(self.source), str(self.mnt),
             "--cache-dir", str(self.cache_dir), "--log", str(self.log)] + (["--rw"] if self.rw else []),
            env=self.env)

    def _umount(self) -> None:
        run([sys.executable, "-m", "tfrfs", "umount", str(self.mnt)])

    def reset_index(self) -> None:
        shutil.rmtree(self.cache_dir, ignore_errors=True)
        self.cache_dir.mkdir(parents=True)


class Ratarmount(Tool):
    name = "ratarmount"
    VENV = OUT / "ratarmount-venv"

    def __init__(self, mnt: Path, tar: Path | str, index: Path, fuse_opts: str) -> None:
        super().__init__(mnt)
        self.tar, self.index, self.fuse_opts = tar, index, fuse_opts
        self.bin = self.VENV / "bin" / "ratarmount"

    @classmethod
    def ensure_installed(cls) -> str:
        exe = cls.VENV / "bin" / "ratarmount"
        if not exe.exists():
            progress(f"installing ratarmount into {cls.VENV}")
            run(["python3", "-m", "venv", str(cls.VENV)])
            run([str(cls.VENV / "bin" / "pip"), "install", "-q", "ratarmount"])
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True).stdout
        version = next((l.split()[1] for l in out.splitlines() if l.startswith("ratarmount ")), "?")
        # Its binding takes libfuse2 where both libraries are installed.
        libfuse = [l.split()[1] for l in out.splitlines() if l.startswith("libfuse ")]
        return f"{version} on libfuse {libfuse[-1]}" if libfuse else version

    def _needle(self) -> str:
        return "ratarmount"

    def _mount(self) -> None:
        cmd = [str(self.bin), "--index-file", str(self.index)]
        if self.fuse_opts:
            cmd += ["-o", self.fuse_opts]
        run(cmd + [str(self.tar), str(self.mnt)])

    def _umount(self) -> None:
        run(["fusermount3", "-u", str(self.mnt)])

    def reset_index(self) -> None:
        if self.index.exists():
            self.index.unlink()


class Unmounted(Tool):
    """A ceiling, not a competitor: nothing to mount, unmount or index."""

    def mount(self) -> float:
        return 0.0

    def umount(self) -> None:
        pass

    def reset_index(self) -> None:
        pass


class PlainFiles(Unmounted):
    """No FUSE at all: the same files, copied onto the local disk, read by the same reader after
    the same cache drop. It measures the ceiling, not a competitor."""

    name = "plain files"

    def fill(self, src: Path, rels: list[str]) -> None:
        """Copies ``rels`` from ``src`` (the tfrfs mount) once; a folder from an earlier run of
        the same dataset is reused when it is complete."""
        done = self.mnt / ".complete"
        if done.exists():
            return
        progress(f"copying the {len(rels)} large files to {self.mnt} (plain files, the ceiling)")
        shutil.rmtree(self.mnt, ignore_errors=True)
        for rel in rels:
            (self.mnt / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, self.mnt / rel)
        os.sync()
        done.touch()


# --- what a daemon did: CPU, I/O, memory, profile ------------------------------------

def proc_cpu(pid: int | None) -> float:
    """User + system CPU seconds of a process (0 when it is gone)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def proc_io(pid: int | None) -> dict[str, int]:
    """The /proc/PID/io counters of a process (empty when unreadable)."""
    if pid is None:
        return {}
    try:
        with open(f"/proc/{pid}/io") as f:
            return {k: int(v) for k, v in (line.split(":", 1) for line in f)}
    except (OSError, ValueError):
        return {}


class PeakWatch:
    """The peak resident memory of a daemon over one span of work.

    VmHWM counts from the process's start, so it is reset to the current RSS at the start
    (``echo 5 > /proc/PID/clear_refs``) and read at the end; RSS is also sampled every 10 ms in a
    thread, which is the figure used when the kernel refuses the reset.
    """

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.baseline = self.sampled = self.peak = 0.0
        self.reset_ok = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "PeakWatch":
        if self.pid is None:
            return self
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as f:
                f.write("5\n")
            self.reset_ok = True
        except OSError as exc:
            progress(f"  cannot reset the daemon's VmHWM ({exc.strerror}); sampling its RSS instead")
        self.baseline = self.sampled = proc_mem(self.pid).get("VmRSS", 0.0)
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        assert self.pid is not None
        while not self._stop.wait(0.01):
            self.sampled = max(self.sampled, proc_mem(self.pid).get("VmRSS", 0.0))

    def __exit__(self, *exc: object) -> None:
        if self._thread is None or self.pid is None:
            return
        self._stop.set()
        self._thread.join()
        hwm = proc_mem(self.pid).get("VmHWM", 0.0)
        self.peak = hwm if self.reset_ok else self.sampled

    def result(self) -> dict[str, Any]:
        return {"rss_before_mib": round(self.baseline, 1), "peak_mib": round(self.peak, 1),
                "sampled_peak_mib": round(self.sampled, 1), "vmhwm_reset": self.reset_ok}


class Profiler:
    """py-spy attached to a daemon for one phase (--profile); raw stacks plus a text summary."""

    VENV = OUT / "tools-venv"

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.exe = self.VENV / "bin" / "py-spy"
        if not self.exe.exists():
            progress(f"installing py-spy into {self.VENV}")
            run(["python3", "-m", "venv", str(self.VENV)])
            run([str(self.VENV / "bin" / "pip"), "install", "-q", "py-spy"])
        folder.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.out: Path | None = None

    def start(self, pid: int | None, name: str) -> None:
        if pid is None:
            return
        self.out = self.folder / f"{name.replace(' ', '-')}.txt"
        self.proc = subprocess.Popen([str(self.exe), "record", "--idle", "-r", "250", "--format", "raw",
                                      "-o", str(self.out), "--pid", str(pid)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)   # let it attach

    def stop(self) -> None:
        if self.proc is None or self.out is None:
            return
        self.proc.send_signal(2)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.proc = None
        if self.out.exists():
            summary = summarize_stacks(self.out)
            self.out.with_suffix(".summary").write_text(summary)
            progress(f"  profile: {self.out} (summary: {self.out.with_suffix('.summary')})")


def summarize_stacks(path: Path, top: int = 30) -> str:
    """Inclusive and self shares of each frame in py-spy's raw (collapsed) output."""
    import collections
    incl: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        total += count
        frames = stack.split(";")
        own[frames[-1]] += count
        for fr in set(frames):
            incl[fr] += count
    lines = [f"{total} samples (idle included: the daemon waiting in FUSE.__init__ is time spent "
             f"outside it, in the kernel or the reader)", "-- inclusive"]
    lines += [f"{100 * v / total:5.1f}% {k}" for k, v in incl.most_common(top) if total]
    lines += ["-- self"]
    lines += [f"{100 * v / total:5.1f}% {k}" for k, v in own.most_common(top) if total]
    return "\n".join(lines) + "\n"
