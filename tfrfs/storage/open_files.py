"""Descriptors of files read by path, kept open between reads, a bounded number at a time.

A read-only mount answers each read by path, with no open handle (see ``Tree.serve``), so the
descriptors of the plain files being read are kept here: the least recently used is closed once
more than ``limit`` are open. Several threads read at once: a descriptor is closed only once no
read through it is under way, so a read never meets its descriptor closed, or its number given
to another file, under it. The reads themselves (``os.pread``) hold no lock.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Callable


class _Open:
    __slots__ = ("fd", "readers", "retired")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.readers = 0       # reads through it under way
        self.retired = False   # out of the table: closed by the last read under way


class OpenFiles:
    """Reads of files by key; ``local(key)`` is the path to open (it may fetch the file first)."""

    def __init__(self, local: Callable[[str], str], limit: int) -> None:
        self._local = local
        self._limit = limit
        self._lock = threading.Lock()
        self._open: OrderedDict[str, _Open] = OrderedDict()

    def pread(self, key: str, size: int, offset: int) -> bytes:
        """``size`` bytes at ``offset`` of the file (fewer at its end)."""
        if size <= 0:
            return b""
        held = self._take(key)
        try:
            return os.pread(held.fd, size, offset)
        finally:
            self._give_back(held)

    def _take(self, key: str) -> _Open:
        with self._lock:
            held = self._open.get(key)
            if held is not None:
                self._open.move_to_end(key)
                held.readers += 1
                return held
        fd = os.open(self._local(key), os.O_RDONLY)   # outside the lock: a remote file is fetched first
        doomed = []
        with self._lock:
            held = self._open.get(key)
            if held is not None:   # opened meanwhile by another read
                doomed.append(fd)
            else:
                held = self._open[key] = _Open(fd)
            held.readers += 1
            while len(self._open) > self._limit:
                _, old = self._open.popitem(last=False)
                old.retired = True
                if old.readers == 0:
                    doomed.append(old.fd)
        for fd in doomed:
            os.close(fd)
        return held

    def _give_back(self, held: _Open) -> None:
        with self._lock:
            held.readers -= 1
            last = held.retired and held.readers == 0
        if last:
            os.close(held.fd)

    def close(self) -> None:
        """Close every descriptor (no read follows)."""
        with self._lock:
            doomed = [held.fd for held in self._open.values()]
            self._open.clear()
        for fd in doomed:
            os.close(fd)
