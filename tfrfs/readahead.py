"""Large records read and checked ahead of use, on a worker thread.

Reading a 2 MB record and checking its checksum takes longer than handing its image to
the kernel, and a reader that goes through a shard's records in order waits for that read
each time it opens the next one. While one record is being served, ``ReadAhead`` reads the
next into a buffer of its own and checks it, so the disk, the checksum and the transfer to
the reader overlap. The caller says which record comes next; this module only reads.

At most ``MAX_AHEAD`` records are under way or waiting, each in its own buffer; a result
nobody takes is dropped when the next one is asked for. With the one being served and one
spare, that is three buffers of at most ``MAX_RECORD`` bytes (in whole MiBs). A record that fails its check is
not reported here: ``take`` answers None and the caller reads it itself, the usual way,
which reports what is wrong with it.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Hashable

from . import tfrecord
from .errors import DataLoss

log = logging.getLogger("tfrfs")

MAX_AHEAD = 1               # records read ahead and not yet taken
MAX_RECORD = 16 << 20       # larger records are not read ahead (the caller reads them itself)
_SPARE_BUFFERS = 1          # buffers kept for the next reads once their records are taken
_GRAIN = 1 << 20            # buffer sizes are rounded up to this


class ReadAhead:
    """Reads records ahead on one worker thread; ``take`` hands over what it read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: OrderedDict[Hashable, Future[bytearray | None]] = OrderedDict()
        self._spare: list[bytearray] = []
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self.taken = 0   # records handed over by take()

    def start(self, key: Hashable, fd: int, offset: int, length: int) -> None:
        """Begin reading the record of ``length`` data bytes at ``offset`` of ``fd`` (known to
        the caller as ``key``), unless it is under way already."""
        if length > MAX_RECORD:
            return
        dropped = []
        with self._lock:
            if self._closed or key in self._jobs:
                return
            while len(self._jobs) >= MAX_AHEAD:   # the oldest was not wanted after all
                dropped.append(self._jobs.popitem(last=False)[1])
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfrfs-readahead")
            buf = self._buffer(length + tfrecord.FOOTER)
            self._jobs[key] = self._pool.submit(_read, fd, offset, length, buf)
        for job in dropped:   # outside the lock: a finished job's callback runs at once
            job.add_done_callback(self._recycle)

    def take(self, key: Hashable) -> bytearray | None:
        """The buffer holding the record read ahead as ``key``, checked, its data first
        (waiting for it if it is still being read); None when it was not read ahead or did not
        read whole. The caller owns the buffer until it calls ``give_back`` with it."""
        with self._lock:
            job = self._jobs.pop(key, None)
        if job is None:
            return None
        buf = job.result()
        if buf is not None:
            self.taken += 1
        return buf

    def give_back(self, buf: bytearray) -> None:
        """Done with a buffer ``take`` returned: it may be read into again."""
        self._keep(buf)

    def close(self) -> None:
        """Stop reading ahead; returns once no read is under way (the descriptors may go)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            self._jobs.clear()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _buffer(self, size: int) -> bytearray:
        for n, buf in enumerate(self._spare):
            if len(buf) >= size:
                return self._spare.pop(n)
        # Whole MiBs, so that the next record, a little larger, fits too (a new buffer costs
        # more than the read: its pages are zeroed and mapped).
        return bytearray(-(-size // _GRAIN) * _GRAIN)

    def _keep(self, buf: bytearray) -> None:
        with self._lock:
            self._spare.append(buf)
            if len(self._spare) > _SPARE_BUFFERS:   # drop the smallest
                self._spare.remove(min(self._spare, key=len))

    def _recycle(self, job: Future[bytearray | None]) -> None:
        if not job.cancelled() and job.result() is not None:
            self._keep(job.result())


def _read(fd: int, offset: int, length: int, buf: bytearray) -> bytearray | None:
    """The record's bytes read into ``buf`` and checked; None if it does not read whole (the
    caller's own read will say why)."""
    try:
        data = tfrecord.read_record_into(fd, offset, length, buf)
    except (DataLoss, OSError) as exc:
        log.debug("read ahead of the record at offset %d: %s", offset, exc)
        return None
    data.release()
    return buf
