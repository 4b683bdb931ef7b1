"""A new dataset published into DEST whole or not at all (``tfrfs reshard``, ``tfrfs.ray.write``).

Jobs (in any process, on any node) write the new shards and their index files, each job's
figures going into a small receipt. The driver checks every receipt against what is there (sizes,
identities, counts), then publishes:

- DEST in a storage whose folders rename (a local folder): the jobs write into a temporary folder beside it (same parent, named
  ``.tfrfs-commit-reshard-NAME``: a mount of the parent never shows it); every file is fsynced;
  the driver writes the manifest (and TFDS metadata) into it and renames the folder into place.
  DEST must not exist or be an empty folder. The receipts (and the plan they belong to) ride
  along in one hidden sub-folder and are removed after the rename.
- DEST elsewhere (a bucket prefix: nothing renames atomically there): a marker object first
  (``.tfrfs-commit-reshard``, naming the plan), the shards and index files at their final
  names, the manifest last, then the receipts and the marker are removed. A prefix holding the
  marker and no manifest is an unfinished reshard (``sources.unfinished_reshard``).

Running the same command again finds its plan (the temporary folder's, the marker's) and reuses
every job whose receipt still matches what is there; a different plan starts afresh. Every durable
step goes through the storage (``tfrfs.storage``), and so through ``durable``'s fault hook,
where the crash tests kill the driver.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any, BinaryIO

import crc32c

from tfrfs.errors import UsageError
from tfrfs.index.idxfile import SUFFIX
from tfrfs.index.discovery import RESHARD_MARKER, TMP_PREFIX
from tfrfs.index.manifest import NAME as MANIFEST
from tfrfs.storage.base import Location, Storage, Writing
from tfrfs.storage.factory import locate

WORK_PREFIX = TMP_PREFIX + "reshard-"   # the temporary folder beside a DEST whose folders rename
MARKER = RESHARD_MARKER                  # a "being written" object in a DEST that has no folders to rename
RECEIPTS = TMP_PREFIX + "receipts"       # jobs' receipts, and the plan (staged: inside the work folder)
PLAN = "plan.json"


@dataclass(frozen=True)
class Dest(Location):
    """DEST as the user named it (an absolute folder path or a URL) and its store options: small
    and picklable, for the jobs that write into it.

    Where the storage renames folders (a local file system) the dataset is written into a work
    folder beside DEST and renamed into place (``staged``); elsewhere (a bucket) it is written at
    its final names, a marker first and the manifest last."""

    @classmethod
    def of(cls, dest: str, options: dict[str, Any] | None = None) -> "Dest":
        where = locate(dest, options)
        return cls(where.root, where.options)

    @property
    def staged(self) -> bool:
        return self.storage().renames_atomically

    @cached_property
    def work(self) -> str:
        """Where the jobs write: the temporary folder beside a staged DEST, else DEST itself."""
        if not self.staged:
            return self.root
        parent, name = self.storage().split(self.root)
        return self.storage().join(parent, WORK_PREFIX + name)

    def path(self, name: str) -> str:
        return self.storage().join(self.work, name)

    def local_path(self, name: str) -> str | None:
        """The local file that holds ``name``, where there is one (to read back what was written)."""
        return self.storage().local_path(self.path(name))

    # -- what a job does -------------------------------------------------------------------

    def create(self, name: str) -> tuple[BinaryIO, int | None]:
        """A new file ``name`` to stream into (and its descriptor, when local)."""
        writing = self.storage().create(self.path(name))
        return writing.file, writing.fd

    def finished(self, name: str, f: BinaryIO, fd: int | None) -> tuple[int, str, int]:
        """Close what ``create`` gave: (size, identity, mtime_ns) of the file written. A staged
        file is made durable with all the others before publishing (``publish``: one ``syncfs``,
        not an fsync per file)."""
        got = self.storage().finish(self.path(name), Writing(f, fd))
        return got.size, got.identity, got.mtime_ns

    def write_bytes(self, name: str, data: bytes, *, sync: bool = True) -> tuple[int, str, int]:
        """Write a small file whole: its (size, identity, mtime_ns). ``sync=False`` (what jobs
        write): made durable with the rest before publishing; a staged file is written in place,
        in the work folder, and one cut short by a crash fails its checksum in the receipt's
        check (or the receipt does not parse), and the job is done again."""
        path = self.path(name)
        storage = self.storage()
        storage.write(path, data, sync=sync)
        got = storage.stat(path, fresh=False)
        if got is None:
            raise OSError(f"{path}: not there after it was written")
        return got.size, got.identity, got.mtime_ns

    def read_bytes(self, name: str) -> bytes | None:
        try:
            return self.storage().read(self.path(name))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def stat(self, name: str) -> tuple[int, str] | None:
        """(size, identity) of a file written, or None."""
        got = self.storage().stat(self.path(name), fresh=False)
        return (got.size, got.identity) if got is not None else None

    def receipt(self, bodies: list[dict]) -> None:
        """A finished job's figures, one body per new shard it wrote, numbered in order (``n``):
        one file for them all, ``FIRST-LAST.json``, written after the shards' files (staged, not
        yet durable: a rerun after a crash checks the files' checksums before it trusts one)."""
        first, last = bodies[0]["n"], bodies[-1]["n"]
        name = f"{first:06d}.json" if first == last else f"{first:06d}-{last:06d}.json"
        self.write_bytes(f"{RECEIPTS}/{name}", json.dumps(bodies, sort_keys=True).encode(), sync=False)


