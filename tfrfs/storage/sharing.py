"""Work shared among the threads that answer a mount's requests at once.

A read-only mount is asked by several FUSE worker threads at a time. Its caches are guarded by
locks of their own, held only around their bookkeeping; what takes long (a read from the disk or
a store, rendering a record, loading an index) happens outside them, so requests that wait on
the disk or the network overlap. Two helpers keep that from costing twice or mixing up:

- ``Flights``: one computation per key at a time; whoever asks for a key being computed waits
  for that result (two threads loading one index, or rendering one record, do it once).
- ``KeyedLocks``: a lock per key, for work that must not run twice at once for one key but
  must run again for each caller (saving one shard's index as it changes).

It lives with the storage, the lowest layer whose caches need it; it imports nothing of tfrfs.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Callable, Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Flights(Generic[K, V]):
    """At most one ``compute`` under way per key; callers that ask meanwhile share its result
    (or its exception)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[K, Future[V]] = {}

    def run(self, key: K, compute: Callable[[], V]) -> V:
        """``compute()``, or the result of the call of it already under way for ``key``. The
        caller checks its cache again inside ``compute``: a flight that just ended has put its
        result there."""
        with self._lock:
            flight = self._running.get(key)
            leader = flight is None
            if flight is None:
                flight = self._running[key] = Future()
        if not leader:
            return flight.result()
        try:
            value = compute()
        except BaseException as exc:
            flight.set_exception(exc)
            raise
        else:
            flight.set_result(value)
            return value
        finally:
            with self._lock:
                del self._running[key]


class KeyedLocks(Generic[K]):
    """A lock for each key, made when first asked for and kept (keys are few: shards, files)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[K, threading.Lock] = {}

    def __call__(self, key: K) -> threading.Lock:
        with self._lock:
            lock = self._locks.get(key)
            if lock is None:
                lock = self._locks[key] = threading.Lock()
            return lock
