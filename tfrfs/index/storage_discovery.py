"""What a dataset in a store holds (SPEC 1, 1.1), found through its ``Storage``: listed (a
prefix, a glob or one object) and each object judged by its first bytes, fetched in parallel, as
a local folder's files are (``discovery``); or, with no listing at all, as the manifest at its
prefix says (SPEC 1.2). ``StorageFiles`` reads its plain files, folder times and index files.

A local folder is walked by ``discovery`` itself: plain os calls, each file looked at when
needed, where a store's listing is one request and kept.
"""

from __future__ import annotations

import logging
import os
import posixpath
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from tfrfs.storage.sharing import Flights
from tfrfs.errors import UsageError
from tfrfs.index import idxfile
from tfrfs.index import manifest
from tfrfs.index.discovery import (HIDDEN_DIRS, INDEX_SUFFIXES, RESHARD_MARKER, SNIFF_BYTES, TMP_PREFIX, Discovery,
                                   ShardFile, SourceFiles, judge_head, shipped_names)
from tfrfs.index.manifest import Manifest
from tfrfs.storage.base import Listing, ObjectInfo, Storage, describe

log = logging.getLogger("tfrfs")

PREFETCH_BYTES = 64 << 10   # of an index file read while finding the shards (all of a small one)
SNIFF_WORKERS = 32          # objects whose first bytes are fetched at a time (the requests overlap)
_HIDDEN_PREFIXES = (TMP_PREFIX,)
_HIDDEN_NAMES = (".tfrfs-manifest",)


def read_manifest(storage: Storage, url: str) -> Manifest | None:
    """The manifest at a prefix (one request), or None (none there, or not a prefix)."""
    if any(ch in url for ch in "*?["):   # a glob: no prefix to hold one
        return None
    where = storage.join(url.rstrip("/"), manifest.NAME)
    try:
        data = storage.read(where)
    except (FileNotFoundError, PermissionError):
        return None
    except Exception as exc:  # noqa: BLE001 - no manifest to use: the prefix is listed as usual
        log.info("%s: not read (%s): the prefix is listed", where, describe(exc))
        return None
    try:
        found = manifest.parse(data)
    except manifest.ManifestError as exc:
        log.warning("%s: %s: the prefix is listed instead", where, exc)
        return None
    log.info("%s: shards, counts and folders from its manifest (%d shards): no listing", url, len(found.shards))
    return found


def manifest_discovery(storage: Storage, url: str, cache_dir: Path, found: Manifest) -> Discovery:
    """What a prefix holds, as its manifest says: no LIST request, none per shard."""
    root = url.rstrip("/")

    def url_of(rel: str) -> str:
        return storage.join(root, rel.replace(os.sep, "/"))
    objects = [(e.path.replace(os.sep, "/"), ObjectInfo(url_of(e.held_at), e.size, e.identity, e.mtime_ns))
               for e in found.shards]
    objects += [(rel.replace(os.sep, "/"), ObjectInfo(url_of(found.held.get(rel, rel)), size, f"mtime:{mtime}", mtime))
                for rel, size, mtime in found.files]
    dirs = tuple(rel.replace(os.sep, "/") for rel, _ in found.dirs) or ("",)
    files = StorageFiles(storage, Listing(root, tuple(objects), dirs, False), cache_dir)
    shards = tuple(manifest.shard_file(root, e, join=storage.join) for e in found.shards)
    return Discovery(root=root, shards=shards, plain_files=tuple(rel.replace(os.sep, "/") for rel, _, _ in found.files),
                     dirs=dirs, mirrors_dir=True, files=files)


