"""Notices to the kernel (forget a name, or a node's cached contents), sent from a thread of their
own; ``libfuse.Session.notifier`` gives the call that sends one."""

from __future__ import annotations

import errno
import logging
import os
import threading
from typing import Callable

log = logging.getLogger("tfrfs")


class Notifier:
    """Tells the kernel to forget names and nodes' cached contents, from a thread of its own.

    Sent from inside a request, a notice could wait on a lock that the request holds (libfuse's
    rule for notifications), so ``forget_name`` and ``forget_node`` only queue; ``settle`` waits
    until what was queued has been sent. ``send(node id, name or None)`` sends one (libfuse's
    ``fuse_lowlevel_notify_inval_entry``, or ``_inval_inode`` without a name): 0 or -errno.
    """

    def __init__(self, send: Callable[[int, bytes | None], int]) -> None:
        self._send = send
        self._changed = threading.Condition()
        self._queue: list[tuple[int, bytes | None]] = []
        self._asked = 0        # notices queued so far
        self._sent = 0         # of those, the ones sent
        self._stopped = False
        threading.Thread(target=self._run, name="tfrfs-notify", daemon=True).start()

    def forget_name(self, parent: int, name: str) -> None:
        self._queue_one(parent, name.encode("utf-8", "surrogateescape"))

    def forget_node(self, nodeid: int) -> None:
        """The kernel's cached data of ``nodeid`` (a folder's listing, a file's pages) is stale."""
        self._queue_one(nodeid, None)

    def _queue_one(self, nodeid: int, name: bytes | None) -> None:
        with self._changed:
            self._queue.append((nodeid, name))
            self._asked += 1
            self._changed.notify_all()

    def settle(self, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, until every notice queued so far has been sent. Call
        it only while answering a request that holds no folder's lock (a read)."""
        with self._changed:
            asked = self._asked
            self._changed.wait_for(lambda: self._sent >= asked or self._stopped, timeout)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._queue))
                batch, self._queue = self._queue, []
            gone = False
            for nodeid, name in batch:
                rc = self._send(nodeid, name)
                gone = rc in (-errno.ENODEV, -errno.EBADF)   # unmounted
                if rc not in (0, -errno.ENOENT) and not gone:   # ENOENT: the kernel holds no such node
                    log.debug("kernel notification for node %d failed: %s", nodeid, os.strerror(-rc))
                if gone:
                    break
            with self._changed:
                self._sent += len(batch)
                self._stopped = gone
                self._changed.notify_all()
            if gone:
                return


