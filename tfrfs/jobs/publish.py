"""A new dataset published into DEST whole or not at all (``tfrfs reshard``, ``tfrfs.ray.write``).

Jobs (in any process, on any node) write the new shards and their index files, each job's
figures going into a small receipt. The driver checks every receipt against what is there (sizes,
identities, counts), then publishes:

- DEST a local folder: the jobs write into a temporary folder beside it (same parent, named
  ``.tfrfs-commit-reshard-NAME``: a mount of the parent never shows it); every file is fsynced;
  the driver writes the manifest (and TFDS metadata) into it and renames the folder into place.
  DEST must not exist or be an empty folder. The receipts (and the plan they belong to) ride
  along in one hidden sub-folder and are removed after the rename.
- DEST a bucket prefix (nothing renames atomically there): a marker object first
  (``.tfrfs-commit-reshard``, naming the plan), the shards and index files at their final
  names, the manifest last, then the receipts and the marker are removed. A prefix holding the
  marker and no manifest is an unfinished reshard (``sources.unfinished_reshard``).

Running the same command again finds its plan (the temporary folder's, the marker's) and reuses
every job whose receipt still matches what is there; a different plan starts afresh. Every durable
step goes through ``durable`` (its fault hook is where the crash tests kill the driver).
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO

import crc32c

from tfrfs.storage import durable
from tfrfs.errors import UsageError
from tfrfs.index.idxfile import SUFFIX
from tfrfs.index.shard_index import TMP_PREFIX, local_identity
from tfrfs.index.manifest import NAME as MANIFEST
from tfrfs.storage.fsspec_store import Store, is_url, object_info

WORK_PREFIX = TMP_PREFIX + "reshard-"   # the temporary folder beside a local DEST
MARKER = TMP_PREFIX + "reshard"          # a bucket DEST's "being written" object
RECEIPTS = TMP_PREFIX + "receipts"       # jobs' receipts, and the plan (local: inside the work folder)
PLAN = "plan.json"
_stores: dict[tuple, Store] = {}
_stores_lock = threading.Lock()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@dataclass(frozen=True)
class Dest:
    """DEST as the user named it (an absolute folder path or a URL) and its store options: small
    and picklable, for the jobs that write into it."""

    root: str
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, dest: str, options: dict[str, Any] | None = None) -> "Dest":
        if is_url(dest):
            return cls(dest.rstrip("/"), tuple(sorted((options or {}).items())))
        if options:
            raise UsageError(f"store options (-o {', '.join(options)}) apply to URL destinations only")
        return cls(os.path.abspath(dest))

    @property
    def remote(self) -> bool:
        return is_url(self.root)

    @property
    def name(self) -> str:
        return posixpath.basename(self.root) if self.remote else os.path.basename(self.root)

    @property
    def work(self) -> str:
        """Where the jobs write: the temporary folder beside a local DEST, the prefix itself."""
        if self.remote:
            return self.root
        parent, name = os.path.split(self.root)
        return os.path.join(parent, WORK_PREFIX + name)

    def store(self) -> Store:
        key = (self.root, self.options)
        with _stores_lock:
            found = _stores.get(key)
            if found is None:
                found = _stores[key] = Store(self.root, dict(self.options) or None)
            return found

    def path(self, name: str) -> str:
        return posixpath.join(self.work, name) if self.remote else os.path.join(self.work, name)

    # -- what a job does -------------------------------------------------------------------

    def create(self, name: str) -> tuple[BinaryIO, int | None]:
        """A new file ``name`` to stream into (and its descriptor, when local)."""
        path = self.path(name)
        if self.remote:
            store = self.store()
            return store.fs.open(store.path_of(path), "wb"), None
        durable.fault_point("write", path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 & ~_umask())
        return os.fdopen(fd, "wb", buffering=0), fd

    def finished(self, name: str, f: BinaryIO, fd: int | None) -> tuple[int, str, int]:
        """Close what ``create`` gave: (size, identity, mtime_ns) of the file written. A local file
        is made durable with all the others before publishing (``publish``: one ``syncfs``, not
        an fsync per file)."""
        path = self.path(name)
        if fd is not None:
            st = os.fstat(fd)
            f.close()
            return st.st_size, local_identity(st), st.st_mtime_ns
        f.close()
        obj = object_info(self.store(), self.store().info(path))
        return obj.size, obj.identity, obj.mtime_ns

    def write_bytes(self, name: str, data: bytes, *, sync: bool = True) -> tuple[int, str, int]:
        """Write a small file whole: its (size, identity, mtime_ns). ``sync=False`` (what jobs
        write): made durable with the rest before publishing."""
        path = self.path(name)
        if self.remote:
            durable.fault_point("write", path)
            self.store().write_all(path, data)
            obj = object_info(self.store(), self.store().info(path))
            return obj.size, obj.identity, obj.mtime_ns
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if sync:
            durable.write_file(path, data, prefix=TMP_PREFIX, mode=0o666 & ~_umask())
            st = os.stat(path)
        else:
            # Written in place, in the work folder: a file cut short by a crash fails its checksum
            # in the receipt's check (or the receipt does not parse), and the job is done again.
            durable.fault_point("write", path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 & ~_umask())
            try:
                os.write(fd, data)
                st = os.fstat(fd)
            finally:
                os.close(fd)
        return st.st_size, local_identity(st), st.st_mtime_ns

    def read_bytes(self, name: str) -> bytes | None:
        path = self.path(name)
        try:
            if self.remote:
                store = self.store()
                return bytes(store.call("read", path, lambda: store.fs.cat_file(store.path_of(path))))
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def stat(self, name: str) -> tuple[int, str] | None:
        """(size, identity) of a file written, or None."""
        path = self.path(name)
        try:
            if self.remote:
                obj = object_info(self.store(), self.store().info(path))
                return obj.size, obj.identity
            st = os.stat(path)
            return st.st_size, local_identity(st)
        except FileNotFoundError:
            return None

    def receipt(self, n: int, body: dict) -> None:
        """A finished job's figures (after its files are written; locally not yet durable: a
        rerun after a crash checks the files' checksums before it trusts a receipt)."""
        self.write_bytes(f"{RECEIPTS}/{n:06d}.json", json.dumps(body, sort_keys=True).encode(), sync=False)