class StorageFiles(SourceFiles):
    """A SOURCE's files in a store: its plain files (fetched into the cache when first read),
    folder times (the newest object's in each, from the listing) and the index files beside its
    shards, all through its ``Storage``."""

    def __init__(self, storage: Storage, listing: Listing, cache_dir: Path) -> None:
        super().__init__(listing.root)
        self.storage = storage
        self.cache_dir = cache_dir
        self.objects = {rel: obj for rel, obj in listing.files}
        self.prefetched: dict[str, bytes] = {}   # index files read while finding the shards
        self._fetching: Flights[str, str] = Flights()
        self.dir_times: dict[str, int] = {}
        for rel, obj in listing.files:
            d = posixpath.dirname(rel)
            while True:
                self.dir_times[d] = max(self.dir_times.get(d, 0), obj.mtime_ns)
                if not d:
                    break
                d = posixpath.dirname(d)

    def dir_mtime_ns(self, rel: str) -> int:
        return self.dir_times.get(rel, 0)

    def plain_stat(self, rel: str) -> tuple[int, int]:
        obj = self.objects[rel]
        return obj.size, obj.mtime_ns

    def plain_path(self, rel: str) -> str:
        obj = self.objects[rel]
        # Fetched once however many threads read it at once.
        return self._fetching.run(rel, lambda: plain_file_path(self.storage, obj.url, obj.identity, self.cache_dir))

    def local_path(self, path: str) -> str | None:
        return self.storage.local_path(path)

    def listed(self) -> list[ObjectInfo]:
        return list(self.objects.values())

    def done_indexing(self) -> None:
        self.prefetched.clear()   # index files the local cache made unneeded

    def written_mtime_ns(self, rel: str) -> int:
        # Its time as the store keeps it would take a request a file: now is as good (it was
        # just written), and what a listing will show is near it.
        return time.time_ns()

    def read_bytes(self, path: str) -> bytes:
        data = self.prefetched.pop(path, None)
        return data if data is not None else self.storage.read(path)

    def read_head(self, path: str, size: int) -> bytes:
        return self.storage.read_head(path, size)

    def write_bytes(self, path: str, data: bytes) -> None:
        self.storage.write(path, data)

    def open_stream(self, path: str) -> BinaryIO:
        return self.storage.open_read(path)

    def statfs_folder(self) -> str:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        return str(self.cache_dir)


def _hidden(rel: str) -> bool:
    """tfrfs's own files, never shown: a commit's temporary files, the staging folder, repair's
    kept originals (``.tfrfs-damaged/``), the manifest."""
    parts = rel.split("/")
    return parts[-1] in _HIDDEN_NAMES or parts[-1].startswith(_HIDDEN_PREFIXES) or \
        any(p in HIDDEN_DIRS for p in parts[:-1])


def refuse_unfinished(url: str, listing: Listing) -> None:
    """A bucket prefix that ``tfrfs reshard`` is still writing (or was killed writing): its marker
    and no manifest yet (``publish``). Raises UsageError."""
    names = {rel for rel, _ in listing.files}
    if RESHARD_MARKER in names and manifest.NAME not in names:
        raise UsageError(f"{url}: an unfinished reshard (being written, or interrupted): run the same "
                         "`tfrfs reshard` again to finish it")


def discover_in(storage: Storage, url: str, cache_dir: Path) -> Discovery:
    """What a URL source holds, judged by content as a local folder is (SPEC 1): the first bytes
    of every object are fetched in parallel."""
    listing = storage.list_source(url)
    refuse_unfinished(url, listing)
    if not listing.named and any(rel == manifest.NAME for rel, _ in listing.files):
        found = read_manifest(storage, url)
        if found is not None and (found.held or any(e.object for e in found.shards)):
            # Its manifest names objects a listing does not show (a bucket commit's, SPEC 7.1):
            # the dataset is what the manifest says, whatever the command.
            log.info("%s: its manifest names the objects that hold its shards: read from it", url)
            return manifest_discovery(storage, url, cache_dir, found)
    files = [(rel, obj) for rel, obj in listing.files if not _hidden(rel)]
    present: dict[str, set[str]] = {}
    for rel, _ in files:
        present.setdefault(posixpath.dirname(rel), set()).add(posixpath.basename(rel))
    if listing.named:
        present[""] |= _names_beside(storage, listing.root)
    shards: list[ShardFile] = []
    plain: list[str] = [rel for rel, _ in files if rel.endswith(INDEX_SUFFIXES)]   # never shards: not read
    files = [(rel, obj) for rel, obj in files if not rel.endswith(INDEX_SUFFIXES)]
    remote_files = StorageFiles(storage, listing, cache_dir)

    def beside(rel: str, names: list[str]) -> tuple[str, ...]:
        folder = posixpath.dirname(rel)
        return tuple(posixpath.join(listing.root, folder, n) if folder else posixpath.join(listing.root, n)
                     for n in names)

    # A shard with its own index file beside it (NAME.tfrfs-idx, of this very object) is known
    # from that file: it is fetched instead of the shard's first bytes (and kept for indexing).
    shipped_of = {rel: beside(rel, [posixpath.basename(rel) + idxfile.SUFFIX])[0] for rel, _ in files
                  if posixpath.basename(rel) + idxfile.SUFFIX in present.get(posixpath.dirname(rel), set())}
    known = _compressions_shipped(remote_files, [(rel, obj, shipped_of[rel]) for rel, obj in files if rel in shipped_of])
    rest = [(rel, obj) for rel, obj in files if rel not in known]
    judged: dict[str, str | None | BaseException] = dict(known)
    for (rel, obj), head in zip(rest, heads(storage, [o for _, o in rest], SNIFF_BYTES)):
        if isinstance(head, BaseException):
            judged[rel] = head
        else:
            judged[rel] = judge_head(head, posixpath.basename(rel), named_as_source=listing.named,
                                     stream=lambda u=obj.url: storage.open_read(u))   # type: ignore[misc]
    for rel, obj in files:
        comp = judged[rel]
        if isinstance(comp, BaseException):
            if listing.named:
                raise UsageError(f"{obj.url}: cannot read: {describe(comp)}")
            log.warning("%s: cannot read, left out: %s", obj.url, describe(comp))
            continue
        if comp is None:
            if listing.named:
                raise UsageError(f"{obj.url}: not a TFRecord file (its first record header has no valid checksum, "
                                 "plain or after GZIP/ZLIB decompression)")
            plain.append(rel)
            continue
        names = shipped_names(posixpath.basename(rel), present.get(posixpath.dirname(rel), set()))
        shards.append(ShardFile(path=obj.url, relpath=rel, compression=comp, size=obj.size, mtime_ns=obj.mtime_ns,
                                identity=obj.identity, shipped=beside(rel, names)))
    if not shards:
        raise UsageError(f"{url}: no TFRecord shard there")
    plain.sort()
    return Discovery(root=listing.root, shards=tuple(shards), plain_files=tuple(plain), dirs=listing.dirs,
                     mirrors_dir=not listing.named, files=remote_files)


