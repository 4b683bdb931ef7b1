"""A bucket or web server, reached through fsspec, as a ``Storage``: ``fsspec_store.Store``'s
retries, timeouts and one-line errors behind the shared interface.

An object is replaced whole by one PUT (a bucket shows the old object or the new); nothing
renames, so ``rename`` is a server-side copy and a delete. A conditional write uses the store's
own conditional requests where it has them (S3's ``If-None-Match``/``If-Match``).
"""

from __future__ import annotations

import base64
import hashlib
import os
import posixpath
import threading
from pathlib import Path
from typing import Any, BinaryIO, Callable
from urllib.parse import quote

from tfrfs.errors import DataLoss
from tfrfs.storage import durable
from tfrfs.storage.base import Conflict, Entry, Listing, NotSupported, Stat, Storage, Writing
from tfrfs.storage.fsspec_store import PART_BYTES, Store, object_info
from tfrfs.storage.readers import Readers


def _precondition_failed(exc: BaseException) -> bool:
    """Whether a store's error is its "precondition failed" answer (HTTP 412), however the
    fsspec backend spelled it."""
    text = f"{type(exc).__name__} {exc}"
    return "PreconditionFailed" in text or "Precondition Failed" in text or "412" in text


def _generation_of(identity: str) -> str | None:
    """The generation a GCS object's identity (``generation:G:SIZE``, see ``object_info``) names."""
    kind, _, rest = identity.partition(":")
    generation = rest.partition(":")[0]
    return generation if kind == "generation" and generation.isdigit() else None


