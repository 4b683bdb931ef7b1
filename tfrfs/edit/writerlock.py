"""The single-writer lock of a source's staging folder (SPEC 7: one writable mount at a time).

``STAGING/lock`` is ``flock``-ed by the one process that may change the staged edits (a writable
mount, ``tfrfs commit SOURCE``, ``discard``, ``repair``). The file also says who holds it (process,
mount point), for the messages of ``status``, ``commit`` and ``discard``. A mount that ends with
nothing staged removes the staging folder, lock file included (``Staging.tidy``), so a lock taken
on a file that has left its path meanwhile is taken again on the file that is there.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path

from tfrfs.errors import Busy

log = logging.getLogger("tfrfs")


class WriterLock:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / "lock"
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this process holds it."""
        return self._fd is not None

    def take(self) -> None:
        """Take it; raises Busy when another process holds it."""
        for _ in range(100):
            self.folder.mkdir(exist_ok=True)
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                continue                  # the folder went away just now
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise Busy(f"{self.folder.parent} is already mounted writable by another tfrfs process"
                           + held_at(self.holder())) from None
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    self._fd = fd
                    return
            except FileNotFoundError:
                pass
            os.close(fd)
        raise Busy(f"{self.folder}: its lock file keeps going away; is another tfrfs ending a mount there?")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def note_holder(self, **info: object) -> None:
        """Note in the lock file who holds it (process, mount point), for status, commit and discard."""
        if self._fd is None:
            return
        data = json.dumps({"pid": os.getpid(), **info}).encode()
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, data, 0)
        except OSError as exc:   # only a message depends on it
            log.warning("could not note this mount in %s: %s", self.path, exc)

    def holder(self) -> dict:
        """What the lock file says of the last holder (whether or not it still runs)."""
        try:
            info = json.loads(self.path.read_bytes() or b"{}")
        except (OSError, ValueError):
            return {}
        return info if isinstance(info, dict) else {}

    def is_locked(self) -> bool:
        """Whether another process holds it now."""
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False


def held_at(info: dict) -> str:
    """`` (mounted at MOUNTPOINT, process PID)`` from a holder's note, or nothing."""
    where = info.get("mountpoint")
    return f" (mounted at {where}, process {info.get('pid')})" if where else ""
