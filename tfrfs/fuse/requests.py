"""The low-level requests in the operations' terms: node ids to paths, listings to the kernel's bytes.

libfuse's low-level API names nodes by id; the operations (``tfrfs.fuse.operations``) answer by
path. ``Requests`` turns one into the other through ``inodes.Nodes`` (the names the kernel holds),
counts every id it hands the kernel as a lookup to be forgotten, and packs listings in the
kernel's own layout (``fuse_dirent``, ``fuse_direntplus``) a page at a time. Nothing here knows
libfuse's C side (``tfrfs.fuse.libfuse`` calls these methods and sends their answers) or the
dataset (the operations do).

Caching (read-only mounts): names and attributes are kept by the kernel for ``entry_timeout`` and
``attr_timeout``; opendir is answered "not implemented", which has the kernel cache every
folder's listing (and stop sending opendir and releasedir): a second walk of the tree is
answered by the kernel alone. A writable mount caches nothing (see ``operations.mount``), and
lists a folder from a copy of its names taken when it is read from its start.
"""

from __future__ import annotations

import errno
import itertools
import stat as _stat
import struct
import threading
import time
from array import array
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from tfrfs.errors import NotFound
from tfrfs.fuse.edge import Refused
from tfrfs.fuse.inodes import RECORD_BIT, RECORD_INDEX_BITS, Nodes, RecordRun
from tfrfs.fuse.loop import Conn, End, Entry, Opened, SetAttr

# linux/fuse.h: struct fuse_entry_out (nodeid, generation, entry_valid, attr_valid and their
# nanoseconds), struct fuse_attr (ino, size, blocks, atime, mtime, ctime, their nanoseconds,
# mode, nlink, uid, gid, rdev, blksize, flags), then struct fuse_dirent (ino, off, namelen, type).
FUSE_ATTR = "QQQQQQIIIIIIIIII"   # struct fuse_attr (attr_fields)
_PLUS = struct.Struct("<QQQQII" + FUSE_ATTR + "QQII")
_DIRENT = struct.Struct("<QQII")
# the 8-byte words of a fuse_direntplus that differ between a shard folder's records: the node
# id, the attributes' inode number, the entry's inode number and position, and its name's first
_NODEID, _ATTR_INO, _DIRENT_INO, _DIRENT_OFF, _NAME = 0, 5, 16, 17, 19
_PAD = [bytes(k) for k in range(8)]
_NS = 1_000_000_000
_ENDED_S = 1.0   # how long a read-only folder's end is taken as read (Requests.readdir)
# A folder's first entries are listed with their attributes; past these, names alone (node id
# 0: the kernel asks for one by name when it is used). The kernel keeps a dentry and an inode
# for every entry listed with attributes: for every record of a 100 M-record copy, more than
# this machine's memory, and the kernel's reclaim then costs more than the listing.
FULL_ENTRIES = 10_000


@dataclass
class _FileInfo:
    """What the operations read and set of a request's file: its handle and flags."""

    fh: int = 0
    flags: int = 0
    direct_io: int = 0


def seconds(timeout: float) -> tuple[int, int]:
    """A timeout as the kernel takes it: whole seconds, and nanoseconds."""
    whole = int(timeout)
    return whole, int((timeout - whole) * _NS)


def attr_fields(a: dict[str, int], ino: int, size: int, blocks: int) -> tuple[int, ...]:
    """``struct fuse_attr``'s fields: inode number, size and blocks as given, the rest from the
    stat dict ``a`` (times in nanoseconds), as libfuse converts a stat."""
    mtime = a.get("st_mtime", 0)
    atime, ctime = a.get("st_atime", mtime), a.get("st_ctime", mtime)
    return (ino, size, blocks, atime // _NS, mtime // _NS, ctime // _NS, atime % _NS, mtime % _NS, ctime % _NS,
            a.get("st_mode", 0), a.get("st_nlink", 1), a.get("st_uid", 0), a.get("st_gid", 0), 0,
            a.get("st_blksize", 0), 0)


def attr_of(a: dict[str, int]) -> tuple[int, ...]:
    """``attr_fields`` of a whole stat dict (its own inode number, size and blocks)."""
    return attr_fields(a, a.get("st_ino", 0), a.get("st_size", 0), a.get("st_blocks", 0))


