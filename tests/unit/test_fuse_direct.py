"""Requests answered from the kernel's bytes (``tfrfs.fuse.direct``), without a mount: each request
is laid out by hand as linux/fuse.h has it, and each answer read back from a pipe standing in for
the device and taken apart the same way."""

from __future__ import annotations

import errno
import os
import struct
from typing import Any, Iterator

import pytest

from tfrfs.fuse import direct
from tfrfs.fuse.edge import Refused
from tfrfs.fuse.loop import Entry

NS = 1_000_000_000
ATTRS = {"st_ino": 77, "st_size": 5718, "st_blocks": 12, "st_mode": 0o100444, "st_nlink": 1, "st_uid": 1000,
         "st_gid": 100, "st_blksize": 4096, "st_mtime": 1_700_000_000 * NS + 5, "st_atime": 1_600_000_000 * NS,
         "st_ctime": 1_650_000_000 * NS + 9}


def request(opcode: int, nodeid: int, body: bytes, unique: int = 42) -> bytes:
    # fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
    return struct.pack("<IIQQIIIHH", 40 + len(body), opcode, unique, nodeid, 0, 0, 1234, 0, 0) + body


def read_in(fh: int, offset: int, size: int) -> bytes:
    # fuse_read_in: fh, offset, size, read_flags, lock_owner, flags, padding
    return struct.pack("<QQIIQII", fh, offset, size, 0, 0, 0, 0)