# --- the driver ---------------------------------------------------------------------------------

def manifest_key(data: bytes) -> str | None:
    """The plan a manifest's dataset was published for (``made_by``), if any."""
    try:
        body = json.loads(data)
        got = body.get("made_by") if isinstance(body, dict) else None
        return str(got) if got is not None else None
    except ValueError:
        return None


def _names(dest: Dest) -> list[str] | None:
    """What DEST holds: a staged DEST's names (None when there is no such folder), or every
    object under a prefix, relative to it."""
    storage = dest.storage()
    if not dest.staged:
        return [e.name for e in storage.list(dest.root, recursive=True) or []]
    got = storage.stat(dest.root)
    if got is not None and not got.is_dir:
        raise UsageError(f"{dest.root}: DEST is a file; give a folder that does not exist yet (or is empty)")
    found = storage.list(dest.root) if got is not None else None
    return [e.name for e in found] if found is not None else None


def already_published(dest: Dest, key: str) -> bool:
    """Whether DEST holds this very plan's dataset, complete (the manifest names the plan). Raises
    UsageError when DEST holds anything else (a non-empty folder or prefix)."""
    names = _names(dest)
    if not names:
        return False
    data = _read_final(dest, MANIFEST)
    if data is not None and manifest_key(data) == key:
        return True
    if not dest.staged and set(names) <= _ours(dest, names, key):
        return False   # an unfinished run of this plan: finished now
    if not dest.staged and MARKER in names and data is None:
        raise UsageError(f"{dest.root}: holds an unfinished reshard of another source or other options: "
                         "delete the prefix, or give the same command again")
    raise UsageError(f"{dest.root}: DEST is not empty; give a new folder or prefix (or an empty one)")


def _read_final(dest: Dest, name: str) -> bytes | None:
    """``name`` at its final place (of a staged DEST: in DEST, not in the work folder)."""
    try:
        return dest.storage().read(dest.join(name))
    except (FileNotFoundError, NotADirectoryError):
        return None


def _ours(dest: Dest, names: list[str], key: str) -> set[str]:
    """The objects of a bucket DEST an unfinished run of the plan ``key`` wrote (its marker says)."""
    data = dest.read_bytes(MARKER)
    try:
        marker = json.loads(data) if data is not None else None
    except ValueError:
        marker = None
    if not isinstance(marker, dict) or marker.get("plan") != key:
        return set()
    planned = set(marker.get("names", ()))
    return {n for n in names if n == MARKER or n.startswith(RECEIPTS + "/") or n in planned
            or n.endswith(SUFFIX) and n[:-len(SUFFIX)] in planned}


