"""The kernel's mount table, read in one place (the command line, the benchmark and the tests).

``/proc/self/mountinfo`` lists every mount visible to this process in mount order; a path
mounted over twice shows its last mount. Mount points there are written with space, tab,
newline and backslash as octal escapes (``\\040``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterator

MOUNTINFO = "/proc/self/mountinfo"
TFRFS_FSTYPE = "fuse.tfrfs"


@dataclass(frozen=True)
class MountEntry:
    point: str      # absolute mount point, unescaped
    fstype: str     # e.g. "ext4", "fuse.tfrfs"
    source: str     # what was mounted (for tfrfs: the fsname)


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def entries() -> Iterator[MountEntry]:
    """Every mount, in mount order (nothing if the table cannot be read)."""
    try:
        with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.readlines()
    except OSError:
        return
    for line in lines:
        parts = line.split()
        try:
            sep = parts.index("-")
            yield MountEntry(_unescape(parts[4]), parts[sep + 1], _unescape(parts[sep + 2]))
        except (ValueError, IndexError):
            continue


def _last_fstype(point: str) -> str | None:
    found = None
    for entry in entries():
        if entry.point == point:
            found = entry.fstype
    return found


def fstype_at(path: str | os.PathLike[str]) -> str | None:
    """The type of what is mounted at ``path`` itself (its last mount), or None when nothing is."""
    # Only the folders above ``path`` are resolved at first: resolving ``path`` too would stat it,
    # and a stat of a mount point waits for its daemon, so asking about a hung mount would hang.
    head, tail = os.path.split(os.path.abspath(path))
    target = os.path.join(os.path.realpath(head), tail)
    found = _last_fstype(target)
    if found is None and os.path.islink(target):   # not a mount point: lstat answers at once
        found = _last_fstype(os.path.realpath(target))
    return found


def is_tfrfs_mount(path: str | os.PathLike[str]) -> bool:
    return fstype_at(path) == TFRFS_FSTYPE


def fstype_holding(path: str | os.PathLike[str]) -> str:
    """The type of the file system that holds ``path`` (the longest mount point above it)."""
    target = os.path.realpath(path)
    best, fstype = -1, "?"
    for entry in entries():
        point = entry.point
        if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) >= best:
            best, fstype = len(point), entry.fstype
    return fstype
