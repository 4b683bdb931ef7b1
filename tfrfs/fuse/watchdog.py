"""Requests that run too long: logged with the stack that runs them, and noted for ``tfrfs status``.

The kernel holds every process that touches a FUSE mount until the daemon answers it, in a sleep
no signal ends. A request that never ends (a bug that loops, a store that stops answering) would
leave the user with hung shells and nothing to say why. So the operations note each request as it
enters and leaves (``begin``/``end``: a dict entry, no lock), and a watcher thread looks at them a
few times a second: a request older than its limit is logged once, with its operation, path and
the stack it is running, and noted beside the mount's record (``mountrecord.write_busy``) so that
``tfrfs status MOUNTPOINT`` can say what the daemon is busy with without asking the mount. When it
ends at last, that is logged too and the note goes.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
import traceback
from typing import Callable

log = logging.getLogger("tfrfs")

LIMIT_ENV = "TFRFS_SLOW_REQUEST_S"
METADATA_LIMIT_S = 30.0    # a lookup, a listing, a stat, a mkdir: they touch no record data
DATA_FACTOR = 4            # reads, writes and closes move data (and a close may commit): longer

# Operations that move a file's data; every other one answers from metadata.
DATA_OPS = frozenset(("read", "read_buf", "write", "flush", "release", "fsync", "truncate", "create",
                      "open", "destroy"))

Note = Callable[["dict | None"], None]   # the busy note: a request's description, or None when it ends


class RequestWatch:
    """The requests in flight in one daemon, and the thread that watches them."""

    def __init__(self, limit_s: float | None = None, note: Note | None = None) -> None:
        if limit_s is None:
            limit_s = _limit_from_environment()
        self.limit_s = limit_s
        self._note = note
        self._tokens = itertools.count(1)
        # token -> (operation, path, start on the monotonic clock, thread): one clock read a
        # request; the wall-clock start is worked out only for a request that is reported
        self._inflight: dict[int, tuple[str, str, float, int]] = {}
        self._reported: set[int] = set()
        self._lock = threading.Lock()   # the reported set and the note; begin/end take none
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self, op: str, path: object) -> int:
        token = next(self._tokens)
        self._inflight[token] = (op, path if isinstance(path, str) else "", time.monotonic(),
                                 threading.get_ident())
        return token

    def end(self, token: int) -> None:
        entry = self._inflight.pop(token, None)
        if token in self._reported:
            self._finished(token, entry)

    def start(self) -> None:
        if self._thread is None and self.limit_s > 0:
            self._thread = threading.Thread(target=self._watch, name="tfrfs-request-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def check(self) -> list[int]:
        """Report the requests that have run past their limit and were not reported yet (the
        watcher's one step; a test may call it); their tokens."""
        now = time.monotonic()
        late = []
        for token, (op, path, t0, tid) in list(self._inflight.items()):
            limit = self.limit_s * (DATA_FACTOR if op in DATA_OPS else 1)
            if now - t0 < limit or token in self._reported:
                continue
            frame = sys._current_frames().get(tid)
            where = "".join(traceback.format_stack(frame)) if frame is not None else "  (its thread has ended)\n"
            with self._lock:
                if token not in self._inflight:
                    continue   # it ended meanwhile
                self._reported.add(token)
                if self._note is not None:
                    self._note(_described(op, path, t0))
            log.warning("%s %s has run for %.0f s; the mount may answer nothing else until it ends. It is "
                        "here (most recent call last):\n%s", op, path or "-", now - t0, where.rstrip())
            late.append(token)
        return late

    def _finished(self, token: int, entry: tuple[str, str, float, int] | None) -> None:
        with self._lock:
            self._reported.discard(token)
            if self._note is not None:
                # Another request reported and still running keeps the note, else it goes.
                still = next((self._inflight[t] for t in self._reported if t in self._inflight), None)
                self._note(None if still is None else _described(still[0], still[1], still[2]))
        if entry is not None:
            op, path, t0 = entry[0], entry[1], entry[2]
            log.warning("%s %s ended after %.1f s", op, path or "-", time.monotonic() - t0)

    def _watch(self) -> None:
        interval = min(1.0, self.limit_s / 4)
        while not self._stop.wait(interval):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watcher must outlive a failure to log or note
                log.debug("the request watcher failed once", exc_info=True)


def _described(op: str, path: str, t0: float) -> dict:
    """The busy note of a request that started at ``t0`` (monotonic): its start in epoch seconds."""
    return {"op": op, "path": path, "since": time.time() - (time.monotonic() - t0), "pid": os.getpid()}


def _limit_from_environment() -> float:
    raw = os.environ.get(LIMIT_ENV)
    if not raw:
        return METADATA_LIMIT_S
    try:
        value = float(raw)
    except ValueError:
        log.warning("%s=%r is not a number of seconds; using %.0f", LIMIT_ENV, raw, METADATA_LIMIT_S)
        return METADATA_LIMIT_S
    return value if value > 0 else 0.0   # 0 (or less): no watching