def _compressions_shipped(files: StorageFiles, candidates: list[tuple[str, ObjectInfo, str]]) -> dict[str, str]:
    """The compression of each shard whose ``NAME.tfrfs-idx`` is of this very object (same size
    and identity), from that file's header, fetched in parallel. Shards whose index file does not
    match are not in the answer (their first bytes tell). A small index file is fetched whole and
    kept for indexing (``StorageFiles.prefetched``) until ``index_source`` is done with it."""
    def one(item: tuple[str, ObjectInfo, str]) -> tuple[str, str | None]:
        rel, obj, path = item
        size = files.objects[rel + idxfile.SUFFIX].size   # the index file lies beside the shard
        try:
            head = files.storage.read_range(path, 0, min(size, PREFETCH_BYTES))
            meta, _ = idxfile.header(head)
        except (OSError, idxfile.IndexFileError):
            return rel, None
        if meta.get("size") != obj.size or meta.get("identity") != obj.identity:
            return rel, None
        if len(head) == size:
            files.prefetched[path] = head
        comp = meta.get("compression")
        return rel, comp if isinstance(comp, str) else None
    if not candidates:
        return {}
    with ThreadPoolExecutor(min(SNIFF_WORKERS, len(candidates))) as pool:
        return {rel: comp for rel, comp in pool.map(one, candidates) if comp is not None}


def _names_beside(storage: Storage, folder_url: str) -> set[str]:
    """Names of the objects in the folder of a single-object SOURCE (where index files may be)."""
    try:
        return {e.name for e in storage.list(folder_url) or ()}
    except Exception as exc:  # noqa: BLE001 - a server without listings: no shipped index then
        log.debug("cannot list %s for index files: %s", folder_url, describe(exc))
        return set()


def heads(storage: Storage, objects: list[ObjectInfo], size: int) -> list[bytes | BaseException]:
    """The first ``size`` bytes of each object (all of a smaller one), fetched in parallel."""
    def one(obj: ObjectInfo) -> bytes | BaseException:
        try:
            n = min(size, obj.size)
            return storage.read_range(obj.url, 0, n) if n else b""
        except Exception as exc:  # noqa: BLE001
            return exc
    if not objects:
        return []
    with ThreadPoolExecutor(min(SNIFF_WORKERS, len(objects))) as pool:
        return list(pool.map(one, objects))


def plain_file_path(storage: Storage, url: str, identity: str, cache_dir: Path) -> str:
    """A local copy of a plain file in a store (``dataset_info.json`` and the like), fetched into
    the cache the first time it is read."""
    path = cache_dir / "plain" / storage.cache_key(url, identity)
    if not path.exists():
        data = storage.read(url)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp-{os.getpid()}-{threading.get_ident()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return str(path)