class Requests:
    """Each low-level request, answered with the path-level ``ops``.

    ``writable``: a ``--rw`` mount (nothing cached by the kernel, folders listed from a copy taken
    when read from its start). ``entry_timeout``, ``attr_timeout``, ``negative_timeout``: how long the kernel
    may keep a name, attributes, and the absence of a name (seconds). ``record_path(shard, index,
    binary)``: the path of a record (read-only mounts: records' node ids are their inode numbers).
    """

    def __init__(self, ops: Any, *, writable: bool, entry_timeout: float, attr_timeout: float,
                 negative_timeout: float, record_path: Callable[[int, int, bool], str] | None = None) -> None:
        self.ops = ops
        self.writable = writable
        self.plus = not writable   # listings carry attributes (readdirplus)
        self.local = False         # the source is on this machine (records' files may be answered in C)
        # (nodeid, count) -> how many of the lookups the kernel forgot were counted here: the
        # rest were answered elsewhere (answers.Sheets), whichever way the FORGET came
        self.answered_elsewhere: Callable[[int, int], int] | None = None
        self.nodes = Nodes(record_path=None if writable else record_path)
        self.entry_timeout, self.attr_timeout, self.negative_timeout = entry_timeout, attr_timeout, negative_timeout
        self._valid = seconds(entry_timeout) + seconds(attr_timeout)
        self._listings: dict[int, list[tuple[str, int, int]]] = {}   # a writable mount's open folders
        self._open: dict[int, int] = {}   # a writable mount's node ids with open files: how many
        self._hidden: dict[int, tuple[int, str]] = {}   # open files removed meanwhile: (folder, hidden name)
        self._fhs = itertools.count(1)
        self._ended: dict[int, tuple[int, float]] = {}   # folders just listed to their end: (position, when)
        self._lock = threading.Lock()

    # -- the session -----------------------------------------------------------------

    def init(self, conn: Conn) -> None:
        self.ops.init(conn)

    def destroy(self, end: End | None) -> None:
        self.ops.ended = lambda: end
        self.ops.destroy("/")

    # -- names -----------------------------------------------------------------------

    def _path(self, nodeid: int) -> str:
        return self.nodes.path(nodeid)

    def _entry(self, parent: int, name: str, attrs: dict[str, int]) -> Entry:
        nodeid = self.nodes.looked_up(parent, name, attrs["st_ino"])
        return Entry(nodeid, attrs, self.entry_timeout, self.attr_timeout)

    def lookup(self, parent: int, name: str) -> Entry:
        path = self.nodes.child_path(parent, name)
        try:
            attrs = self.ops.getattr(path)
        except Refused as exc:
            if exc.errno == errno.ENOENT and self.negative_timeout:
                return Entry(0, {}, self.negative_timeout, 0.0)   # the kernel may remember the absence
            raise
        return self._entry(parent, name, attrs)

    def forget(self, nodeid: int, count: int) -> None:
        if self.answered_elsewhere is not None:
            count = self.answered_elsewhere(nodeid, count)
        self.nodes.forget(nodeid, count)

    def forget_many(self, forgets: list[tuple[int, int]]) -> None:
        elsewhere = self.answered_elsewhere
        for nodeid, count in forgets:
            self.nodes.forget(nodeid, count if elsewhere is None else elsewhere(nodeid, count))

    def getattr(self, nodeid: int) -> tuple[dict[str, int], float]:
        return self.ops.getattr(self._path(nodeid)), self.attr_timeout

    # -- listings --------------------------------------------------------------------

    def opendir(self, nodeid: int, flags: int) -> Opened:
        if not self.writable:
            raise Refused(errno.ENOSYS)   # the kernel caches listings, and stops asking (see above)
        self.ops.opendir(self._path(nodeid))
        fh = next(self._fhs)
        with self._lock:
            self._listings[fh] = []
        return Opened(fh)

    def releasedir(self, nodeid: int, fh: int) -> None:
        with self._lock:
            self._listings.pop(fh, None)

    def readdir(self, nodeid: int, size: int, offset: int, fh: int | None, plus: bool) -> bytes:
        """A page of folder ``nodeid``'s listing, of at most ``size`` bytes, from after position ``offset``."""
        listing = self._listings.get(fh) if fh else None   # (a dict read: safe without the lock)
        if fh and listing is not None:
            if offset == 0:   # read from its start (again, after rewinddir): the folder as it is now
                listing = [(name, attrs["st_mode"], attrs["st_ino"])
                           for _, name, attrs in self.ops.readdir(self._path(nodeid), 0, False)]
                with self._lock:
                    self._listings[fh] = listing
            return self._plain_page(listing, size, offset)
        out = bytearray()
        if not plus:
            for item in self.ops.readdir(self._path(nodeid), offset, True):
                if type(item) is RecordRun:
                    if not self._add_run(out, size, item, None):
                        break
                    continue
                position, name, attrs = item
                ino = attrs[1] if type(attrs) is tuple else attrs["st_ino"]
                mode = attrs[0]["st_mode"] if type(attrs) is tuple else attrs["st_mode"]
                if not _add_dirent(out, size, name, ino, position, mode):
                    break
            return bytes(out)
        ended = self._ended.get(nodeid)
        if ended is not None and ended[0] == offset and time.monotonic() - ended[1] < _ENDED_S:
            return b""   # the page before this one was the folder's last (see below)
        valid = self._valid
        last = offset
        for item in self.ops.readdir(self._path(nodeid), offset, True):
            if type(item) is RecordRun:
                if not self._add_run(out, size, item, valid):
                    break
                last = item.stop + 2
            elif not self._add_plus(out, size, nodeid, item[1], item[0], item[2], valid):
                break
            else:
                last = item[0]
        else:
            # The kernel asks once more, from after the last entry, until it gets an empty page:
            # for a record's folders, half the requests of a walk. Answered from this note, if
            # it comes at once (nothing in a read-only mount's folder changes that fast).
            ended_at = self._ended
            if len(ended_at) >= 4096:
                ended_at.clear()
            ended_at[nodeid] = (last, time.monotonic())
        return bytes(out)

    def _add_run(self, out: bytearray, size: int, run: RecordRun, valid: tuple[int, int, int, int] | None) -> bool:
        """Pack the record folders of ``run`` (with their attributes, unless ``valid`` is None) until
        the page is full (False) or the run is done (True): the loop a listing of a billion
        records goes through, so it packs each entry with one call."""
        base = RECORD_BIT | (run.shard << RECORD_INDEX_BITS)
        width = run.width
        dtype = _stat.S_IFMT(run.attrs["st_mode"]) >> 12
        room = size - len(out)
        if valid is None:
            dirent = _DIRENT.pack
            for i in range(run.first, run.stop):
                raw = b"%0*d" % (width, i)
                n = len(raw)
                length = (_DIRENT.size + n + 7) & ~7
                if length > room:
                    return False
                room -= length
                out += dirent(base | (i + 1), i + 3, n, dtype)
                out += raw
                out += _PAD[length - _DIRENT.size - n]
            return True
        # With attributes: every entry of the run is alike but for its number (three fields)
        # and its name, all of one length. The page is made as one entry repeated, and those
        # fields are written down its columns at once: no Python step per record.
        ev, evn, av, avn = valid
        n = width
        pad = (-n) & 7
        length = _PLUS.size + n + pad
        count = min(run.stop - run.first, room // length)
        if count <= 0:
            return run.first >= run.stop
        first, stop = run.first, run.first + count
        entry = _PLUS.pack(0, 0, ev, av, evn, avn, *attr_fields(run.attrs, 0, 0, 0), 0, 0, n, dtype) + bytes(n + pad)
        page = bytearray(entry * count)
        column = memoryview(page).cast("Q")
        every = length // 8
        ids = memoryview(array("Q", range(base + first + 1, base + stop + 1)))
        full = max(0, min(count, FULL_ENTRIES - first))
        if full == count:
            column[_NODEID::every] = ids
        else:   # past the first FULL_ENTRIES: node id 0
            column[_NODEID::every] = memoryview(array("Q", range(base + first + 1, base + first + full + 1))
                                                + array("Q", bytes(8 * (count - full))))
        column[_ATTR_INO::every] = ids
        column[_DIRENT_INO::every] = ids
        column[_DIRENT_OFF::every] = memoryview(array("Q", range(first + 3, stop + 3)))
        names = ((f"%0{n}d" + "\0" * pad) * count % tuple(range(first, stop))).encode("ascii")
        words = (n + pad) // 8
        by_word = memoryview(names).cast("Q")
        for w in range(words):
            column[_NAME + w::every] = by_word[w::words]
        out += page
        return stop == run.stop

    def _plain_page(self, listing: list[tuple[str, int, int]], size: int, offset: int) -> bytes:
        out = bytearray()
        for k in range(offset, len(listing)):
            name, mode, ino = listing[k]
            if not _add_dirent(out, size, name, ino, k + 1, mode):
                break
        return bytes(out)

    def _add_plus(self, out: bytearray, size: int, parent: int, name: str, position: int, attrs: Any,
                  valid: tuple[int, int, int, int]) -> bool:
        raw = name.encode("utf-8", "surrogateescape")
        length = plus_length(raw)
        if len(out) + length > size:
            return False
        if type(attrs) is tuple:
            # A shard's record: the attributes its shard's records share, with its own number and
            # size; its node id is its inode number, kept nowhere (see inodes)
            a, ino, rec_size = attrs
            nodeid = ino if position < FULL_ENTRIES + 3 else 0
            st_size = rec_size or a["st_size"]
            blocks = (st_size + 511) // 512
        else:
            a = attrs
            ino = a["st_ino"]
            st_size, blocks = a.get("st_size", 0), a.get("st_blocks", 0)
            # "." and "..", and an entry listed without its size (its stat fails), go without
            # attributes (node id 0): the kernel asks for them by name
            full = "st_size" in a and name != "." and name != ".." and position < FULL_ENTRIES + 3
            nodeid = self.nodes.looked_up(parent, name, ino) if full else 0
        pack_fields(out, length, raw, nodeid, attr_fields(a, ino, st_size, blocks), position, valid)
        return True

    # -- files -----------------------------------------------------------------------

    def open(self, nodeid: int, flags: int) -> Opened:
        if not self.writable:
            # Read by path: "not implemented" has the kernel stop sending opens and releases
            # (two of the four requests reading a small file would cost), and keep pages cached.
            raise Refused(errno.ENOSYS)
        fi = _FileInfo(flags=flags)
        self.ops.open(self._path(nodeid), fi)
        self._opened(nodeid, 1)
        return Opened(fi.fh, direct_io=bool(fi.direct_io))

    def read(self, nodeid: int, size: int, offset: int, fh: int | None) -> tuple[Any, Any]:
        if not self.writable:
            return self.ops.read_buf(self._path(nodeid), size, offset)
        return None, self.ops.read(self._known_path(nodeid), size, offset, _FileInfo(fh or 0))

    def write(self, nodeid: int, data: bytes, offset: int, fh: int) -> int:
        return self.ops.write(self._known_path(nodeid), data, offset, _FileInfo(fh))

    def flush(self, nodeid: int, fh: int) -> None:
        self._writable_only(errno.ENOSYS)   # (read-only: the kernel stops sending it)
        self.ops.flush(self._known_path(nodeid), _FileInfo(fh))

    def fsync(self, nodeid: int, datasync: int, fh: int) -> None:
        self._writable_only(errno.ENOSYS)
        self.ops.fsync(self._known_path(nodeid), datasync, _FileInfo(fh))

    def release(self, nodeid: int, fh: int) -> None:
        self._writable_only(errno.ENOSYS)
        try:
            self.ops.release(self._known_path(nodeid), _FileInfo(fh))
        finally:
            if self._opened(nodeid, -1) == 0:
                hidden = self._hidden.pop(nodeid, None)
                if hidden is not None:   # removed while open: now it goes
                    self.ops.unlink(self.nodes.child_path(*hidden))
                    self.nodes.unlinked(*hidden)

    def _opened(self, nodeid: int, change: int) -> int:
        with self._lock:
            n = self._open.get(nodeid, 0) + change
            if n > 0:
                self._open[nodeid] = n
            else:
                self._open.pop(nodeid, None)
            return n

    def _writable_only(self, code: int) -> None:
        if not self.writable:
            raise Refused(code)

    def _known_path(self, nodeid: int) -> str:
        """The path of an open file's node, or "" for one removed since (its handle is what counts)."""
        try:
            return self._path(nodeid)
        except NotFound:
            return ""

    def create(self, parent: int, name: str, mode: int, flags: int) -> tuple[Entry, Opened]:
        path = self.nodes.child_path(parent, name)
        fi = _FileInfo(flags=flags)
        self.ops.create(path, mode, fi)
        entry = self._entry(parent, name, self.ops.getattr(path))
        self._opened(entry.nodeid, 1)
        return entry, Opened(fi.fh)

    def setattr(self, nodeid: int, change: SetAttr, fh: int | None) -> tuple[dict[str, int], float]:
        if not self.writable:
            raise Refused(errno.EROFS)
        path = self._path(nodeid)
        ops = self.ops
        if change.size is not None:
            ops.truncate(path, change.size, _FileInfo(fh) if fh is not None else None)
        if change.mode is not None:
            ops.chmod(path, change.mode)
        if change.uid is not None or change.gid is not None:
            ops.chown(path, -1 if change.uid is None else change.uid, -1 if change.gid is None else change.gid)
        if change.atime_ns is not None or change.mtime_ns is not None:
            ops.utimens(path, (change.atime_ns, change.mtime_ns))
        return ops.getattr(path), self.attr_timeout

    # -- changes to folders (writable mounts) ----------------------------------------

    def mkdir(self, parent: int, name: str, mode: int) -> Entry:
        path = self.nodes.child_path(parent, name)
        self.ops.mkdir(path, mode)
        return self._entry(parent, name, self.ops.getattr(path))

    def unlink(self, parent: int, name: str) -> None:
        nodeid = self.nodes.id_of(parent, name)
        if nodeid is not None and nodeid in self._open:
            # Removed while open: as libfuse's high-level API does, it is moved aside under a
            # hidden name, so that its descriptors keep working, and removed at its last close.
            hidden = f".fuse_hidden{nodeid:08x}{next(self._fhs):08x}"
            self.rename(parent, name, parent, hidden, 0)
            self._hidden[nodeid] = (parent, hidden)
            return
        self.ops.unlink(self.nodes.child_path(parent, name))
        self.nodes.unlinked(parent, name)

    def rmdir(self, parent: int, name: str) -> None:
        self.ops.rmdir(self.nodes.child_path(parent, name))
        self.nodes.unlinked(parent, name)

    def rename(self, parent: int, name: str, new_parent: int, new_name: str, flags: int) -> None:
        self.ops.rename(self.nodes.child_path(parent, name), self.nodes.child_path(new_parent, new_name), flags)
        self.nodes.renamed(parent, name, new_parent, new_name)

    # -- the rest --------------------------------------------------------------------

    def statfs(self, nodeid: int) -> dict[str, int]:
        return self.ops.statfs("/")

    def access(self, nodeid: int, mask: int) -> None:
        self.ops.access(self._path(nodeid), mask)

    def getxattr(self, nodeid: int, name: str) -> bytes:
        return self.ops.getxattr(self._path(nodeid), name)

    def listxattr(self, nodeid: int) -> bytes:
        return b"".join(n.encode("utf-8", "surrogateescape") + b"\0" for n in self.ops.listxattr(self._path(nodeid)))

    def setxattr(self, nodeid: int, name: str, value: bytes, flags: int) -> None:
        if not self.writable:
            raise Refused(errno.EROFS)
        self.ops.setxattr(self._path(nodeid), name, value, flags)

    def removexattr(self, nodeid: int, name: str) -> None:
        if not self.writable:
            raise Refused(errno.EROFS)
        self.ops.removexattr(self._path(nodeid), name)


def pack_fields(out: bytearray, length: int, raw: bytes, nodeid: int, fields: tuple[int, ...], position: int,
                valid: tuple[int, int, int, int]) -> None:
    """Add a readdirplus entry of ``length`` bytes (name ``raw``, node id ``nodeid``, ``struct
    fuse_attr`` ``fields``) at the end of ``out``."""
    start = len(out)
    out += bytes(length)
    _PLUS.pack_into(out, start, nodeid, 0, valid[0], valid[2], valid[1], valid[3],
                    *fields, fields[0], position, len(raw), _stat.S_IFMT(fields[9]) >> 12)
    out[start + _PLUS.size:start + _PLUS.size + len(raw)] = raw


def plus_length(raw: bytes) -> int:
    """The length of a readdirplus entry named ``raw``."""
    return _PLUS.size + ((len(raw) + 7) & ~7)


def _add_dirent(out: bytearray, size: int, name: str, ino: int, position: int, mode: int) -> bool:
    raw = name.encode("utf-8", "surrogateescape")
    length = (_DIRENT.size + len(raw) + 7) & ~7
    if len(out) + length > size:
        return False
    start = len(out)
    out += bytes(length)
    _DIRENT.pack_into(out, start, ino, position, len(raw), _stat.S_IFMT(mode) >> 12)
    out[start + _DIRENT.size:start + _DIRENT.size + len(raw)] = raw
    return True


def entries(page: bytes, plus: bool) -> Iterator[tuple[int, str, int, int]]:
    """(node id, name, inode number, position) of each entry of a packed page (for tests)."""
    at = 0
    while at < len(page):
        nodeid = 0
        if plus:
            fields = _PLUS.unpack_from(page, at)
            nodeid, ino, off, namelen = fields[0], fields[22], fields[23], fields[24]
            name_at = at + _PLUS.size
            at = name_at + ((namelen + 7) & ~7)
        else:
            ino, off, namelen, _ = _DIRENT.unpack_from(page, at)
            name_at = at + _DIRENT.size
            at += (_DIRENT.size + namelen + 7) & ~7
        yield nodeid, page[name_at:name_at + namelen].decode("utf-8", "surrogateescape"), ino, off
