"""The request loop's parts that need no libfuse: why it ended, the stop signals, the answers a
request gives (``Entry``, ``Opened``, ``SetAttr``), and the mount's read-ahead.

``tfrfs.fuse.libfuse`` serves the loop and turns these answers into libfuse's structures;
``tfrfs.fuse.requests`` makes them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from dataclasses import dataclass
from typing import Any, Iterator

log = logging.getLogger("tfrfs")


@dataclass(frozen=True)
class Entry:
    """A lookup's answer: the node id the kernel is to hold, its attributes, and how long it may keep
    each (seconds). ``nodeid`` 0: no such name, and the kernel may remember that for ``entry_timeout``."""

    nodeid: int
    attrs: dict[str, int]
    entry_timeout: float
    attr_timeout: float


@dataclass(frozen=True)
class Opened:
    """An open's answer: the handle, and what the kernel may cache."""

    fh: int = 0
    direct_io: bool = False
    keep_cache: bool = False
    cache_readdir: bool = False


@dataclass(frozen=True)
class SetAttr:
    """What a setattr asks to change (None: leave it): times in nanoseconds, or ``UTIME_NOW``."""

    size: int | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    atime_ns: int | None = None
    mtime_ns: int | None = None


UTIME_NOW = (1 << 30) - 1   # utimensat's: "the current time"


class Conn:
    """What init may change of the connection: the capabilities it wants (libfuse's FUSE_CAP_*)."""

    def __init__(self, capable: int, want: int) -> None:
        self.capable, self.want = capable, want


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
WAKE = signal.SIGRTMIN + 2   # sent to a worker blocked reading the device, so that it sees the session end


@dataclass(frozen=True)
class End:
    """Why a request loop ended."""

    how: str                    # "unmounted", "signal", "failed", or "exited" (the session was ended from inside)
    signal: str | None = None   # with "signal": its name (SIGTERM)

    @property
    def unmounted(self) -> bool:
        """Ended by the kernel: fusermount3 -u, umount, or tfrfs umount (or the connection aborted)."""
        return self.how == "unmounted"

    def __str__(self) -> str:
        return {"unmounted": "unmounted", "signal": f"stopped by {self.signal}", "failed": "ended by an error",
                "exited": "ended from inside"}[self.how]


class MountFailed(RuntimeError):
    """No mount was made, or it ended as it began: the message says why."""


@contextlib.contextmanager
def stop_signals() -> Iterator[int | None]:
    """Python handlers for the stop signals and ``WAKE``, and the read end of a pipe that receives
    the number of each that arrives (None, and the handlers left as they are, off the main thread:
    only it may set them). Put back as they were on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    old_wakeup = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    old = {sig: signal.signal(sig, _noted) for sig in STOP_SIGNALS}
    signal.signal(WAKE, _noted)   # left set: a late WAKE must not end the process
    try:
        yield read_end
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(old_wakeup)
        os.close(read_end)
        os.close(write_end)


def _noted(signum: int, frame: Any) -> None:
    """The Python side of a stop signal's handler: nothing to do, the loop has read the pipe."""


def read_signal(fd: int) -> int:
    try:
        data = os.read(fd, 64)
    except BlockingIOError:
        data = b""
    stops = [b for b in data if b in STOP_SIGNALS]
    return stops[0] if stops else signal.SIGTERM


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


_READ_AHEAD_KB = 1024


def widen_readahead(mountpoint: str) -> None:
    """Let the kernel read ahead 1 MiB on this mount (its backing device's sysfs knob; root only),
    so that a large file arrives in 1 MiB requests, the most libfuse3 takes, instead of 128 KiB.

    Runs on its own thread: the stat below is answered by the daemon, which must first have
    finished ``init``; and the kernel sets its own read-ahead when that reply arrives.
    """
    try:
        dev = os.stat(mountpoint).st_dev
        knob = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
        with open(knob, "w") as f:
            f.write(f"{_READ_AHEAD_KB}\n")
        log.info("read-ahead %d KiB (%s)", _READ_AHEAD_KB, knob)
    except OSError as exc:   # not root, or no sysfs: large files come in 128 KiB reads
        log.info("read-ahead left at the kernel's default (raising it needs root): %s", exc)
