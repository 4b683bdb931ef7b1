"""A record's files answered in C: what the compiled table (``_answer``) holds, and when it is filled.

Reading a record's small files cold costs a lookup and a read each, and answering them in Python
costs more than the kernel's round trip itself; so does walking a record's folders. So when a
read-only mount is first asked for a name inside a record's folder, or for its listing,
``Sheets`` renders the whole record once and hands the table every file and folder in it: its
node id, its attributes, and its bytes (a range of the shard, read with ``pread`` when asked, or
the rendered bytes themselves), and each folder's whole listing (readdirplus, as
``Requests.readdir`` packs it). The kernel's next lookups, attributes, reads and listings of that
record are answered by the table, in C, without Python.

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

import importlib
import logging
import os
import struct
from typing import Any

from tfrfs.fuse.inodes import is_record_ino
from tfrfs.fuse.requests import FUSE_ATTR, attr_of, seconds

log = logging.getLogger("tfrfs")

CAPACITY = 1 << 16       # entries (files and folders of records) the table holds
LARGEST_HELD = 1 << 20   # a rendered file larger than this is read through Python
_FUSE_ATTR = struct.Struct("<" + FUSE_ATTR)


def compiled_table(fd: int) -> Any | None:
    """The compiled table answering on device ``fd``, or None where there is none (not built, or
    ``TFRFS_PURE=1``)."""
    if os.environ.get("TFRFS_PURE"):
        return None
    try:
        compiled = importlib.import_module("tfrfs.fuse._answer")   # (tfrfs/fuse/_answer.c)
    except ImportError:
        return None
    return compiled.Table(fd, CAPACITY)


class Sheets:
    """Fills ``table`` with whole records of ``handler``'s mount (``tfrfs.fuse.requests.Requests``)."""

    def __init__(self, handler: Any, table: Any) -> None:
        self.h, self.table = handler, table
        handler.answered_elsewhere = self.forget   # every FORGET, by libfuse too, asks the table first
        self._done: dict[int, None] = {}   # records put in the table (forgotten in bulk)
        ev = seconds(handler.entry_timeout)
        av = seconds(handler.attr_timeout)
        self._valid = (ev[0], ev[1], av[0], av[1])

    def looking_into(self, parent: int) -> None:
        """A lookup in folder ``parent``: if it is a record's, put the record in the table first."""
        if not is_record_ino(parent) or parent in self._done:
            return
        if len(self._done) >= CAPACITY // 4:
            self._done.clear()
        self._done[parent] = None
        try:
            self._add(parent)
        except Exception as exc:   # (a damaged record: Python answers it, as without the table)
            log.debug("record %x not put in the table: %s", parent, exc)
        self._settle()

    def _add(self, record: int) -> None:
        h, table, valid = self.h, self.table, self._valid
        entries, pages = h.record_sheet(record, LARGEST_HELD)
        for parent, name, nodeid, attrs, where, data in entries:
            packed = _FUSE_ATTR.pack(*attr_of(attrs))
            raw = name.encode("utf-8", "surrogateescape")
            if where is not None:
                fd, offset, length = where
                added = table.add(parent, raw, nodeid, packed, *valid, None, fd, offset, length)
            else:
                added = table.add(parent, raw, nodeid, packed, *valid, data, -1, 0, 0)
            if not added:   # there already (another thread put the record in): give the hold back
                h.nodes.forget(nodeid, 1)
        for nodeid, page, last, named in pages:   # (after the entries they name)
            table.add_page(nodeid, page, last, named)

    def forget(self, nodeid: int, count: int) -> int:
        """The kernel forgot ``count`` lookups of ``nodeid``: those the table did not answer."""
        return count - self.table.forget(nodeid, count)

    def clear(self) -> None:
        """Empty the table (its entries' lookups go back to ``Nodes``)."""
        self.table.clear()
        self._done.clear()
        self._settle()

    def _settle(self) -> None:
        """Entries that left the table: their lookups go back to ``Nodes``, the table's hold goes."""
        nodes = self.h.nodes
        for nodeid, lookups in self.table.evicted():
            nodes.forget(nodeid, 1 - lookups)
