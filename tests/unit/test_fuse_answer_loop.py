"""The compiled table's request loop (``Table.serve``) without a mount: a SOCK_SEQPACKET pair
stands in for the device (each read takes one request, as from /dev/fuse); requests laid out by
hand as linux/fuse.h has them. Skips where the extension was not built, unless
TFRFS_REQUIRE_COMPILED is set (as scripts/test does)."""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import struct
import threading
from typing import Any, Iterator

import pytest

from test_fuse_answer_table import _answer   # (skips this module too where it was not built)
from test_fuse_direct import ATTRS, attr_fields, read_in, request

LOOKUP, GETATTR, READ = 1, 3, 15
VALID = (86400, 0, 86400, 0)
SPACE = 1 << 16


@pytest.fixture()
def device() -> Iterator[tuple[socket.socket, socket.socket]]:
    daemon, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    kernel.settimeout(10)
    yield daemon, kernel
    daemon.close()
    kernel.close()


def _table(daemon: socket.socket) -> Any:
    t = _answer.Table(daemon.fileno(), 64)
    t.add(9, b"label.json", 78, struct.pack("<QQQQQQIIIIIIIIII", *attr_fields(ATTRS)), *VALID, b"[3]", -1, 0, 0)
    return t


def _answer_of(kernel: socket.socket) -> tuple[int, int, bytes]:
    data = kernel.recv(1 << 20)
    length, error, unique = struct.unpack_from("<IiQ", data)
    assert length == len(data)
    return error, unique, data[16:]


def test_serve_answers_what_the_table_holds_and_returns_the_first_request_it_does_not(device: Any) -> None:
    daemon, kernel = device
    t = _table(daemon)
    space = ctypes.create_string_buffer(SPACE)
    kernel.send(request(LOOKUP, 9, b"label.json\0", unique=1))
    kernel.send(request(READ, 78, read_in(0, 0, 4096), unique=2))
    kernel.send(request(GETATTR, 78, struct.pack("<IIQ", 0, 0, 0), unique=3))
    missing = request(LOOKUP, 9, b"missing\0", unique=4)
    kernel.send(missing)
    size = t.serve(ctypes.addressof(space), SPACE, 0)
    assert size == len(missing) and space.raw[:size] == missing   # Python's to answer
    (e1, u1, entry), (e2, u2, data), (e3, u3, _) = (_answer_of(kernel) for _ in range(3))
    assert (e1, u1, e2, u2, data, e3, u3) == (0, 1, 0, 2, b"[3]", 0, 3)
    assert struct.unpack_from("<Q", entry)[0] == 78
    assert t.forget(78, 5) == 1   # the lookup answered in the loop is counted


def test_serve_returns_0_when_the_device_ends_and_minus_errno_when_a_signal_comes(device: Any) -> None:
    daemon, kernel = device
    t = _table(daemon)
    space = ctypes.create_string_buffer(SPACE)
    got: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    try:
        worker = threading.Thread(target=lambda: got.append(t.serve(ctypes.addressof(space), SPACE, 50)))
        worker.start()
        while worker.ident is None:
            pass
        threading.Event().wait(0.2)   # (in read(), waiting for a request)
        signal.pthread_kill(worker.ident, signal.SIGUSR1)
        worker.join(10)
        assert got == [-errno.EINTR]
    finally:
        signal.signal(signal.SIGUSR1, previous)
    kernel.shutdown(socket.SHUT_WR)
    assert t.serve(ctypes.addressof(space), SPACE, 0) == 0


def test_several_threads_serve_while_python_changes_the_table(device: Any, tmp_path: Any) -> None:
    """Every request answered once, with the bytes it asks for, by the loop or (once its entry
    has left the table) by Python, while entries come and go."""
    daemon, kernel = device
    t = _answer.Table(daemon.fileno(), 64)
    content = bytes(range(256)) * 64
    shard = tmp_path / "shard"
    shard.write_bytes(content)
    fd = os.open(shard, os.O_RDONLY)
    packed = struct.pack("<QQQQQQIIIIIIIIII", *attr_fields(ATTRS))
    for k in range(16):
        t.add(9, f"f{k}".encode(), 100 + k, packed, *VALID, None, fd, k * 512, 512)
    os.close(fd)   # (the table holds its own descriptor)
    stop = request(LOOKUP, 9, b"stop\0")
    by_python: list[int] = []

    def work() -> None:
        space = ctypes.create_string_buffer(SPACE)
        while True:
            size = t.serve(ctypes.addressof(space), SPACE, 20)
            assert size > 0, size
            raw = space.raw[:size]
            if raw == stop:
                return
            _, opcode, unique, nodeid = struct.unpack_from("<IIQQ", raw)
            k = nodeid - 100
            by_python.append(unique)
            daemon.send(struct.pack("<IiQ", 16 + 512, 0, unique) + content[k * 512:(k + 1) * 512])

    n = 3000
    seen: dict[int, bytes] = {}
    twice: list[int] = []

    def collect() -> None:   # (the answers are read as they come: the device's buffer is small)
        for _ in range(n):
            error, unique, data = _answer_of(kernel)
            if error or unique in seen:
                twice.append(unique)
            seen[unique] = data

    workers = [threading.Thread(target=work) for _ in range(3)] + [threading.Thread(target=collect)]
    for w in workers:
        w.start()
    for u in range(n):
        kernel.send(request(READ, 100 + u % 16, read_in(0, 0, 4096), unique=u + 1))
        if u % 100 == 0:   # entries come and go meanwhile (the f... leave for good)
            for k in range(20):
                t.add(10, f"g{u}-{k}".encode(), 1000 + u * 100 + k, packed, *VALID, b"x", -1, 0, 0)
            t.evicted()
    workers[-1].join(30)
    for _ in range(3):
        kernel.send(stop)
    for w in workers:
        w.join(10)
    assert twice == [] and len(seen) == n
    assert all(seen[u + 1] == content[(u % 16) * 512:(u % 16 + 1) * 512] for u in range(n))
    assert 0 < len(by_python) < n   # both answered some
