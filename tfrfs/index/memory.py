"""The record offsets a mount holds in memory, bounded (SPEC 1.2, ``--index-memory``).

A shard's offsets are loaded the first time one of its records is looked up (a read-only map of
its index file) and dropped again, least recently used first, once the shards' offsets held add
up past the budget. A dropped shard's offsets are loaded again when next needed; whoever still
holds the old view keeps it valid (the map goes with its last view), so a drop never pulls
offsets from under a read in progress.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Protocol

DEFAULT_INDEX_MEMORY = 128 << 20   # 32 million records' offsets


def parse_size(text: str) -> int:
    """A size in bytes: a whole number with an optional K, M, G or T (powers of 1024)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in units else ""
    try:
        value = float(t[:len(t) - len(unit)])
    except ValueError:
        value = -1
    if not 0 <= value < math.inf:   # NaN and infinity are no sizes either
        raise ValueError(f"{text!r} is not a size (like 500M or 20G)")
    return int(value * units[unit])


class Droppable(Protocol):
    def drop_offsets(self) -> None: ...


class IndexMemory:
    """Which shards' offsets are held, by bytes, least recently used first; thread-safe."""

    def __init__(self, budget: int = DEFAULT_INDEX_MEMORY) -> None:
        self.budget = budget
        self._held: OrderedDict[int, tuple[Droppable, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.total = 0
        self.loads = 0
        self.drops = 0

    def hold(self, owner: Droppable, nbytes: int) -> None:
        """``owner`` just loaded ``nbytes`` of offsets: the least recently used others go while
        the total is past the budget (the newest always stays)."""
        for other in self.take(owner, nbytes):
            other.drop_offsets()

    def take(self, owner: Droppable, nbytes: int) -> list[Droppable]:
        """``hold``, but the others that must go are returned, for the caller to drop once it
        holds no lock of its own (an owner drops its offsets under its own lock: dropping
        another's while holding one's own could wait for each other)."""
        doomed: list[Droppable] = []
        with self._lock:
            key = id(owner)
            old = self._held.pop(key, None)
            if old is not None:
                self.total -= old[1]
            self._held[key] = (owner, nbytes)
            self.total += nbytes
            self.loads += 1
            while self.total > self.budget and len(self._held) > 1:
                _, (other, size) = self._held.popitem(last=False)
                self.total -= size
                self.drops += 1
                doomed.append(other)
        return doomed

    def used(self, owner: Droppable) -> None:
        with self._lock:
            key = id(owner)
            if key in self._held:
                self._held.move_to_end(key)

    def forget(self, owner: Droppable) -> None:
        """``owner`` no longer holds offsets (dropped by itself, or replaced)."""
        with self._lock:
            old = self._held.pop(id(owner), None)
            if old is not None:
                self.total -= old[1]

    @property
    def shards(self) -> int:
        return len(self._held)
