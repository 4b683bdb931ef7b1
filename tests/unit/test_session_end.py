"""Why a mount's request loop ended, when its workers say different things (``libfuse.Session._wait``).

The worker that reads the kernel's ENODEV after ``fusermount3 -u`` ends "unmounted", and libfuse
marks the session exited as it does; another worker that sees the mark first ends "exited". The
daemon commits a writable mount's edits only for "unmounted", so an end that says why must win
whichever worker reports first (it once left the edits staged, one run in many, under load)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tfrfs.fuse import libfuse
from tfrfs.fuse.loop import End


class _Ends:
    """A Session with only what ``_wait`` reads: its workers' ends and the pipe they write to."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, workers: int = 2) -> None:
        self.session = libfuse.Session.__new__(libfuse.Session)
        self.session.workers = workers
        self.session._ends = []
        self.session._done_r, self.session._done_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.session.se = None
        self.exited = False
        monkeypatch.setattr(libfuse, "_session_exited", lambda se: self.exited)

    def end(self, how: str, after: float = 0.0) -> None:
        def go() -> None:
            time.sleep(after)
            self.exited = True
            self.session._ends.append(End(how))
            os.write(self.session._done_w, b"x")
        threading.Thread(target=go, daemon=True).start()

    def close(self) -> None:
        os.close(self.session._done_r)
        os.close(self.session._done_w)


@pytest.fixture
def ends(monkeypatch: pytest.MonkeyPatch):
    made = _Ends(monkeypatch)
    yield made
    made.close()


def test_an_unmount_reported_after_an_exit_wins(ends: _Ends) -> None:
    ends.end("exited")
    ends.end("unmounted", after=0.2)
    assert ends.session._wait(None).how == "unmounted"


def test_an_unmount_reported_first_wins(ends: _Ends) -> None:
    ends.end("unmounted")
    ends.end("exited", after=0.1)
    assert ends.session._wait(None).how == "unmounted"


def test_every_worker_exited_is_an_exit(ends: _Ends) -> None:
    ends.end("exited")
    ends.end("exited", after=0.1)
    started = time.monotonic()
    assert ends.session._wait(None).how == "exited"
    assert time.monotonic() - started < libfuse._END_GRACE_S   # not held for the grace: all had ended


def test_a_worker_that_never_ends_holds_the_end_for_the_grace_only(ends: _Ends,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(libfuse, "_END_GRACE_S", 0.3)
    ends.end("exited")
    started = time.monotonic()
    assert ends.session._wait(None).how == "exited"
    assert 0.25 <= time.monotonic() - started < 5
