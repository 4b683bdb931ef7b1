"""What a mount's daemon notes about itself, so that ``tfrfs status MOUNTPOINT`` can name the
source of a mount whose daemon is gone.

A dead FUSE daemon leaves its mount point in the kernel's table ("Transport endpoint is not
connected"), and the table says nothing reliable about the source (the file system's name is
whatever ``fsname=`` said). So each daemon writes a small JSON file per mount point in the user's
cache folder, ``CACHE/mounts/NAME-HASH.json`` (``default_cache_dir()``, whatever ``--cache-dir``
says, so that a later command finds it without being told), and removes it when it ends. A
record is believed only while the kernel still lists the mount point as tfrfs's, and its process
is told alive or gone by ``/proc``; a stale record is replaced by the next mount there, and
records of processes that are gone and whose mount point the kernel no longer lists are removed
whenever a record is written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from tfrfs.index.cache_dir import default_cache_dir
from tfrfs.fuse.mounttab import TFRFS_FSTYPE, fstype_at

log = logging.getLogger("tfrfs")


@dataclass(frozen=True)
class MountRecord:
    mountpoint: str
    source: str       # as given to tfrfs mount, made absolute when local
    root: str         # the folder the source's staged edits live in
    writable: bool
    pid: int


def _point(mountpoint: str) -> str:
    # The folders above are resolved, the mount point itself is not: a stat of a dead mount fails,
    # and one of a hung mount waits for its daemon (as mounttab.fstype_at does).
    head, tail = os.path.split(os.path.abspath(mountpoint))
    return os.path.join(os.path.realpath(head), tail)


def _path(mountpoint: str, base: Path | None = None) -> Path:
    point = _point(mountpoint)
    tag = hashlib.sha256(point.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return (base or default_cache_dir()) / "mounts" / f"{os.path.basename(point) or 'root'}-{tag}.json"


def write(record: MountRecord, base: Path | None = None) -> None:
    """Note a mount (a failure is logged: only messages depend on it)."""
    path = _path(record.mountpoint, base)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(asdict(record) | {"mountpoint": _point(record.mountpoint)}))
        os.replace(tmp, path)   # no fsync: a record lost in a crash only costs a message
    except OSError as exc:
        log.warning("could not note this mount in %s (tfrfs status cannot name its source if this "
                    "daemon dies): %s", path, exc)
        return
    _prune(path.parent, keep=path)


def _prune(folder: Path, keep: Path) -> None:
    """Remove the records left by daemons that died and whose dead mounts are detached since."""
    try:
        for other in folder.glob("*.json"):
            if other == keep:
                continue
            try:
                doc = json.loads(other.read_bytes())
                stale = not alive(int(doc["pid"])) and fstype_at(str(doc["mountpoint"])) != TFRFS_FSTYPE
            except (OSError, ValueError, KeyError, TypeError):
                stale = True
            if stale:
                other.unlink(missing_ok=True)
    except OSError as exc:   # tidying only
        log.debug("could not remove old mount records in %s: %s", folder, exc)


def read(mountpoint: str, base: Path | None = None) -> MountRecord | None:
    """The record of the last mount at ``mountpoint``, if one is there."""
    try:
        doc = json.loads(_path(mountpoint, base).read_bytes())
        record = MountRecord(str(doc["mountpoint"]), str(doc["source"]), str(doc["root"]),
                             bool(doc["writable"]), int(doc["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if record.mountpoint == _point(mountpoint) else None


def remove(mountpoint: str, pid: int, base: Path | None = None) -> None:
    """Forget the record of ``mountpoint`` if process ``pid`` wrote it."""
    record = read(mountpoint, base)
    if record is not None and record.pid == pid:
        try:
            os.unlink(_path(mountpoint, base))
        except OSError:
            pass
        write_busy(mountpoint, None, base)


def _busy_path(mountpoint: str, base: Path | None = None) -> Path:
    return _path(mountpoint, base).with_suffix(".busy")


def write_busy(mountpoint: str, doc: dict | None, base: Path | None = None) -> None:
    """Note the request the daemon has been busy with for long (``watchdog``), or (None) that
    none is: read by ``tfrfs status`` without asking the mount, which may not answer meanwhile."""
    path = _busy_path(mountpoint, base)
    try:
        if doc is None:
            path.unlink(missing_ok=True)
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("could not note the request this daemon is busy with in %s: %s", path, exc)


def read_busy(mountpoint: str, base: Path | None = None) -> dict | None:
    """The request the daemon at ``mountpoint`` has been busy with for long, if its process still
    runs: ``{"op", "path", "since" (epoch seconds), "pid"}``."""
    try:
        doc = json.loads(_busy_path(mountpoint, base).read_bytes())
        if not isinstance(doc, dict) or not alive(int(doc["pid"])):
            return None
        float(doc["since"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return doc


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie has closed its files and its mount: not alive)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return not any(line.split()[1:2] == ["Z"] for line in status.splitlines() if line.startswith("State:"))