class Handler:
    """What the answerer asks: canned answers, and the calls it made."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail: BaseException | None = None

    def _call(self, *args: Any) -> None:
        self.calls.append(args)
        if self.fail is not None:
            raise self.fail

    def lookup(self, parent: int, name: str) -> Entry:
        self._call("lookup", parent, name)
        if name == "missing":
            return Entry(0, {}, 60.0, 0.0)
        return Entry(1001, ATTRS, 86400.0, 1.5)

    def getattr(self, nodeid: int) -> tuple[dict[str, int], float]:
        self._call("getattr", nodeid)
        return ATTRS, 86400.0

    def read(self, nodeid: int, size: int, offset: int, fh: int | None) -> tuple[Any, Any]:
        self._call("read", nodeid, size, offset, fh)
        return None, b"0123456789"[offset:offset + size]

    def readdir(self, nodeid: int, size: int, offset: int, fh: int | None, plus: bool) -> bytes:
        self._call("readdir", nodeid, size, offset, fh, plus)
        return b"page"

    def forget(self, nodeid: int, count: int) -> None:
        self._call("forget", nodeid, count)

    def forget_many(self, forgets: list[tuple[int, int]]) -> None:
        self._call("forget_many", forgets)


@pytest.fixture()
def device() -> Iterator[tuple[int, int]]:
    r, w = os.pipe2(os.O_NONBLOCK)
    yield r, w
    os.close(r)
    os.close(w)


def answers(r: int) -> list[tuple[int, int, bytes]]:
    """(error, unique, body) of every answer written so far."""
    try:
        data = os.read(r, 1 << 20)
    except BlockingIOError:
        return []
    out = []
    while data:
        length, error, unique = struct.unpack_from("<IiQ", data)
        out.append((error, unique, data[16:length]))
        data = data[length:]
    return out


def attr_fields(a: dict[str, int]) -> tuple[int, ...]:
    """fuse_attr, as the kernel reads it."""
    return (a["st_ino"], a["st_size"], a["st_blocks"], a["st_atime"] // NS, a["st_mtime"] // NS, a["st_ctime"] // NS,
            a["st_atime"] % NS, a["st_mtime"] % NS, a["st_ctime"] % NS, a["st_mode"], a["st_nlink"], a["st_uid"],
            a["st_gid"], 0, a["st_blksize"], 0)


def test_a_lookup_answers_fuse_entry_out(device: tuple[int, int]) -> None:
    r, w = device
    h = Handler()
    assert direct.Answerer(h, w).answer(request(direct.LOOKUP, 5, "épreuve.json".encode() + b"\0"))
    assert h.calls == [("lookup", 5, "épreuve.json")]
    [(error, unique, body)] = answers(r)
    assert (error, unique, len(body)) == (0, 42, 128)
    nodeid, generation, entry_valid, attr_valid, entry_nsec, attr_nsec = struct.unpack_from("<QQQQII", body)
    assert (nodeid, generation, entry_valid, attr_valid, entry_nsec, attr_nsec) == (1001, 0, 86400, 1, 0, NS // 2)
    assert struct.unpack_from("<QQQQQQIIIIIIIIII", body, 40) == attr_fields(ATTRS)


def test_a_missing_name_is_an_entry_without_a_node(device: tuple[int, int]) -> None:
    """As libfuse answers it: node 0, kept by the kernel for the negative timeout."""
    r, w = device
    direct.Answerer(Handler(), w).answer(request(direct.LOOKUP, 1, b"missing\0"))
    [(error, _, body)] = answers(r)
    assert error == 0
    assert struct.unpack_from("<QQQQ", body) == (0, 0, 60, 0)
    assert body[40:] == bytes(88)


def test_getattr_answers_fuse_attr_out(device: tuple[int, int]) -> None:
    r, w = device
    direct.Answerer(Handler(), w).answer(request(direct.GETATTR, 9, struct.pack("<IIQ", 0, 0, 0)))
    [(error, _, body)] = answers(r)
    assert (error, len(body)) == (0, 104)
    assert struct.unpack_from("<QII", body) == (86400, 0, 0)
    assert struct.unpack_from("<QQQQQQIIIIIIIIII", body, 16) == attr_fields(ATTRS)


def test_reads_from_memory_and_from_a_file(device: tuple[int, int], tmp_path: Any) -> None:
    r, w = device
    h = Handler()
    a = direct.Answerer(h, w)
    a.answer(request(direct.READ, 9, read_in(0, 3, 4), unique=1))
    shard = tmp_path / "shard"
    shard.write_bytes(b"header" + b"x" * 20000 + b"trailer")
    with open(shard, "rb") as f:
        h.read = lambda nodeid, size, offset, fh: ((f.fileno(), 6 + offset, size), b"")   # type: ignore[method-assign]
        a.answer(request(direct.READ, 9, read_in(0, 10, 20000), unique=2))
    got = answers(r)
    assert got[0] == (0, 1, b"3456")
    assert got[1] == (0, 2, b"x" * 19990 + b"trailer"[:10])
    assert h.calls == [("read", 9, 4, 3, None)]


def test_listings_pass_the_page_through(device: tuple[int, int]) -> None:
    r, w = device
    h = Handler()
    a = direct.Answerer(h, w)
    a.answer(request(direct.READDIRPLUS, 3, read_in(0, 7, 4096)))
    a.answer(request(direct.READDIR, 3, read_in(5, 0, 4096)))
    assert [body for _, _, body in answers(r)] == [b"page", b"page"]
    assert h.calls == [("readdir", 3, 4096, 7, None, True), ("readdir", 3, 4096, 0, 5, False)]


def test_forgets_are_not_answered(device: tuple[int, int]) -> None:
    r, w = device
    h = Handler()
    a = direct.Answerer(h, w)
    a.answer(request(direct.FORGET, 12, struct.pack("<Q", 3)))
    a.answer(request(direct.BATCH_FORGET, 0, struct.pack("<II", 2, 0) + struct.pack("<QQQQ", 12, 1, 13, 4)))
    a.answer(request(direct.INTERRUPT, 0, struct.pack("<Q", 41)))
    assert answers(r) == []
    assert h.calls == [("forget", 12, 3), ("forget_many", [(12, 1), (13, 4)])]


def test_an_ioctl_is_not_a_terminals(device: tuple[int, int]) -> None:
    """Python's buffered open asks every file whether it is a terminal (TCGETS): not here."""
    r, w = device
    h = Handler()
    fuse_ioctl_in = struct.pack("<QIIQII", 0, 0, 0x5401, 0, 0, 60)   # fh, flags, cmd, arg, in_size, out_size
    assert direct.Answerer(h, w).answer(request(direct.IOCTL, 9, fuse_ioctl_in, unique=5))
    assert answers(r) == [(-errno.ENOTTY, 5, b"")] and h.calls == []


def test_other_requests_are_left_to_libfuse(device: tuple[int, int]) -> None:
    r, w = device
    h = Handler()
    assert not direct.Answerer(h, w).answer(request(14, 9, struct.pack("<II", os.O_RDONLY, 0)))   # FUSE_OPEN
    assert answers(r) == [] and h.calls == []


@pytest.mark.parametrize(("fail", "code"), [(Refused(errno.ENOENT), errno.ENOENT),
                                            (RuntimeError("a bug"), errno.EIO)])
def test_a_refusal_or_a_bug_is_an_error_answer(device: tuple[int, int], fail: BaseException, code: int) -> None:
    r, w = device
    h = Handler()
    h.fail = fail
    direct.Answerer(h, w).answer(request(direct.GETATTR, 9, struct.pack("<IIQ", 0, 0, 0), unique=8))
    assert answers(r) == [(-code, 8, b"")]
