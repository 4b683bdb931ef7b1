"""The requests of a read-only mount answered straight from the kernel's bytes, without libfuse.

Walks and small files are a stream of tiny requests: a lookup, a read, a listing page. Through
libfuse each costs a call into C, a callback back into Python and its C structures, and a call
into C again to answer, which was three times the handler's own work. ``Answerer`` reads such a
request's few bytes itself (``linux/fuse.h``: ``fuse_in_header`` and the request's own struct),
asks the same handler (``tfrfs.fuse.requests.Requests``), and writes the answer to the device in
one ``writev``. Every other request (the session's start and end, and all of a writable mount's)
goes to libfuse as before (``libfuse.Session``).

Answers follow the kernel's protocol as libfuse writes them: ``fuse_out_header`` (its length,
minus the errno, the request's id), then ``fuse_entry_out``, ``fuse_attr_out``, the bytes read, or
the listing's page; IOCTL is answered "not a terminal" (ENOTTY). FORGET and BATCH_FORGET are
not answered (the kernel waits for nothing), and neither is INTERRUPT: no request answered here
can be interrupted part way.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import struct
import threading
from typing import Any, Callable

from tfrfs.fuse.answers import Sheets, compiled_table
from tfrfs.fuse.edge import Refused, errno_of
from tfrfs.fuse.requests import FUSE_ATTR, attr_of, seconds

log = logging.getLogger("tfrfs")

LOOKUP, FORGET, GETATTR, READ, READDIR, INTERRUPT, IOCTL, BATCH_FORGET, READDIRPLUS = 1, 2, 3, 15, 28, 36, 39, 42, 44
LARGEST = 4096   # the longest request answered here (a lookup: the header and a name)
# Room for any request as libfuse reads them (the largest: a write of 1 MiB and its header)
REQUEST_SPACE = (1 << 20) + (1 << 13)

_IN = struct.Struct("<IIQQ")          # fuse_in_header: len, opcode, unique, nodeid (then uid, gid, pid, ...)
_IN_SIZE = 40
_OUT = struct.Struct("<IiQ")          # fuse_out_header: len, error, unique
_ENTRY = struct.Struct("<QQQQII" + FUSE_ATTR)       # fuse_entry_out
_ATTR_OUT = struct.Struct("<QII" + FUSE_ATTR)       # fuse_attr_out
_READ_IN = struct.Struct("<QQI")      # fuse_read_in: fh, offset, size (then read_flags, ...)
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_FORGET_ONE = struct.Struct("<QQ")


def answerer(handler: Any, fd: int) -> "Answerer":
    """The answerer of a read-only mount's ``handler`` on device ``fd``: with the compiled table
    (``answers``) for a local source, where it was built."""
    table = compiled_table(fd) if getattr(handler, "local", False) else None
    return Answerer(handler, fd, Sheets(handler, table) if table is not None else None)


class Answerer:
    """Answers the lookups, attributes, reads, listings and forgets of a read-only mount with
    ``handler``, writing to the session's device ``fd``. ``answer(raw)`` is False for a request it
    leaves to libfuse."""

    def __init__(self, handler: Any, fd: int, sheets: Sheets | None = None) -> None:
        self.h, self.fd = handler, fd
        self.sheets = sheets   # records answered in C (``answers``), if there is a table
        self.table = sheets.table if sheets is not None else None
        self._table: dict[int, Callable[[int, int, bytes], None]] = {
            LOOKUP: self._lookup, GETATTR: self._getattr, READ: self._read, READDIR: self._readdir,
            READDIRPLUS: self._readdirplus, FORGET: self._forget, BATCH_FORGET: self._batch_forget,
            INTERRUPT: _ignore, IOCTL: self._ioctl,
        }
        self._timeouts: dict[float, tuple[int, int]] = {}
        self._buffers = threading.local()   # each thread's buffer for bytes read from a file

    def serve(self, spin_us: int, exited: Callable[[], bool], rest: Callable[[int, int], None]) -> int | None:
        """A worker's loop over the compiled table: it reads the device itself and answers what
        the table holds without the GIL (``Table.serve``); what it does not hold is answered
        here, or by ``rest(address, size)`` (libfuse). Returns 0 once the file system is
        unmounted, -errno if reading the device failed, None once ``exited()``. With
        ``spin_us``, the device is watched that long for the next request before read() sleeps."""
        assert self.table is not None
        space = ctypes.create_string_buffer(REQUEST_SPACE)
        address, answer, table = ctypes.addressof(space), self.answer, self.table
        while not exited():
            size = table.serve(address, REQUEST_SPACE, spin_us)
            if size in (-errno.EINTR, -errno.EAGAIN):   # (a signal: Python's handler has run)
                continue
            if size <= 0:
                return int(size)
            if exited():   # (read after the session ended: left, as before the C loop, to the unmount)
                return None
            if size > LARGEST or not answer(ctypes.string_at(address, size)):
                rest(address, size)
        return None

    def answer(self, raw: bytes) -> bool:
        """Answer request ``raw`` (its whole bytes, header first) if it is one of those above."""
        _, opcode, unique, nodeid = _IN.unpack_from(raw)
        fn = self._table.get(opcode)
        if fn is None:
            return False
        try:
            fn(unique, nodeid, raw)
        except Refused as exc:
            self._send(unique, exc.errno or errno.EIO, b"")
        except Exception as exc:   # a bug: logged once (errno_of), answered EIO
            self._send(unique, errno_of(exc, _NAMES.get(opcode, str(opcode)), (nodeid,)), b"")
        return True

    def _send(self, unique: int, error: int, body: bytes | memoryview) -> None:
        size = len(body)
        try:
            if size > 8192:
                os.writev(self.fd, (_OUT.pack(16 + size, -error, unique), body))
            else:
                os.write(self.fd, _OUT.pack(16 + size, -error, unique) + body)
        except OSError as exc:
            # ENOENT: the request was interrupted (or the mount is going), and nobody waits for it
            if exc.errno not in (errno.ENOENT, errno.ENODEV, errno.EBADF):
                log.warning("answering a request failed: %s", os.strerror(exc.errno or errno.EIO))

    def _seconds(self, timeout: float) -> tuple[int, int]:
        found = self._timeouts.get(timeout)
        if found is None:
            found = self._timeouts[timeout] = seconds(timeout)
        return found

    def _lookup(self, unique: int, parent: int, raw: bytes) -> None:
        if self.sheets is not None:   # a record looked into for the first time goes in the table
            self.sheets.looking_into(parent)
            if self.sheets.table.answer(raw):
                return
        end = raw.find(b"\0", _IN_SIZE)
        name = raw[_IN_SIZE:end if end >= 0 else len(raw)].decode("utf-8", "surrogateescape")
        e = self.h.lookup(parent, name)
        ev, evn = self._seconds(e.entry_timeout)
        av, avn = self._seconds(e.attr_timeout)
        fields = attr_of(e.attrs) if e.nodeid else (0,) * 16
        self._send(unique, 0, _ENTRY.pack(e.nodeid, 0, ev, av, evn, avn, *fields))
        if self.sheets is not None and e.nodeid:
            self.sheets.found(e.nodeid, parent)   # (a record's folder: the records after it may go in the table)

    def _getattr(self, unique: int, nodeid: int, raw: bytes) -> None:
        attrs, timeout = self.h.getattr(nodeid)
        av, avn = self._seconds(timeout)
        self._send(unique, 0, _ATTR_OUT.pack(av, avn, 0, *attr_of(attrs)))

    def _read(self, unique: int, nodeid: int, raw: bytes) -> None:
        fh, offset, size = _READ_IN.unpack_from(raw, _IN_SIZE)
        where, data = self.h.read(nodeid, size, offset, fh or None)
        if where is not None:
            fd, pos, count = where
            buf = self._buffer(count)
            data = buf[:os.preadv(fd, (buf[:count],), pos)]
        self._send(unique, 0, data)

    def _buffer(self, size: int) -> memoryview:
        """This thread's buffer of at least ``size`` bytes: a read of a large file (up to 1 MiB at
        a time) costs no new memory for the kernel to hand over and take back."""
        buf: memoryview | None = getattr(self._buffers, "buf", None)
        if buf is None or len(buf) < size:
            buf = self._buffers.buf = memoryview(bytearray(max(size, 1 << 17)))
        return buf

    def _readdir(self, unique: int, nodeid: int, raw: bytes) -> None:
        fh, offset, size = _READ_IN.unpack_from(raw, _IN_SIZE)
        self._send(unique, 0, self.h.readdir(nodeid, size, offset, fh or None, False))

    def _readdirplus(self, unique: int, nodeid: int, raw: bytes) -> None:
        if self.sheets is not None:   # a record listed for the first time goes in the table
            self.sheets.looking_into(nodeid)
            if self.sheets.table.answer(raw):
                return
        fh, offset, size = _READ_IN.unpack_from(raw, _IN_SIZE)
        self._send(unique, 0, self.h.readdir(nodeid, size, offset, fh or None, True))

    def _ioctl(self, unique: int, nodeid: int, raw: bytes) -> None:
        # A file of a mount is no terminal nor anything else ioctl knows: Python's buffered open
        # asks (TCGETS) of every file it opens. Answered here, not by a call through libfuse.
        self._send(unique, errno.ENOTTY, b"")

    def _forget(self, unique: int, nodeid: int, raw: bytes) -> None:
        try:
            self.h.forget(nodeid, _U64.unpack_from(raw, _IN_SIZE)[0])
        except Exception as exc:   # never answered: nothing to tell the kernel
            log.error("internal error in forget", exc_info=exc)

    def _batch_forget(self, unique: int, nodeid: int, raw: bytes) -> None:
        count = _U32.unpack_from(raw, _IN_SIZE)[0]
        start = _IN_SIZE + 8
        count = min(count, (len(raw) - start) // _FORGET_ONE.size)
        try:
            self.h.forget_many([_FORGET_ONE.unpack_from(raw, start + k * _FORGET_ONE.size) for k in range(count)])
        except Exception as exc:
            log.error("internal error in forget", exc_info=exc)


def _ignore(unique: int, nodeid: int, raw: bytes) -> None:
    pass


_NAMES = {LOOKUP: "lookup", GETATTR: "getattr", READ: "read", READDIR: "readdir", READDIRPLUS: "readdirplus"}
