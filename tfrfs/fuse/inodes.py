"""Inode numbers, and the names the kernel holds: what a node id stands for, until it is forgotten.

libfuse's low-level API speaks of node ids, not paths. Every id the daemon hands the kernel (in
a lookup's reply, or an entry of a listing with attributes) is one lookup the kernel will give
back with FORGET. ``Nodes`` keeps, for each id the kernel holds, its parent's id and its name,
and drops it when the kernel has forgotten it: the daemon's memory follows what the kernel holds,
not what it has seen.

A record's folder (or ``.bin``) in a read-only mount needs no entry at all: its id says which
shard and record it is (``record_ino``), and its path is made from that when it is used. Listing
every shard folder of a dataset of a billion records costs the daemon nothing per name.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from tfrfs.errors import NotFound

ROOT = 1                            # the kernel's number for the mount's root (FUSE_ROOT_ID)

_HASH_BITS = (1 << 62) - 1          # inode numbers from a path's hash
RECORD_BIT = 1 << 62                # a record's: this bit, its shard's number, its index + 1
_BIN_BIT = 1 << 63                  # ... and this one for its .bin
RECORD_INDEX_BITS = 34              # bits of the index (records a shard may hold: 2**34 - 1)
_SHARD_MASK = (1 << (62 - RECORD_INDEX_BITS)) - 1


def path_ino(path: str) -> int:
    """A path's inode number: the same for the mount's life, whatever the kernel forgets.

    (cp, rsync and tar compare inode numbers between a stat and an open, and call a file whose
    number changed "replaced while being copied".)
    """
    if path == "/":
        return ROOT
    return (hash(path) & _HASH_BITS) or 2


def record_ino(shard: int, index: int, binary: bool = False) -> int:
    """The inode number of record ``index`` of shard ``shard``: its folder's, or its ``.bin``'s.

    Numbered in record order: cp -r reads a folder's entries in inode order (coreutils sorts
    them so, to spare a disk's seeks), so a shard's records are read in order, and a remote
    shard is read ahead rather than one request per record.
    """
    return RECORD_BIT | (shard << RECORD_INDEX_BITS) | (index + 1) | (_BIN_BIT if binary else 0)


def is_record_ino(ino: int) -> bool:
    return bool(ino & RECORD_BIT)


def record_of(ino: int) -> tuple[int, int, bool]:
    """(shard, index, binary) of a ``record_ino``."""
    return (ino >> RECORD_INDEX_BITS) & _SHARD_MASK, (ino & ((1 << RECORD_INDEX_BITS) - 1)) - 1, bool(ino & _BIN_BIT)


@dataclass(frozen=True)
class RecordRun:
    """Record folders ``first`` to ``stop - 1`` of shard ``shard``, named with ``width`` digits, in a
    listing at positions ``first + 3`` on, each with the attributes ``attrs`` (but for its number):
    how a read-only shard folder's listing hands its records over in bulk."""

    shard: int
    first: int
    stop: int
    width: int
    attrs: dict[str, int]


@dataclass(slots=True)
class _Node:
    parent: int
    name: str | None   # None: unlinked or replaced (its id lives on until forgotten)
    lookups: int = 0
    children: int = 0  # named nodes below it, which keep it (and its path) known