# --- the driver ---------------------------------------------------------------------------------

def manifest_key(data: bytes) -> str | None:
    """The plan a manifest's dataset was published for (``made_by``), if any."""
    try:
        body = json.loads(data)
        got = body.get("made_by") if isinstance(body, dict) else None
        return str(got) if got is not None else None
    except ValueError:
        return None


def _local_names(folder: str) -> list[str] | None:
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise UsageError(f"{folder}: DEST is a file; give a folder that does not exist yet (or is empty)") from None


def _remote_names(dest: Dest) -> list[str]:
    store = dest.store()
    try:
        found = store.call("list", dest.root, lambda: store.fs.find(store.path_of(dest.root), withdirs=False))
    except FileNotFoundError:
        return []
    base = store.path_of(dest.root).rstrip("/") + "/"
    return [str(p)[len(base):] for p in found if str(p).startswith(base)]


def already_published(dest: Dest, key: str) -> bool:
    """Whether DEST holds this very plan's dataset, complete (the manifest names the plan). Raises
    UsageError when DEST holds anything else (a non-empty folder or prefix)."""
    names = _remote_names(dest) if dest.remote else _local_names(dest.root)
    if not names:
        return False
    data = _read_final(dest, MANIFEST)
    if data is not None and manifest_key(data) == key:
        return True
    if dest.remote and set(names) <= _ours(dest, names, key):
        return False   # an unfinished run of this plan: finished now
    if dest.remote and MARKER in names and data is None:
        raise UsageError(f"{dest.root}: holds an unfinished reshard of another source or other options: "
                         "delete the prefix, or give the same command again")
    raise UsageError(f"{dest.root}: DEST is not empty; give a new folder or prefix (or an empty one)")


def _read_final(dest: Dest, name: str) -> bytes | None:
    if dest.remote:
        return dest.read_bytes(name)
    try:
        with open(os.path.join(dest.root, name), "rb") as f:
            return f.read()
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
    folder (kept when it is of this plan, else made afresh) or the bucket's marker."""
    if dest.remote:
        marker = json.dumps({"plan": key, "names": sorted(names)}, sort_keys=True).encode()
        if dest.read_bytes(MARKER) != marker:
            dest.write_bytes(MARKER, marker)
        return
    work = dest.work
    plan = os.path.join(work, RECEIPTS, PLAN)
    try:
        with open(plan, "rb") as f:
            if json.loads(f.read()).get("plan") == key:
                _clear_strays(work)
                return
    except (OSError, ValueError, AttributeError):
        pass
    if os.path.lexists(work):
        shutil.rmtree(work)   # an unfinished run of another plan: ours, and of no use now
    parent = os.path.dirname(work)
    if not os.path.isdir(parent):
        raise UsageError(f"{parent}: no such folder (DEST's parent)")
    try:
        os.makedirs(os.path.join(work, RECEIPTS))
    except OSError as exc:
        raise UsageError(f"{dest.root}: cannot write beside it: {exc.strerror}") from None
    durable.fsync_dir(work)
    durable.fsync_dir(parent)
    dest.write_bytes(f"{RECEIPTS}/{PLAN}", json.dumps({"plan": key}).encode())


def _clear_strays(work: str) -> None:
    """The temporary files of a write that a crash cut short, in a work folder kept for a rerun."""
    for folder in (work, os.path.join(work, RECEIPTS)):
        for name in os.listdir(folder):
            if name.startswith(TMP_PREFIX) and name != RECEIPTS:
                os.unlink(os.path.join(folder, name))


