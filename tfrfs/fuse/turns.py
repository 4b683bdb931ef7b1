"""Which of the daemon's threads takes the next request, and when: the reader, or a helper.

One thread, the reader, takes every request, one at a time. The others, the helpers, take a
request only while the reader has spent more than ``HELP_AFTER_S`` on one (it waits on the disk
or a bucket) and more are waiting: a request that takes long does not hold up the rest. Helpers
that read the device all the time took half of the small requests from the reader, and each then
waited for Python's lock, which cost more than the answers.

After its last answer the reader watches for the next request for ``poll_us`` before it goes to
sleep in read(): a reader going through many files then finds it awake (on a virtual machine,
waking a sleeping thread costs more than answering most requests). While requests come, the
helpers look every ``HELP_EVERY_S``; after ``HELP_IDLE_S`` with none they sleep until the next.

Nothing here knows libfuse: ``libfuse.Session`` reads and answers the requests, ``Turns`` says
who and when.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

# A thread back from a short wait (a read of the disk, an answer written to the kernel) waits for
# Python's lock until the one holding it lets go: at most this long, not Python's 5 ms.
SWITCH_S = 0.0005
HELP_AFTER_S = 0.001   # a request answered for longer than this lets a helper take the next
HELP_EVERY_S = 0.005   # how often a helper looks, while requests come
HELP_IDLE_S = 1.0      # helpers sleep once no request came for this long


class Turns:
    """The turn-taking of one session's threads. ``pending(timeout_ms)`` (a ``poll`` of the
    device) tells whether a request waits."""

    def __init__(self, poll_us: int) -> None:
        self.poll_s = poll_us / 1e6
        self._since = 0.0        # when the reader began the request it answers (0: it answers none)
        self._last = 0.0         # when the last request was taken
        self._active = threading.Event()   # set while requests come (helpers look for work)

    def watch(self, pending: Callable[[int], Any]) -> None:
        """The reader, before it reads the device: watch for the next request for ``poll_us``."""
        if self.poll_s:
            clock = time.perf_counter
            until = clock() + self.poll_s
            while not pending(0) and clock() < until:
                pass

    def begin(self) -> None:
        """The reader took a request."""
        self._since = self._last = time.perf_counter()
        if not self._active.is_set():
            self._active.set()   # (helpers sleep while no request comes)

    def done(self) -> None:
        """The reader answered it."""
        self._since = 0.0

    def helped(self) -> None:
        """A helper took a request."""
        self._last = time.perf_counter()

    def helper_turn(self, pending: Callable[[int], Any]) -> bool:
        """For a helper: True if it should take the next request now; else False, after a short
        wait (or, once no request came for a while, after sleeping until one does)."""
        if not self._active.wait(1.0):
            return False
        since = self._since
        now = time.perf_counter()
        if since and now - since >= HELP_AFTER_S and pending(0):
            return True
        if now - self._last > HELP_IDLE_S:
            self._active.clear()
        else:
            time.sleep(HELP_EVERY_S)
        return False

    def stop(self) -> None:
        """The session ended: wake the helpers, so that they see it."""
        self._active.set()