class Nodes:
    """The node ids the kernel holds, each with its parent and name (thread-safe).

    With ``record_path`` (read-only mounts), records' ids are their ``record_ino``s, not kept
    here: ``record_path(shard, index, binary)`` gives the path of one.
    """

    def __init__(self, record_path: Callable[[int, int, bool], str] | None = None) -> None:
        self._nodes: dict[int, _Node] = {ROOT: _Node(0, "", lookups=1 << 62)}
        self._ids: dict[tuple[int, str], int] = {}
        self._next = 2
        self._peak = 0   # the most nodes held since the tables were last made to fit
        self._lock = threading.Lock()
        self._record_path = record_path

    def __len__(self) -> int:
        return len(self._nodes) - 1

    def path(self, nodeid: int) -> str:
        """The path of node ``nodeid`` ("/" for the root). NotFound if it has no name any more."""
        if nodeid == ROOT:
            return "/"
        if nodeid & RECORD_BIT and self._record_path is not None:
            return self._record_path(*record_of(nodeid))
        parts: list[str] = []
        with self._lock:
            nodes = self._nodes
            while nodeid != ROOT:
                if nodeid & RECORD_BIT and self._record_path is not None:
                    break
                node = nodes.get(nodeid)
                if node is None or node.name is None:
                    raise NotFound(f"node {nodeid} has no name any more")
                parts.append(node.name)
                nodeid = node.parent
        parts.reverse()
        if nodeid != ROOT:   # below a record's folder
            return self.path(nodeid) + "/" + "/".join(parts)
        return "/" + "/".join(parts)

    def child_path(self, parent: int, name: str) -> str:
        base = self.path(parent)
        return base + name if base == "/" else base + "/" + name

    def looked_up(self, parent: int, name: str, ino: int) -> int:
        """The id to hand the kernel for entry ``name`` of ``parent`` (whose inode number is
        ``ino``), counted as one lookup the kernel will forget."""
        if ino & RECORD_BIT and self._record_path is not None:
            return ino
        with self._lock:
            return self._count(parent, name)

    def looked_up_all(self, parent: int, entries: list[tuple[str, int]]) -> list[int]:
        """``looked_up`` of every (name, inode number) of ``entries`` in ``parent``, the lock taken
        once (a record's folder put in the compiled table whole: ``answers.Sheets``)."""
        records = self._record_path is not None
        with self._lock:
            return [ino if ino & RECORD_BIT and records else self._count(parent, name) for name, ino in entries]

    def _count(self, parent: int, name: str) -> int:
        """One more lookup of entry ``name`` of ``parent`` (a new id if the kernel holds none). Lock held."""
        key = (parent, name)
        nodeid = self._ids.get(key)
        if nodeid is None:
            nodeid = self._next
            self._next += 1
            self._nodes[nodeid] = _Node(parent, name)
            self._ids[key] = nodeid
            self._peak = max(self._peak, len(self._nodes))
            above = self._nodes.get(parent)
            if above is not None:
                above.children += 1
        self._nodes[nodeid].lookups += 1
        return nodeid

    def forget(self, nodeid: int, count: int) -> None:
        """The kernel forgot ``count`` lookups of ``nodeid``: once it holds none (and no name below
        it), the node goes."""
        if nodeid & RECORD_BIT and self._record_path is not None:
            return
        with self._lock:
            node = self._nodes.get(nodeid)
            if node is None or nodeid == ROOT:
                return
            node.lookups -= count
            self._drop_unused(nodeid, node)
            self._fit()

    def _fit(self) -> None:
        """Give back the memory of names forgotten: a dict keeps its size when entries go, so once
        it holds a quarter of its peak, it is copied into one that fits."""
        if self._peak > 4096 and len(self._nodes) * 4 < self._peak:
            self._nodes = dict(self._nodes)
            self._ids = dict(self._ids)
            self._peak = len(self._nodes)

    def _drop_unused(self, nodeid: int, node: _Node) -> None:
        while node.lookups <= 0 and node.children <= 0 and nodeid != ROOT:
            del self._nodes[nodeid]
            if node.name is not None:
                self._ids.pop((node.parent, node.name), None)
                parent = self._nodes.get(node.parent)
                if parent is None:
                    return
                parent.children -= 1
                nodeid, node = node.parent, parent
            else:
                return

    def id_of(self, parent: int, name: str) -> int | None:
        """The id of entry ``name`` of ``parent``, if the kernel holds one."""
        return self._ids.get((parent, name))   # (a dict read: safe without the lock)

    def unlinked(self, parent: int, name: str) -> None:
        """Entry ``name`` of ``parent`` is gone: its node (if the kernel holds one) has no name."""
        with self._lock:
            self._unname(parent, name)

    def _unname(self, parent: int, name: str) -> None:
        nodeid = self._ids.pop((parent, name), None)
        if nodeid is None:
            return
        node = self._nodes[nodeid]
        node.name = None
        above = self._nodes.get(parent)
        if above is not None:
            above.children -= 1
            self._drop_unused(parent, above)
        self._drop_unused(nodeid, node)

    def renamed(self, parent: int, name: str, new_parent: int, new_name: str) -> None:
        """Entry ``name`` of ``parent`` is now ``new_name`` of ``new_parent`` (replacing what was there)."""
        with self._lock:
            self._unname(new_parent, new_name)
            nodeid = self._ids.pop((parent, name), None)
            if nodeid is None:
                return
            node = self._nodes[nodeid]
            node.parent, node.name = new_parent, new_name
            self._ids[(new_parent, new_name)] = nodeid
            if parent != new_parent:
                old, new = self._nodes.get(parent), self._nodes.get(new_parent)
                if new is not None:
                    new.children += 1
                if old is not None:
                    old.children -= 1
                    self._drop_unused(parent, old)


__all__ = ["Nodes", "RecordRun", "ROOT", "RECORD_BIT", "is_record_ino", "path_ino", "record_ino", "record_of"]