class FsspecStorage(Storage):
    """Objects of one store (one fsspec file system, opened for ``url`` with ``options``)."""

    requests_overlap = True

    def __init__(self, url: str, options: dict[str, Any] | None = None, *, store: Store | None = None) -> None:
        self.store = store if store is not None else Store(url, options)
        self.name = self.store.url
        self.options = dict(self.store.options)
        self.writable = self.store.protocol not in ("http", "https")
        # fsspec's in-memory store lives in this process: a lock makes a look and a write one step.
        self._memory_lock = threading.Lock()

    @classmethod
    def around(cls, store: Store) -> "FsspecStorage":
        """The storage of a store already open (its file system, listing and figures shared)."""
        return cls(store.url, store=store)

    def join(self, base: str, *parts: str) -> str:
        return posixpath.join(base, *parts)

    def split(self, path: str) -> tuple[str, str]:
        return posixpath.split(path.rstrip("/"))

    def cache_key(self, path: str, identity: str = "") -> str:
        from tfrfs.storage.fsspec_store import cache_key
        return cache_key(path, identity)

    # -- looking -------------------------------------------------------------------------------

    def stat(self, path: str, *, fresh: bool = True) -> Stat | None:
        try:
            info = self.store.info(path, fresh=fresh)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if info.get("type") == "directory":
            return Stat(0, "", 0, True)
        got = object_info(self.store, {**info, "name": info.get("name", self.store.path_of(path))})
        return Stat(got.size, got.identity, got.mtime_ns)

    def list(self, path: str, *, recursive: bool = False) -> list[Entry] | None:
        store = self.store
        base = store.path_of(path).rstrip("/")
        try:
            if recursive:
                found = store.call("list", path, lambda: store.fs.find(base, detail=True, withdirs=False))
                entries = list(found.values())
            else:
                entries = store.call("list", path, lambda: store.fs.ls(base, detail=True))
        except (FileNotFoundError, NotADirectoryError):
            return None
        out: list[Entry] = []
        prefix = base + "/"
        for e in entries:
            name = str(e.get("name", "")).rstrip("/")
            if not name.startswith(prefix) or name == base:
                continue
            rel = name[len(prefix):]
            if e.get("type") == "directory":
                st = Stat(0, "", 0, True)
            else:
                got = object_info(store, e)
                st = Stat(got.size, got.identity, got.mtime_ns)
            out.append(Entry(rel, self.join(path.rstrip("/"), rel), st))
        out.sort(key=lambda e: e.name)
        return out

    # -- reading -------------------------------------------------------------------------------

    def read(self, path: str) -> bytes:
        store = self.store
        return store.note_fetched(bytes(store.call("read", path, lambda: store.fs.cat_file(store.path_of(path),
                                                                                          timeout=store.timeout))))

    def read_head(self, path: str, size: int) -> bytes:
        return self.store.read_head(path, size)

    def list_source(self, path: str) -> Listing:
        from tfrfs.storage.fsspec_store import list_source
        return list_source(self.store, path)

    def read_range(self, path: str, start: int, end: int) -> bytes:
        return self.store.read_range(path, start, end, exact=False) if end > start else b""

    def open_read(self, path: str) -> BinaryIO:
        stream: BinaryIO = self.store.open_stream(path)
        return stream

    # -- writing -------------------------------------------------------------------------------

    def write(self, path: str, data: bytes, *, sync: bool = True) -> None:
        durable.fault_point("write", path)
        self._parent_folder(path)
        self.store.write_all(path, data)

    def create(self, path: str) -> Writing:
        store = self.store
        self._parent_folder(path)
        return Writing(store.fs.open(store.path_of(path), "wb"), None)

    def finish(self, path: str, writing: Writing) -> Stat:
        writing.file.close()
        got = self.stat(path)
        if got is None:
            raise OSError(f"{path}: not there after it was written")
        return got

    def write_if(self, path: str, data: bytes, *, identity: str | None) -> str:
        store = self.store
        target = store.path_of(path)
        durable.fault_point("write", path)
        if store.protocol == "memory":
            with self._memory_lock:
                self._check(path, identity)
                store.write_all(path, data)
                return self._written(path)
        if store.protocol == "file":
            # The local file system's own way (a link for a create, the folder's lock for a
            # replace), with this storage's identities compared.
            from tfrfs.storage.local_storage import LocalStorage, folder_lock
            self._parent_folder(path)
            with folder_lock(posixpath.dirname(target)):
                if identity is None:
                    LocalStorage().write_if(target, data, identity=None)
                else:
                    self._check(path, identity)
                    LocalStorage().write(target, data)
                store.fs.invalidate_cache(target)
                return self._written(path)
        if store.protocol in ("gs", "gcs"):
            return self._gcs_write_if(path, data, identity)
        if store.protocol != "s3":
            raise NotSupported(f"{path}: this store cannot write on a condition")
        if identity is None:
            kw: dict[str, Any] = {"mode": "create"}
        else:
            info = store.info(path, fresh=True) if self.stat(path) is not None else None
            now = object_info(store, {**info, "name": target}) if info is not None else None
            if now is None or now.identity != identity or not info or not info.get("ETag"):
                raise Conflict(f"{path}: changed since it was read")
            kw = {"IfMatch": info["ETag"]}   # the store refuses the PUT if it changed since
        return self._put_on_condition(path, len(data), identity, "ETag",
                                      lambda: store.fs.pipe_file(target, data, **kw))

    def _gcs_write_if(self, path: str, data: bytes, identity: str | None) -> str:
        """GCS: one upload on the object's generation (``ifGenerationMatch``: 0 for a create, the
        generation that was read for a replace), sent through gcsfs's own session; the store
        refuses it (412) if the object changed since, and its answer names the new generation."""
        store = self.store
        fs = store.fs
        target = store.path_of(path)
        generation = "0" if identity is None else _generation_of(identity)
        if generation is None:
            raise Conflict(f"{path}: changed since it was read (its identity {identity!r} is no generation)")
        bucket, key = fs.split_path(target)[:2]

        def send() -> Any:
            from fsspec.asyn import sync
            return sync(fs.loop, fs._call, "POST", f"{fs._location}/upload/storage/v1/b/{quote(bucket, safe='')}/o",
                        uploadType="media", name=key, ifGenerationMatch=generation, data=data,
                        headers={"Content-Type": "application/octet-stream"}, json_out=True)
        return self._put_on_condition(path, len(data), identity, "generation", send)

    def _put_on_condition(self, path: str, size: int, identity: str | None, field: str,
                          send: Callable[[], Any]) -> str:
        """One conditional write, sent by ``send``: the store's refusal (412, or the file system's
        FileExistsError for it) is a Conflict; the ``field`` of its answer (ETag, generation) names
        what it wrote, spelled as a listing or look-up spells it (``object_info``)."""
        store = self.store
        target = store.path_of(path)

        def put() -> str:
            try:
                out = send()
            except (OSError, ValueError) as exc:
                if isinstance(exc, FileExistsError) or _precondition_failed(exc):
                    raise Conflict(f"{path}: {'there already' if identity is None else 'changed since it was read'}") from exc
                raise
            finally:
                store.fs.invalidate_cache(target)
            got = out.get(field) if isinstance(out, dict) else None
            if not got:
                raise OSError(f"{path}: the store did not say what it wrote (no {field})")
            return object_info(store, {"name": target, "size": size, field: got}).identity
        written: str = store.call("write", path, put)
        return written

    def _written(self, path: str) -> str:
        got = self.stat(path)
        if got is None:
            raise OSError(f"{path}: not there after it was written")
        return got.identity

    def _check(self, path: str, identity: str | None) -> None:
        now = self.stat(path)
        if identity is None and now is not None:
            raise Conflict(f"{path}: there already")
        if identity is not None and (now is None or now.identity != identity):
            raise Conflict(f"{path}: changed since it was read")

    def _parent_folder(self, path: str) -> None:
        # A local folder reached as file:// needs its folders; a bucket has none to make.
        if self.store.protocol == "file":
            self.store.fs.makedirs(self.store.path_of(posixpath.dirname(path)), exist_ok=True)

    def copy(self, src: str, dst: str) -> None:
        durable.fault_point("write", dst)
        self._parent_folder(dst)
        self.store.copy(src, dst)

    def upload(self, local: str, path: str) -> None:
        durable.fault_point("write", path)
        self._parent_folder(path)
        self.store.put_file(path, local)

    def upload_checked(self, local: str, path: str) -> Stat:
        # S3 and GCS keep an MD5 of what they received, compared here without reading it back:
        # S3 in its ETag (of the object, or "-N": of its parts' MD5s, parts of PART_BYTES), GCS as
        # ``md5Hash`` (base64). An object with none (encrypted with a KMS key; composed) is read back.
        if self.store.protocol not in ("s3", "gs", "gcs"):
            return super().upload_checked(local, path)
        self.upload(local, path)
        try:
            info = self.store.info(path, fresh=True)
        except FileNotFoundError:
            raise DataLoss(f"{path}: missing after it was uploaded") from None
        got = object_info(self.store, {**info, "name": info.get("name", self.store.path_of(path))})
        size = os.path.getsize(local)
        if got.size != size:
            raise DataLoss(f"{path}: uploaded as {size} bytes, now {got.size}")
        if self.store.protocol == "s3":
            kept = str(info.get("ETag") or "").strip('"')
            want = md5_of(local, in_parts="-" in kept) if _md5_like(kept) else ""
        else:
            kept = base64.b64decode(info["md5Hash"]).hex() if info.get("md5Hash") else ""
            want = md5_of(local, in_parts=False) if kept else ""
        if not want:
            return self.read_back(local, path)
        if kept != want:
            raise DataLoss(f"{path}: the store's checksum of it ({kept}) is not that of {local}")
        return Stat(got.size, got.identity, got.mtime_ns)

    def rename(self, src: str, dst: str) -> None:
        # A copy, checked, then the delete: a copy that did not take leaves ``src`` to try again.
        durable.fault_point("rename", dst)
        want = self.stat(src)
        if want is None:
            raise FileNotFoundError(src)
        self._parent_folder(dst)
        self.store.copy(src, dst)
        got = self.stat(dst)
        if got is None or got.size != want.size:
            raise DataLoss(f"{dst}: the copy over it did not take ({got and got.size} bytes, expected "
                           f"{want.size}): the new bytes are at {src}")
        self.delete(src)

    def delete(self, path: str) -> None:
        durable.fault_point("unlink", path)
        self.store.delete(path)

    def remove_tree(self, path: str) -> None:
        for entry in reversed(self.list(path, recursive=True) or []):
            self.delete(entry.path)
        if self.store.protocol == "file":   # the folders left, where there are folders
            try:
                self.store.fs.rm(self.store.path_of(path), recursive=True)
            except FileNotFoundError:
                pass

    def makedirs(self, path: str) -> None:
        if self.store.protocol == "file":
            self.store.fs.makedirs(self.store.path_of(path), exist_ok=True)

    def open_readers(self, cache_dir: Path, cache_size: int | None = None) -> Readers:
        from tfrfs.storage.remote_reader import DEFAULT_CACHE_SIZE, RemoteReaders
        return RemoteReaders(self.store, cache_dir, DEFAULT_CACHE_SIZE if cache_size is None else cache_size)

    def stats(self) -> str:
        return self.store.stats()


def _md5_like(etag: str) -> bool:
    head, _, parts = etag.partition("-")
    return len(head) == 32 and all(c in "0123456789abcdef" for c in head) and (not parts or parts.isdigit())


def md5_of(local: str, *, in_parts: bool) -> str:
    """The MD5 a store keeps of the local file uploaded by ``Store.put_file``, in hex: of its bytes,
    or (``in_parts``: S3's ETag of a multipart upload) the MD5 of its parts' MD5s (parts of
    PART_BYTES) and "-" their count."""
    whole = hashlib.md5(usedforsecurity=False)
    parts: list[bytes] = []
    with open(local, "rb", buffering=0) as f:
        while chunk := f.read(PART_BYTES):
            if in_parts:
                parts.append(hashlib.md5(chunk, usedforsecurity=False).digest())
            else:
                whole.update(chunk)
    if not in_parts:
        return whole.hexdigest()
    return f"{hashlib.md5(b''.join(parts), usedforsecurity=False).hexdigest()}-{len(parts)}"