def begin(dest: Dest, key: str, names: list[str]) -> None:
    """Make DEST's work area ready for the plan ``key`` (which writes ``names``): the temporary
    folder (kept when it is of this plan, else made afresh) or the marker."""
    if not dest.staged:
        marker = json.dumps({"plan": key, "names": sorted(names)}, sort_keys=True).encode()
        if dest.read_bytes(MARKER) != marker:
            dest.write_bytes(MARKER, marker)
        return
    storage = dest.storage()
    work = dest.work
    try:
        if json.loads(storage.read(storage.join(work, RECEIPTS, PLAN))).get("plan") == key:
            _clear_strays(storage, work)
            return
    except (OSError, ValueError, AttributeError):
        pass
    if storage.stat(work) is not None:
        storage.remove_tree(work)   # an unfinished run of another plan: ours, and of no use now
    parent = storage.split(work)[0]
    there = storage.stat(parent)
    if there is None or not there.is_dir:
        raise UsageError(f"{parent}: no such folder (DEST's parent)")
    try:
        storage.makedirs(storage.join(work, RECEIPTS))
    except OSError as exc:
        raise UsageError(f"{dest.root}: cannot write beside it: {exc.strerror}") from None
    storage.sync_folder(work)
    storage.sync_folder(parent)
    dest.write_bytes(f"{RECEIPTS}/{PLAN}", json.dumps({"plan": key}).encode())


def _clear_strays(storage: Storage, work: str) -> None:
    """The temporary files of a write that a crash cut short, in a work folder kept for a rerun."""
    for folder in (work, storage.join(work, RECEIPTS)):
        for e in storage.list(folder) or []:
            if e.name.startswith(TMP_PREFIX) and e.name != RECEIPTS:
                storage.delete(e.path)


def _receipt_numbers(name: str) -> range | None:
    """The new shards a receipt file is of (``FIRST.json`` or ``FIRST-LAST.json``), else None."""
    stem = name[:-len(".json")] if name.endswith(".json") else ""
    first, _, last = stem.partition("-")
    if not first.isdigit() or not (last.isdigit() or not last):
        return None
    return range(int(first), int(last or first) + 1)


def receipts(dest: Dest) -> dict[int, dict]:
    """The receipts of new shards written by an earlier run of this plan, by shard number, kept
    only when every file they name is still there as written."""
    names = [e.name for e in dest.storage().list(dest.path(RECEIPTS), recursive=True) or []]
    found: dict[int, dict] = {}
    for name in names:
        numbers = _receipt_numbers(name)
        if numbers is None:
            continue
        data = dest.read_bytes(f"{RECEIPTS}/{name}")
        try:
            bodies = json.loads(data) if data is not None else None
        except ValueError:
            continue
        for body in bodies if isinstance(bodies, list) else ():
            if isinstance(body, dict) and body.get("n") in numbers and \
                    all(dest.stat(f) == (size, ident) for f, size, ident in body.get("files", [])) and \
                    (not dest.staged or _holds_what_it_says(dest, body)):
                found[body["n"]] = body
    return found


def _holds_what_it_says(dest: Dest, body: dict) -> bool:
    """Whether a local job's files hold the bytes its receipt names (their CRC-32C): the files
    were not yet durable when it was written, and a crash may have lost what it says."""
    try:
        index = body.get("index") or {}
        storage = dest.storage()
        return file_crc(storage, dest.path(body["name"])) == body["crc32c"] and \
            (not index or file_crc(storage, dest.path(index["file"])) == index["crc32c"])
    except (KeyError, OSError, TypeError):
        return False


