"""A record's files answered in C: what the compiled table (``_answer``) holds, and when it is filled.

Reading a record's small files cold costs a lookup and a read each, and answering them in Python
costs more than the kernel's round trip itself; so does walking a record's folders. So when a
read-only mount is first asked for a name inside a record's folder, or for its listing,
``Sheets`` renders the whole record once and hands the table every file and folder in it: its
node id, its attributes, and its bytes (a range of the shard, read with ``pread`` when asked, or
the rendered bytes themselves), and each folder's whole listing (readdirplus, packed in C, as
``Requests.readdir`` packs it). The kernel's next lookups, attributes, reads and listings of that
record are answered by the table, in C, without Python.

Looking ahead: a reader going through a shard in order (``cat``, ``cp -r``, ``find``, a training
loop) asks for record after record. Once a record is looked into, or its folder looked up, right
after the one before it went in the table (among the last ``RECENT`` records put there), the next
``AHEAD`` records are put in the table by a thread of their own, while the reader is answered in
C: the reader then finds them there, and the render no longer sits between its requests. Those
records' folders are looked up in C too, but one in ``CUE``, whose lookup by Python looks further.
A reader in a shuffled order (a training loop's sampler) does not set it off, however many records
it has read: reading ahead of it would read records it does not ask for next.

Counting: each node put in the table is one lookup held by the table (``Nodes.looked_up``), so
the daemon keeps its name for as long as the table may hand it out; the lookups the table answers
(a listing's entries each count as one) are counted there, and every FORGET, however it comes
(``Requests.answered_elsewhere``), takes those first. An entry that leaves the table (the oldest
goes when it is full) gives its lookups back to ``Nodes`` and its hold up.

Only local, read-only mounts use it (a bucket's bytes would be fetched for every file of a record
when one is read), and only where the extension was built: otherwise, or with ``TFRFS_PURE=1``,
``direct.Answerer`` answers every request in Python with the same bytes.
"""

from __future__ import annotations

import logging
import posixpath
import struct
import threading
from typing import Any

from tfrfs.format.compiled import optional
from tfrfs.fuse.inodes import is_record_ino, path_ino, record_of
from tfrfs.fuse.requests import FUSE_ATTR, attr_of, seconds

log = logging.getLogger("tfrfs")

CAPACITY = 1 << 16       # entries (files and folders of records) the table holds
LARGEST_HELD = 1 << 20   # a rendered file larger than this is read through Python
AHEAD = 32               # records put in the table ahead of a reader going through a shard in order
AHEAD_IDLE_S = 1.0       # the thread that does it ends once none was asked for this long
CUE = 8                  # one record folder in this many is looked up by Python (see Sheets.found)
RECENT = 4 * AHEAD       # records put in the table last: one of them followed by the next is in order
_FUSE_ATTR = struct.Struct("<" + FUSE_ATTR)


def compiled_table(fd: int) -> Any | None:
    """The compiled table answering on device ``fd``, or None where there is none (not built, or
    ``TFRFS_PURE=1``)."""
    compiled = optional("tfrfs.fuse._answer")   # (tfrfs/fuse/_answer.c)
    return None if compiled is None else compiled.Table(fd, CAPACITY)


