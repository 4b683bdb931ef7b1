"""A local file system as a ``Storage``: whole writes by the durable path (temporary file, fsync,
rename, fsync of the folder), every step through ``durable``'s fault seam."""

from __future__ import annotations

import fcntl
import glob
import os
import stat as _stat
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from tfrfs.errors import UsageError
from tfrfs.storage import durable
from tfrfs.storage.base import Conflict, Entry, Listing, ObjectInfo, Stat, Storage, Writing
from tfrfs.storage.readers import Readers

TMP_PREFIX = ".tfrfs-commit-"   # a temporary file beside the one it replaces (never shown by a mount)


def local_identity(st: os.stat_result) -> str:
    """What an index of a local file's bytes is checked against."""
    return f"mtime:{st.st_mtime_ns}:{st.st_size}"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def stat_of(st: os.stat_result) -> Stat:
    return Stat(st.st_size, local_identity(st), st.st_mtime_ns, _stat.S_ISDIR(st.st_mode))


@contextmanager
def folder_lock(folder: str) -> Iterator[None]:
    """The folder's lock, held from a conditional write's look to its rename: writers that write
    on a condition in this folder take turns (others are not stopped)."""
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(dfd)   # lets go of the lock


class LocalStorage(Storage):
    """Files under ``/``. New files get the mode ``open`` would give them (0666 less the umask),
    so that a file others read stays readable."""

    renames_atomically = True

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        if options:
            raise UsageError(f"store options (-o {', '.join(options)}) apply to URLs only")
        self.name = "local"
        self.options = {}

    def join(self, base: str, *parts: str) -> str:
        return os.path.join(base, *(p.replace("/", os.sep) for p in parts))

    def split(self, path: str) -> tuple[str, str]:
        return os.path.split(path.rstrip(os.sep) or os.sep)

    def absolute(self, path: str) -> str:
        return os.path.abspath(path)

    def local_path(self, path: str) -> str | None:
        return path

    def stat(self, path: str, *, fresh: bool = True) -> Stat | None:
        try:
            return stat_of(os.stat(path))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def list(self, path: str, *, recursive: bool = False) -> list[Entry] | None:
        if not os.path.isdir(path):
            return None
        found: list[Entry] = []
        if not recursive:
            with os.scandir(path) as it:
                for e in it:
                    try:
                        found.append(Entry(e.name, e.path, stat_of(e.stat())))
                    except FileNotFoundError:
                        continue   # gone since the folder was read
        else:
            for rel, _, files in _walk(path, skipped=FileNotFoundError):
                found += [Entry(f"{rel}/{name}" if rel else name, full, stat_of(st)) for name, full, st in files]
        found.sort(key=lambda e: e.name)
        return found

    def list_source(self, path: str) -> Listing:
        # As a store's listing is (fsspec_store.list_source), from plain os calls: ``url`` is the path.
        def info(at: str, st: os.stat_result) -> ObjectInfo:
            return ObjectInfo(at, st.st_size, local_identity(st), st.st_mtime_ns)
        if any(ch in path for ch in "*?["):
            matched = sorted(p for p in glob.glob(path) if os.path.isfile(p))
            if not matched:
                raise UsageError(f"no file matches {path!r}")
            shown, seen = [], set()
            for p in matched:
                name = base = os.path.basename(p)
                n = 2
                while name in seen:   # two matches of one name from different folders
                    name = f"{base}~{n}"
                    n += 1
                seen.add(name)
                shown.append((name, info(p, os.stat(p))))
            return Listing(os.path.dirname(matched[0]), tuple(shown), ("",), False)
        try:
            st = os.stat(path)
        except OSError as exc:
            raise UsageError(f"{path}: {exc.strerror}") from exc
        if not _stat.S_ISDIR(st.st_mode):
            return Listing(os.path.dirname(path), ((os.path.basename(path), info(path, st)),), ("",), True)
        root = path.rstrip(os.sep) or os.sep
        files, dirs = [], [""]
        for rel, subdirs, found in _walk(root, skipped=OSError, leave_out=".tfrfs-staging"):
            dirs += [f"{rel}/{d}" if rel else d for d in subdirs]
            files += [(f"{rel}/{name}" if rel else name, info(full, got))
                      for name, full, got in found if _stat.S_ISREG(got.st_mode)]
        if not files:
            raise UsageError(f"{path}: no such folder, or nothing in it")
        return Listing(root, tuple(sorted(files)), tuple(sorted(dirs)), False)

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def read_range(self, path: str, start: int, end: int) -> bytes:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.pread(fd, max(0, end - start), start)
        finally:
            os.close(fd)

    def open_read(self, path: str) -> BinaryIO:
        return open(path, "rb")

    def write(self, path: str, data: bytes, *, sync: bool = True) -> None:
        if sync:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            durable.write_file(path, data, prefix=TMP_PREFIX, mode=0o666 & ~_umask())
            return
        # Written in place: the caller checks what it wrote (a checksum) before trusting it.
        # (The folder is made only when it is missing: jobs write many files into one.)
        durable.fault_point("write", path)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)   # less the umask
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def create(self, path: str) -> Writing:
        durable.fault_point("write", path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)   # less the umask
        return Writing(os.fdopen(fd, "wb", buffering=0), fd)

    def finish(self, path: str, writing: Writing) -> Stat:
        assert writing.fd is not None
        st = os.fstat(writing.fd)
        durable.start_writeback(writing.fd)   # made durable later, with the rest (one syncfs)
        writing.file.close()
        return stat_of(st)

    def write_if(self, path: str, data: bytes, *, identity: str | None) -> str:
        folder = os.path.dirname(path) or "."
        os.makedirs(folder, exist_ok=True)
        if identity is None:
            # Linked into place: the link fails if a file got there first, whoever wrote it.
            fd, tmp = durable.mkstemp(folder, TMP_PREFIX)
            try:
                os.fchmod(fd, 0o666 & ~_umask())
                with os.fdopen(fd, "wb") as f:
                    durable.write(f, data, tmp)
                    f.flush()
                    durable.fsync(f.fileno(), tmp)
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise Conflict(f"{path}: there already") from None
                written = stat_of(os.stat(tmp))   # the inode just linked: what it wrote, whatever came after
            finally:
                os.unlink(tmp)
            durable.fsync_dir(folder)
            return written.identity
        with folder_lock(folder):
            now = self.stat(path)
            if now is None or now.identity != identity:
                raise Conflict(f"{path}: changed since it was read")
            durable.write_file(path, data, prefix=TMP_PREFIX, mode=0o666 & ~_umask())
            got = self.stat(path)   # (under the folder's lock: no conditional write came between)
            if got is None:
                raise OSError(f"{path}: not there after it was written")
            return got.identity

    def copy(self, src: str, dst: str) -> None:
        # Copied beside ``dst`` and renamed over it: whole under its name or not there at all.
        import shutil
        folder = os.path.dirname(dst) or "."
        os.makedirs(folder, exist_ok=True)
        fd, tmp = durable.mkstemp(folder, TMP_PREFIX)
        os.close(fd)
        with durable.removed_on_failure(tmp):
            shutil.copyfile(src, tmp)
            os.chmod(tmp, 0o666 & ~_umask())
            with open(tmp, "rb") as f:
                durable.fsync(f.fileno(), tmp)
            durable.rename(tmp, dst)
        durable.fsync_dir(folder)

    def upload(self, local: str, path: str) -> None:
        self.copy(local, path)

    def rename(self, src: str, dst: str) -> None:
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        durable.rename(src, dst)
        durable.fsync_dir(os.path.dirname(dst) or ".")

    def delete(self, path: str) -> None:
        try:
            durable.unlink(path)
        except FileNotFoundError:
            pass

    def remove_tree(self, path: str) -> None:
        files: list[str] = []
        folders: list[str] = []
        for folder, _dirs, names in os.walk(path, topdown=False):
            files.extend(os.path.join(folder, n) for n in names)
            folders.append(folder)
        for f in files:
            durable.fault_point("unlink", f)
        # No fsync a file: one for the parent folder, by the caller. The unlinks overlap (each
        # waits on the file system's journal, and on a discard where it does).
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(os.unlink, files))
        for folder in folders:
            os.rmdir(folder)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def sync_folder(self, path: str) -> None:
        durable.fsync_dir(path)

    def open_readers(self, cache_dir: Path, cache_size: int | None = None) -> Readers:
        from tfrfs.storage.readers import default_readers
        return default_readers()

    def sync_all(self, path: str) -> None:
        durable.syncfs(path)


def _walk(root: str, *, skipped: type[OSError], leave_out: str | None = None,
          ) -> Iterator[tuple[str, list[str], list[tuple[str, str, os.stat_result]]]]:
    """Every folder below ``root``: its path from ``root`` ("/"-separated, "" for ``root``), its
    subfolders (sorted; ``leave_out`` is not entered) and its files (name, path, stat). A file
    whose stat raises ``skipped`` (gone since the folder was read, or unreadable) is left out."""
    for folder, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d != leave_out)
        rel = os.path.relpath(folder, root).replace(os.sep, "/")
        files = []
        for name in names:
            full = os.path.join(folder, name)
            try:
                files.append((name, full, os.stat(full)))
            except skipped:
                continue
        yield "" if rel == "." else rel, subdirs, files
