"""libfuse below the binding, without a mount: only the adapter imports the FUSE binding, and a
read_buf answer holds exactly the bytes, or the file place, it was given."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfrfs.fuse import loop as fuse_loop


@pytest.mark.parametrize("module", ["tfrfs.view.tree", "tfrfs.fuse.loop"])
def test_never_imports_the_binding(module: str) -> None:
    code = (f"import sys, {module}; "
            "assert not {'mfusepy', 'fuse'} & set(sys.modules), 'the FUSE binding was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def _answer(where: tuple[int, int, int] | None, data: bytes | memoryview) -> fuse_loop._BufVec:
    slot = ctypes.c_void_p()
    assert fuse_loop.fill_read_buf(ctypes.byref(slot), where, data) == 0
    assert slot.value
    return fuse_loop._BufVec.from_address(slot.value)


def _free(vec: fuse_loop._BufVec) -> None:
    # What libfuse does once it has sent the answer (fuse_free_buf, then free).
    if vec.buf.mem:
        fuse_loop._libc.free(vec.buf.mem)
    fuse_loop._libc.free(ctypes.addressof(vec))


@pytest.mark.parametrize("data", [b"", b"abc", memoryview(bytearray(b"held in memory")),
                                  memoryview(bytearray(b"0123456789"))[3:7], memoryview(bytearray())])
def test_bytes_are_copied_into_malloc(data: bytes | memoryview) -> None:
    vec = _answer(None, data)
    try:
        assert (vec.count, vec.idx, vec.off) == (1, 0, 0)
        assert vec.buf.flags == 0 and vec.buf.fd == -1
        assert vec.buf.size == len(data)
        assert ctypes.string_at(vec.buf.mem, vec.buf.size) == bytes(data)
    finally:
        _free(vec)


def test_a_file_place_is_passed_as_descriptor_and_position(tmp_path: Path) -> None:
    path = tmp_path / "shard"
    path.write_bytes(b"x" * 100)
    fd = os.open(path, os.O_RDONLY)
    try:
        vec = _answer((fd, 40, 25), b"")
        try:
            assert vec.buf.flags == fuse_loop._BUF_IS_FD | fuse_loop._BUF_FD_SEEK
            assert (vec.buf.fd, vec.buf.pos, vec.buf.size) == (fd, 40, 25)
            assert not vec.buf.mem
        finally:
            _free(vec)
    finally:
        os.close(fd)


@pytest.mark.parametrize("sig", fuse_loop.STOP_SIGNALS)
def test_a_stop_signal_is_read_from_the_wakeup_pipe(sig: int) -> None:
    """While the request loop runs, SIGTERM, SIGINT and SIGHUP neither kill the daemon nor raise
    KeyboardInterrupt: their number arrives on the pipe the loop watches. Afterwards the handlers
    are as they were."""
    import signal
    before = {s: signal.getsignal(s) for s in fuse_loop.STOP_SIGNALS}
    with fuse_loop._stop_signals() as wakeup:
        assert wakeup is not None
        os.kill(os.getpid(), sig)
        assert fuse_loop._signal_name(fuse_loop._read_signal(wakeup)) == signal.Signals(sig).name
    assert {s: signal.getsignal(s) for s in fuse_loop.STOP_SIGNALS} == before
    assert signal.set_wakeup_fd(-1) == -1   # and no wakeup pipe is left set


def test_only_an_unmount_is_an_unmount() -> None:
    assert fuse_loop.End("unmounted").unmounted
    for end in (fuse_loop.End("signal", "SIGTERM"), fuse_loop.End("failed"), fuse_loop.End("exited")):
        assert not end.unmounted
    assert str(fuse_loop.End("signal", "SIGINT")) == "stopped by SIGINT"