class Sheets:
    """Fills ``table`` with whole records of ``handler``'s mount (``tfrfs.fuse.requests.Requests``)."""

    def __init__(self, handler: Any, table: Any) -> None:
        self.h, self.table = handler, table
        handler.answered_elsewhere = self.forget   # every FORGET, by libfuse too, asks the table first
        self._done: dict[int, None] = {}   # records put in the table (forgotten in bulk)
        self._recent: dict[int, None] = {}   # the last RECENT of them, oldest first
        self._ahead: dict[int, None] = {}  # records to put in the table next, in order
        self._ahead_changed = threading.Condition()
        self._ahead_thread: threading.Thread | None = None
        self._shard_folders: dict[int, int] = {}   # a shard's number -> its folder's node id
        ev = seconds(handler.entry_timeout)
        av = seconds(handler.attr_timeout)
        self._valid = (ev[0], ev[1], av[0], av[1])

    def looking_into(self, parent: int) -> None:
        """A lookup or listing in folder ``parent``: if it is a record's, put the record in the
        table first, and look ahead (``_look_ahead``)."""
        if not is_record_ino(parent) or parent in self._done:
            return
        self._put(parent)
        self._look_ahead(parent, 1)

    def found(self, record: int, parent: int) -> None:
        """Record folder ``record`` was looked up by name in folder ``parent`` (answered by
        Python): look ahead from it. The records put in the table from now on hold their folder's
        own entry in ``parent`` too, but one in ``CUE``: its lookup, left to Python, is the cue
        to look further ahead."""
        if is_record_ino(record) and not record_of(record)[2]:
            self._shard_folders[record_of(record)[0]] = parent
            self._look_ahead(record, 0)

    def _look_ahead(self, record: int, first: int) -> None:
        """If the record before ``record`` went in the table lately (``RECENT``), a reader goes
        through the shard in order: the records from ``first`` after ``record`` on, ``AHEAD`` of them, are put in the
        table by a thread of their own while the reader reads (``_run_ahead``)."""
        shard, index, _ = record_of(record)
        if index == 0 or record - 1 not in self._recent:   # (a shard's records' ids follow each other)
            return
        stop = min(index + first + AHEAD, self.h.ops.records_in(shard))
        with self._ahead_changed:
            for r in range(record + first, record + stop - index):
                if r not in self._done:
                    self._ahead[r] = None
            if self._ahead and self._ahead_thread is None:
                self._ahead_thread = threading.Thread(target=self._run_ahead, name="tfrfs-ahead", daemon=True)
                self._ahead_thread.start()
            self._ahead_changed.notify()

    def _run_ahead(self) -> None:
        while True:
            with self._ahead_changed:
                if not self._ahead_changed.wait_for(lambda: bool(self._ahead), AHEAD_IDLE_S):
                    self._ahead_thread = None
                    return
                record = next(iter(self._ahead))
                del self._ahead[record]
            if record not in self._done:
                self._put(record)

    def _put(self, record: int) -> None:
        if len(self._done) >= CAPACITY // 4:
            self._done.clear()
        self._done[record] = None
        recent = self._recent
        recent[record] = None
        if len(recent) > RECENT:   # (another thread may have taken the oldest already)
            recent.pop(next(iter(recent)), None)
        try:
            self._add(record)
        except Exception as exc:   # (a damaged record: Python answers it, as without the table)
            log.debug("record %x not put in the table: %s", record, exc)
        self._settle()

    def _add(self, record: int) -> None:
        h, table, valid = self.h, self.table, self._valid
        folders = self.sheet(record)
        shard, index, _ = record_of(record)
        folder = self._shard_folders.get(shard)
        if folder is not None and index % CUE:   # (first: its listing, below, goes with it)
            path = h.nodes.path(record)
            packed = _FUSE_ATTR.pack(*attr_of(h.ops.getattr(path)))
            table.add(folder, posixpath.basename(path).encode(), record, packed, *valid, None, -1, 0, 0)
        forget = h.nodes.forget
        for nodeid, dot, dotdot, rows in folders:
            for left in table.add_folder(nodeid, dot, dotdot, rows, valid):
                forget(left, 1)   # there already (another thread put the record in): the hold goes back

    def sheet(self, record: int) -> list[tuple[int, int, int, list[tuple[Any, ...]]]]:
        """Every folder inside record folder ``record``, the record's own first, as the table's
        ``add_folder`` takes it: (its node id, its inode number and its parent's, for "." and
        "..", its entries), each entry (position, name, node id, inode number, mode, size,
        blocks, time in ns, links, uid, gid, block size, bytes, descriptor, offset, length) and
        counted as one lookup (the table holds it). The bytes, or the range of an open file, are
        what ``Requests.read`` gives for the whole file (neither for a folder, nor for a file
        larger than ``LARGEST_HELD``)."""
        held: list[int] = []
        try:
            return self._sheet(record, held)
        except BaseException:   # (a damaged record, say): the lookups counted so far go back
            for nodeid in held:
                self.h.nodes.forget(nodeid, 1)
            raise

    def _sheet(self, record: int, held: list[int]) -> list[tuple[int, int, int, list[tuple[Any, ...]]]]:
        ops, looked_up_all = self.h.ops, self.h.nodes.looked_up_all
        uid, gid, blksize = ops.owned
        folders: list[tuple[int, int, int, list[tuple[Any, ...]]]] = []
        start = self.h.nodes.path(record)
        ids = {start: record}   # the node ids of the folders listed next
        for path, listed in ops.record_folders(start, LARGEST_HELD):
            parent = ids.pop(path)
            rows: list[tuple[Any, ...]] = []
            nodeids = looked_up_all(parent, [(entry[1], entry[2]) for entry in listed])
            held += nodeids
            for (position, name, ino, mode, size, blocks, mtime, nlink, node, where, data), nodeid in zip(listed,
                                                                                                       nodeids):
                fd, offset, length = -1, 0, 0
                if node.folder:
                    ids[path + "/" + name] = nodeid
                elif where is not None:
                    (fd, offset, length), data = where, None
                rows.append((position, name.encode("utf-8", "surrogateescape"), nodeid, ino, mode, size, blocks,
                             mtime, nlink, uid, gid, blksize, data, fd, offset, length))
            folders.append((parent, path_ino(path), path_ino(posixpath.dirname(path)), rows))
        return folders

    def forget(self, nodeid: int, count: int) -> int:
        """The kernel forgot ``count`` lookups of ``nodeid``: those the table did not answer."""
        return count - self.table.forget(nodeid, count)

    def clear(self) -> None:
        """Empty the table (its entries' lookups go back to ``Nodes``)."""
        self.table.clear()
        self._done.clear()
        self._recent.clear()
        self._settle()

    def _settle(self) -> None:
        """Entries that left the table: their lookups go back to ``Nodes``, the table's hold goes."""
        nodes = self.h.nodes
        for nodeid, lookups in self.table.evicted():
            nodes.forget(nodeid, 1 - lookups)
