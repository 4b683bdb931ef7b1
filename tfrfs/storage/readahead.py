"""Large records read and checked ahead of use, on worker threads.

Reading a 2 MB record and checking its checksum takes longer than handing its image to
the kernel, and a reader that goes through a shard's records in order waits for that read
each time it opens the next one. While one record is being served, ``ReadAhead`` reads the
next ones into buffers of their own and checks them, so the disk, the checksum and the
transfer to the reader overlap. There are as many workers as records read ahead, so that the
disk reads the one while the other's checksum is checked. The caller says which records come
next; this module only reads.

The read goes through the page cache, like every other read of the shard: the record's images
are then served from the shard (``LocalReader.serve``), and their bytes are in the cache by then.
(Read past the cache, with ``O_DIRECT``, each large record came from the disk twice: once here,
and again when its images were served, once the buffer it was read into had been let go.)
Buffers are handed back once the record is rendered and reused for the next reads, so that
reading ahead maps no new memory per record.

At most ``MAX_AHEAD`` records are under way or waiting, each in its own buffer; a result
nobody takes is dropped when the next one is asked for. A record that fails its check is
not reported here: ``take`` answers None and the caller reads it itself, the usual way,
which reports what is wrong with it.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Hashable

from tfrfs.errors import DataLoss
from tfrfs.format import tfrecord

log = logging.getLogger("tfrfs")

MAX_AHEAD = 2               # records read ahead and not yet taken (and worker threads)
MAX_RECORD = 16 << 20       # larger records are not read ahead (the caller reads them itself)
_SPARE_BUFFERS = 2          # buffers kept for the next reads once their records are given back
_GRAIN = 1 << 20            # buffer sizes are rounded up to this


@dataclass(frozen=True, eq=False)
class Record:
    """A record read ahead and checked: its data is ``buf[:length]``; ``prepared`` is what the
    caller's ``prepare`` made of it (None if it was given none, or it failed)."""

    buf: mmap.mmap
    length: int
    prepared: Any = None

    def data(self) -> memoryview:
        return memoryview(self.buf)[:self.length]


class ReadAhead:
    """Reads records ahead on ``MAX_AHEAD`` worker threads; ``take`` hands over what it read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: OrderedDict[Hashable, Future[Record | None]] = OrderedDict()
        self._spare: list[mmap.mmap] = []
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self.taken = 0   # records handed over by take()

    def start(self, key: Hashable, fd: int, offset: int, length: int,
              prepare: Callable[[Record], Any] | None = None) -> None:
        """Begin reading the record of ``length`` data bytes at ``offset`` of ``fd`` (known to
        the caller as ``key``), unless it is under way already. Once it is read and checked,
        ``prepare`` (if given) is called with it on the worker, and what it returns is handed
        over with the record; it must not change anything another thread uses."""
        if length > MAX_RECORD:
            return
        dropped = []
        with self._lock:
            if self._closed or key in self._jobs:
                return
            while len(self._jobs) >= MAX_AHEAD:   # the oldest was not wanted after all
                dropped.append(self._jobs.popitem(last=False)[1])
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=MAX_AHEAD, thread_name_prefix="tfrfs-readahead")
            buf = self._buffer(length + tfrecord.FOOTER)
            self._jobs[key] = self._pool.submit(self._read, fd, offset, length, buf, prepare)
        for job in dropped:   # outside the lock: a finished job's callback runs at once
            job.add_done_callback(self._recycle)

    def take(self, key: Hashable) -> Record | None:
        """The record read ahead as ``key``, checked (waiting for it if it is still being
        read); None when it was not read ahead or did not read whole. The caller owns its
        buffer until it calls ``give_back`` with it."""
        with self._lock:
            job = self._jobs.pop(key, None)
        if job is None:
            return None
        record = job.result()
        if record is not None:
            with self._lock:
                self.taken += 1
        return record

    def give_back(self, record: Record) -> None:
        """Done with a record ``take`` returned (nothing refers to its data any more)."""
        self._keep(record.buf)

    def close(self) -> None:
        """Stop reading ahead; returns once no read is under way (the descriptors may go)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            self._jobs.clear()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _buffer(self, size: int) -> mmap.mmap:
        for n, buf in enumerate(self._spare):
            if len(buf) >= size:
                return self._spare.pop(n)
        # Whole MiBs, so that the next record, a little larger, fits too (a new buffer costs
        # more than the read: its pages are zeroed and mapped).
        return mmap.mmap(-1, -(-size // _GRAIN) * _GRAIN)

    def _keep(self, buf: mmap.mmap) -> None:
        with self._lock:
            self._spare.append(buf)
            if len(self._spare) > _SPARE_BUFFERS:   # drop the smallest
                self._spare.remove(min(self._spare, key=len))

    def _recycle(self, job: Future[Record | None]) -> None:
        record = None if job.cancelled() else job.result()
        if record is not None:
            self._keep(record.buf)

    def _read(self, fd: int, offset: int, length: int, buf: mmap.mmap,
              prepare: Callable[[Record], Any] | None) -> Record | None:
        """The record's bytes read into ``buf`` and checked, and ``prepare``'s result; None if it
        does not read whole (the caller's own read will say why)."""
        try:
            tfrecord.read_record_into(fd, offset, length, buf).release()
        except (OSError, DataLoss) as exc:
            log.debug("read ahead of the record at offset %d: %s", offset, exc)
            return None
        record = Record(buf, length)
        if prepare is not None:
            try:
                record = replace(record, prepared=prepare(record))
            except Exception as exc:  # noqa: BLE001 - the caller does it again itself, and reports
                log.debug("preparing the record at offset %d: %s", offset, exc)
        return record
