"""Problems found in the data while mounted (SPEC 6): logged once each, listed in ``.tfrfs/errors``;
and the last writes a writable mount refused (SPEC 7), for ``.tfrfs/status``."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger("tfrfs")

REJECTED_KEPT = 20   # refused writes listed in .tfrfs/status (and by tfrfs status)


@dataclass(frozen=True)
class Rejected:
    """A write refused at close. A shell's ``>`` ignores the EINVAL of close, so ``tfrfs status``
    is where its reason is found."""

    time: float       # seconds since the epoch
    path: str         # inside the mount
    reason: str


class ErrorLog:
    """Each problem once: a warning in the daemon log and a JSON line in ``.tfrfs/errors``;
    thread-safe (the lines and what was seen change together, under its lock)."""

    def __init__(self) -> None:
        self._lines: list[bytes] = []
        self._seen: set[tuple] = set()
        self._lock = threading.Lock()
        self.on_change: Callable[[], None] | None = None   # the adapter tells the kernel the file grew
        self.rejected: deque[Rejected] = deque(maxlen=REJECTED_KEPT)   # every one, not once each

    def reject(self, path: str, reason: str) -> None:
        """Keep a refused write among the last ones (its reason goes to ``add`` too)."""
        with self._lock:
            self.rejected.append(Rejected(time.time(), path, reason))

    def add(self, shard: str | None, index: int | None, offset: int | None, reason: str, **extra: object) -> None:
        key = (shard, index, offset, reason)
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
            entry = {"shard": shard, "index": index, "offset": offset, "reason": reason, **extra}
            self._lines.append((json.dumps(entry, ensure_ascii=False) + "\n").encode())
        where = f"{shard}" + (f" record {index}" if index is not None else "") + \
                (f" at offset {offset}" if offset is not None else "")
        log.warning("%s: %s", where, reason)
        if self.on_change is not None:
            self.on_change()

    def render(self) -> bytes:
        with self._lock:
            return b"".join(self._lines)

    def __len__(self) -> int:
        return len(self._lines)   # (len of a list: atomic under the GIL; lines are only added)
