"""Finding a mount's daemon process and waiting for it to end (tests that stop or kill it)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def daemon_pid(mnt: Path) -> int:
    """The pid of the daemon serving ``mnt`` (started by ``tfrfs mount``, so run with --daemon)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--daemon" in args and os.fsencode(str(mnt)) in args:
            return int(entry)
    raise AssertionError(f"no daemon found for {mnt}")


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie nobody reaped has closed its files, lock included)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return any(line.split()[1:2] == ["Z"] for line in status.splitlines() if line.startswith("State:"))


def wait_gone(pid: int, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gone(pid), f"daemon {pid} did not end"