def forget_receipts(dest: Dest, numbers: list[int]) -> None:
    """Drop the receipts that name new shards whose output does not check, so that the next run
    writes them again (with the others of their job)."""
    for e in dest.storage().list(dest.path(RECEIPTS), recursive=True) or []:
        held = _receipt_numbers(e.name)
        if held is not None and any(n in held for n in numbers):
            dest.storage().delete(dest.path(f"{RECEIPTS}/{e.name}"))


def check(dest: Dest, done: list[dict]) -> None:
    """That every file the jobs say they wrote is there, of the size and identity they saw.
    Raises OSError naming the first that is not."""
    for body in done:
        for f, size, ident in body["files"]:
            got = dest.stat(f)
            if got != (size, ident):
                raise OSError(f"{f}: written as {size} bytes ({ident}), now "
                              f"{'missing' if got is None else f'{got[0]} bytes ({got[1]})'}: run the command again")


def publish(dest: Dest, manifest_body: dict, files: dict[str, bytes], key: str) -> None:
    """Write ``files`` (TFDS metadata, ...) and the manifest (naming the plan ``key``) and make
    DEST complete: the rename of the temporary folder, or the marker's removal."""
    storage = dest.storage()
    if dest.staged:
        storage.sync_all(dest.work)   # every job's files, durable before anything names them
    for name, data in files.items():
        dest.write_bytes(name, data)
    body = dict(manifest_body, made_by=key)
    dest.write_bytes(MANIFEST, (json.dumps(body, separators=(",", ":"), sort_keys=True) + "\n").encode())
    if not dest.staged:
        tidy(dest)
        return
    storage.sync_folder(dest.work)
    there = storage.stat(dest.root)
    if there is not None and not (there.is_dir and not storage.list(dest.root)):
        # (an empty folder is replaced as atomically)
        raise UsageError(f"{dest.root}: DEST appeared meanwhile; the new dataset is left in {dest.work}")
    storage.rename(dest.work, dest.root)
    tidy(dest)


def tidy(dest: Dest) -> None:
    """Remove what publishing leaves behind: the receipts (and plan) and the marker."""
    storage = dest.storage()
    if not dest.staged:
        for name in sorted(_names(dest) or []):
            if name.startswith(RECEIPTS + "/") or name == MARKER:
                storage.delete(dest.path(name))   # the marker last: the names sort after the receipts'
        return
    folder = dest.join(RECEIPTS)
    there = storage.stat(folder)
    if there is None or not there.is_dir:
        return
    # Receipts are of no use once DEST is published: no fsync per file, one for the folder.
    storage.remove_tree(folder)
    storage.sync_folder(dest.root)


def abandon(dest: Dest) -> None:
    """Drop what a write that cannot be resumed wrote (DEST was new or empty when it began): the
    temporary folder, or every object under the prefix, the marker last."""
    storage = dest.storage()
    if dest.staged:
        if storage.stat(dest.work) is not None:
            try:
                storage.remove_tree(dest.work)
            except OSError:
                pass   # what is left is removed by the next run of any plan (``begin``)
        return
    for name in sorted(_names(dest) or [], key=lambda n: n == MARKER):
        storage.delete(dest.path(name))


_READ_BACK = 4 << 20   # bytes read back at once


def file_crc(storage: Storage, path: str) -> int:
    """CRC-32C of a file, read back in large blocks (a local one from the page cache, just written)."""
    crc = 0
    local = storage.local_path(path)
    if local is None:
        with storage.open_read(path) as stream:
            while chunk := stream.read(_READ_BACK):
                crc = crc32c.crc32c(chunk, crc)
        return crc
    with open(local, "rb", buffering=0) as f:
        # A buffer no larger than the file (a shard of 500 KB would otherwise have 8 MiB zeroed).
        buf = bytearray(max(1, min(_READ_BACK, os.fstat(f.fileno()).st_size)))
        view = memoryview(buf)
        while n := f.readinto(buf):
            crc = crc32c.crc32c(view[:n], crc)
    return crc