def receipts(dest: Dest) -> dict[int, dict]:
    """The receipts of jobs done by an earlier run of this plan, by job number, kept only when every
    file they name is still there as written."""
    if dest.remote:
        names = [n.split("/", 1)[1] for n in _remote_names(dest) if n.startswith(RECEIPTS + "/")]
    else:
        names = os.listdir(os.path.join(dest.work, RECEIPTS)) if os.path.isdir(os.path.join(dest.work, RECEIPTS)) else []
    found: dict[int, dict] = {}
    for name in names:
        stem = name[:-len(".json")] if name.endswith(".json") else ""
        if not stem.isdigit():
            continue
        data = dest.read_bytes(f"{RECEIPTS}/{name}")
        try:
            body = json.loads(data) if data is not None else None
        except ValueError:
            continue
        if isinstance(body, dict) and all(dest.stat(f) == (size, ident) for f, size, ident in body.get("files", [])) \
                and (dest.remote or _holds_what_it_says(dest, body)):
            found[int(stem)] = body
    return found


def _holds_what_it_says(dest: Dest, body: dict) -> bool:
    """Whether a local job's files hold the bytes its receipt names (their CRC-32C): the files
    were not yet durable when it was written, and a crash may have lost what it says."""
    try:
        index = body.get("index") or {}
        return file_crc(dest.path(body["name"])) == body["crc32c"] and \
            (not index or file_crc(dest.path(index["file"])) == index["crc32c"])
    except (KeyError, OSError, TypeError):
        return False


def forget_receipts(dest: Dest, numbers: list[int]) -> None:
    """Drop the receipts of jobs whose output does not check, so that the next run redoes them."""
    for n in numbers:
        name = f"{RECEIPTS}/{n:06d}.json"
        if dest.remote:
            _remove_object(dest, name)
        else:
            try:
                durable.unlink(dest.path(name))
            except FileNotFoundError:
                pass


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
    if not dest.remote:
        durable.syncfs(dest.work)   # every job's files, durable before anything names them
    for name, data in files.items():
        dest.write_bytes(name, data)
    body = dict(manifest_body, made_by=key)
    dest.write_bytes(MANIFEST, (json.dumps(body, separators=(",", ":"), sort_keys=True) + "\n").encode())
    if dest.remote:
        tidy(dest)
        return
    durable.fsync_dir(dest.work)
    if os.path.isdir(dest.root) and not os.listdir(dest.root):
        durable.rename(dest.work, dest.root)   # an empty folder is replaced as atomically
    else:
        if os.path.lexists(dest.root):
            raise UsageError(f"{dest.root}: DEST appeared meanwhile; the new dataset is left in {dest.work}")
        durable.rename(dest.work, dest.root)
    durable.fsync_dir(os.path.dirname(dest.root))
    tidy(dest)


def tidy(dest: Dest) -> None:
    """Remove what publishing leaves behind: the receipts (and plan) and a bucket's marker."""
    if dest.remote:
        for name in sorted(_remote_names(dest)):
            if name.startswith(RECEIPTS + "/") or name == MARKER:
                _remove_object(dest, name)   # the marker last: the names sort after the receipts'
        return
    folder = os.path.join(dest.root, RECEIPTS)
    if not os.path.isdir(folder):
        return
    # Receipts are of no use once DEST is published: no fsync per file, one for the folder; the
    # unlinks overlap (each waits on the file system's journal, and on a discard where it does).
    from concurrent.futures import ThreadPoolExecutor
    paths = [os.path.join(folder, name) for name in sorted(os.listdir(folder))]
    for path in paths:
        durable.fault_point("unlink", path)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(os.unlink, paths))
    os.rmdir(folder)
    durable.fsync_dir(dest.root)


def _remove_object(dest: Dest, name: str) -> None:
    store = dest.store()
    path = dest.path(name)
    durable.fault_point("unlink", path)
    store.call("delete", path, lambda: store.fs.rm_file(store.path_of(path)))


def abandon(dest: Dest) -> None:
    """Drop what a write that cannot be resumed wrote (DEST was new or empty when it began): the
    local temporary folder, or every object under the bucket prefix, the marker last."""
    if not dest.remote:
        if os.path.isdir(dest.work):
            shutil.rmtree(dest.work, ignore_errors=True)
        return
    for name in sorted(_remote_names(dest), key=lambda n: n == MARKER):
        _remove_object(dest, name)


_READ_BACK = 4 << 20   # bytes read back at once


def file_crc(path: str) -> int:
    """CRC-32C of a local file, read back in large blocks (from the page cache, just written)."""
    crc = 0
    buf = bytearray(_READ_BACK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc = crc32c.crc32c(view[:n], crc)
    return crc
