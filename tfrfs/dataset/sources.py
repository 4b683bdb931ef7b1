"""SOURCE as the user names it — a local path or glob, or a URL (SPEC 1, 1.1) — opened into what
every command works from: the ``Discovery`` of its shards, plain files and folders, and the shard
readers to read them with. ``index_source`` then indexes its shards (from the cache, a shipped
index file, or a scan).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import posixpath
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable

import crc32c

from tfrfs.index import idxfile
from tfrfs.jobs import runner as jobs
from tfrfs.index import manifest
from tfrfs.jobs import shard_work as shardjobs
from tfrfs.errors import UsageError
from tfrfs.index.discovery import (HIDDEN_DIRS, INDEX_SUFFIXES, SNIFF_BYTES, TMP_PREFIX, Discovery, ShardFile,
                                   SourceFiles, discover, judge_head, shipped_names)
from tfrfs.index.shard_index import IndexCache, IndexProgress, ShardIndex, default_cache_dir
from tfrfs.jobs.indexing import index_all, index_job, reading_schema
from tfrfs.index.memory import IndexMemory
from tfrfs.index.manifest import Manifest
from tfrfs.storage.base import Storage
from tfrfs.storage.factory import open_storage
from tfrfs.storage.readers import Readers, default_readers
from tfrfs.storage.fsspec_store import SNIFF_WORKERS, Listing, ObjectInfo, Store, describe, heads, list_source, plain_file_path

log = logging.getLogger("tfrfs")

PREFETCH_BYTES = 64 << 10   # of an index file read while finding the shards (all of a small one)
REMOTE_INDEX_WORKERS = 32   # remote shards indexed at a time (their requests overlap; the blocks of
                            # scans share the readers' four fetch workers)
_HIDDEN_PREFIXES = (TMP_PREFIX,)
_HIDDEN_NAMES = (".tfrfs-manifest",)


@dataclass(eq=False)
class Source:
    """An opened SOURCE."""

    name: str                  # as the user gave it
    discovery: Discovery
    readers: Readers
    cache_dir: Path
    store: Store | None = None
    manifest: Manifest | None = None   # what the dataset's manifest says, when it was mounted from one

    _storage: Storage | None = field(default=None, repr=False)

    @property
    def local_root(self) -> str | None:
        """The local folder that holds the source (where edits are staged), None for a store's."""
        return self.storage.local_path(self.discovery.root)

    @property
    def storage(self) -> Storage:
        """Where the source's bytes live (a store already open is shared)."""
        if self._storage is None:
            if self.store is not None:
                from tfrfs.storage.fsspec_storage import FsspecStorage
                self._storage = FsspecStorage.around(self.store)
            else:
                from tfrfs.storage.factory import open_storage
                self._storage = open_storage(self.name)
        return self._storage

    def close(self) -> None:
        self.readers.close()


def open_source(source: str, *, options: dict[str, Any] | None = None, cache_dir: str | Path | None = None,
                cache_size: int | None = None, readers: Readers | None = None, empty_ok: bool = False,
                use_manifest: bool = False) -> Source:
    """Find SOURCE's shards: from the dataset's manifest when ``use_manifest`` and SOURCE is a
    folder or prefix that holds one (SPEC 1.2), else by listing it. Raises UsageError (bad
    SOURCE, bad options, the store unreachable; a local folder without shards unless
    ``empty_ok``)."""
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    storage = open_storage(source, options)
    if storage.local_path(source) is not None:
        # A local file system: walked, looked at and read in place.
        found = manifest.read_local(source) if use_manifest and os.path.isdir(source) else None
        if found is not None:
            log.info("%s: shards, counts and folders from its manifest (%d shards)", source, len(found.shards))
            return Source(source, manifest.local_discovery(source, found), readers or default_readers(), cache,
                          manifest=found, _storage=storage)
        return Source(source, discover(source, empty_ok=empty_ok), readers or default_readers(), cache,
                      _storage=storage)
    # Objects in a store, listed (or named by the manifest) and read through fsspec.
    from tfrfs.storage.fsspec_storage import FsspecStorage
    from tfrfs.storage.remote_reader import RemoteReaders
    assert isinstance(storage, FsspecStorage)
    store = storage.store
    remote_readers = storage.open_readers(cache, cache_size)
    assert isinstance(remote_readers, RemoteReaders)
    found = None
    try:
        found = _remote_manifest(storage, source) if use_manifest else None
        disc = _remote_discovery(store, source, cache, found) if found is not None else \
            discover_remote(store, source, cache)
    except BaseException:
        remote_readers.close()
        raise
    remote_readers.know([ObjectInfo(s.path, s.size, s.identity, s.mtime_ns) for s in disc.shards])
    return Source(source, disc, remote_readers, cache, store, manifest=found, _storage=storage)


def _remote_manifest(storage: Storage, url: str) -> Manifest | None:
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


def _remote_discovery(store: Store, url: str, cache_dir: Path, found: Manifest) -> Discovery:
    """What a prefix holds, as its manifest says: no LIST request, none per shard."""
    root = url.rstrip("/")

    def url_of(rel: str) -> str:
        return root + "/" + rel.replace(os.sep, "/")
    objects = [(e.path.replace(os.sep, "/"), ObjectInfo(url_of(e.path), e.size, e.identity, e.mtime_ns))
               for e in found.shards]
    objects += [(rel.replace(os.sep, "/"), ObjectInfo(url_of(rel), size, f"mtime:{mtime}", mtime))
                for rel, size, mtime in found.files]
    dirs = tuple(rel.replace(os.sep, "/") for rel, _ in found.dirs) or ("",)
    files = RemoteFiles(store, Listing(root, tuple(objects), dirs, False), cache_dir)
    shards = tuple(manifest.shard_file(root, e, join=posixpath.join) for e in found.shards)
    return Discovery(root=root, shards=shards, plain_files=tuple(rel.replace(os.sep, "/") for rel, _, _ in found.files),
                     dirs=dirs, mirrors_dir=True, files=files)


def index_source(source: Source, progress: IndexProgress | None = None, index_dir: str | None = None,
                 memory: IndexMemory | None = None) -> tuple[list[ShardIndex], IndexCache]:
    """The indexes of SOURCE's shards (cached, shipped or built now; from its manifest, only what
    the manifest says until a shard is touched), and the cache that gave them."""
    disc = source.discovery
    cache = IndexCache(source.cache_dir, source.readers, disc.access, index_dir, memory)
    if source.manifest is not None:
        indexes = [cache.from_manifest(shard, e.kind, e.count, e.summary)
                   for shard, e in zip(disc.shards, source.manifest.shards)]
        if progress is not None:
            progress(len(indexes), len(indexes), sum(i.count for i in indexes), 0, 0)
        return indexes, cache
    upto = [0, *itertools.accumulate(s.size for s in disc.shards)]   # bytes of the first n shards

    def report(done: int, total: int, records: int) -> None:
        if progress is not None:
            progress(done, total, records, upto[done], upto[-1])
    workers = REMOTE_INDEX_WORKERS if source.storage.requests_overlap else 1
    try:
        return index_all(disc.shards, cache, report, workers), cache
    finally:
        disc.access.done_indexing()


# --- remote ------------------------------------------------------------------------

class RemoteFiles(SourceFiles):
    """A remote SOURCE's plain files (fetched into the cache when first read), folder times (the
    newest object's in each) and the index files beside its shards."""

    def __init__(self, store: Store, listing: Listing, cache_dir: Path) -> None:
        super().__init__(listing.root)
        self.store = store
        self.cache_dir = cache_dir
        self.objects = {rel: obj for rel, obj in listing.files}
        self.prefetched: dict[str, bytes] = {}   # index files read while finding the shards
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
        return plain_file_path(self.store, obj.url, obj.identity, self.cache_dir)

    def local_path(self, path: str) -> str | None:
        return None   # objects in a store

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
        return data if data is not None else self.store.read_all(path)

    def read_head(self, path: str, size: int) -> bytes:
        return self.store.read_head(path, size)

    def write_bytes(self, path: str, data: bytes) -> None:
        self.store.write_all(path, data)

    def open_stream(self, path: str) -> BinaryIO:
        return self.store.open_stream(path)

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
    from tfrfs.jobs.publish import MARKER
    names = {rel for rel, _ in listing.files}
    if MARKER in names and manifest.NAME not in names:
        raise UsageError(f"{url}: an unfinished reshard (being written, or interrupted): run the same "
                         "`tfrfs reshard` again to finish it")


def discover_remote(store: Store, url: str, cache_dir: Path) -> Discovery:
    """What a URL source holds, judged by content as a local folder is (SPEC 1): the first bytes
    of every object are fetched in parallel."""
    listing = list_source(store, url)
    refuse_unfinished(url, listing)
    files = [(rel, obj) for rel, obj in listing.files if not _hidden(rel)]
    present: dict[str, set[str]] = {}
    for rel, _ in files:
        present.setdefault(posixpath.dirname(rel), set()).add(posixpath.basename(rel))
    if listing.named:
        present[""] |= _names_beside(store, listing.root)
    shards: list[ShardFile] = []
    plain: list[str] = [rel for rel, _ in files if rel.endswith(INDEX_SUFFIXES)]   # never shards: not read
    files = [(rel, obj) for rel, obj in files if not rel.endswith(INDEX_SUFFIXES)]
    remote_files = RemoteFiles(store, listing, cache_dir)

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
    for (rel, obj), head in zip(rest, heads(store, [o for _, o in rest], SNIFF_BYTES)):
        if isinstance(head, BaseException):
            judged[rel] = head
        else:
            judged[rel] = judge_head(head, posixpath.basename(rel), named_as_source=listing.named,
                                     stream=lambda u=obj.url: store.open_stream(u))   # type: ignore[misc]
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


def _compressions_shipped(files: RemoteFiles, candidates: list[tuple[str, ObjectInfo, str]]) -> dict[str, str]:
    """The compression of each shard whose ``NAME.tfrfs-idx`` is of this very object (same size
    and identity), from that file's header, fetched in parallel. Shards whose index file does not
    match are not in the answer (their first bytes tell). A small index file is fetched whole and
    kept for indexing (``RemoteFiles.prefetched``) until ``index_source`` is done with it."""
    def one(item: tuple[str, ObjectInfo, str]) -> tuple[str, str | None]:
        rel, obj, path = item
        size = files.objects[rel + idxfile.SUFFIX].size   # the index file lies beside the shard
        try:
            head = files.store.read_range(path, 0, min(size, PREFETCH_BYTES))
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


def _names_beside(store: Store, folder_url: str) -> set[str]:
    """Names of the objects in the folder of a single-object SOURCE (where index files may be)."""
    try:
        return set(store.names_in(folder_url))
    except Exception as exc:  # noqa: BLE001 - a server without listings: no shipped index then
        log.debug("cannot list %s for index files: %s", folder_url, describe(exc))
        return set()


def beside_path(shard: ShardFile, suffix: str = idxfile.SUFFIX) -> str:
    """Where a shard's shipped index goes: ``NAME.tfrfs-idx`` in the shard's folder (or prefix)."""
    return shard.path + suffix


@dataclass(frozen=True)
class Shipped:
    """One index file written by ``ship_indexes``: where, or why not."""

    shard: str
    path: str | None
    skipped: str | None = None
    size: int = 0      # of the file written
    crc32c: int = 0    # of the file written (the manifest names it)


def ship_indexes(source: Source, indexes: list[ShardIndex], cache: IndexCache, *, fmt: str = "tfrfs",
                 out_dir: str | None = None) -> list[Shipped]:
    """Write each shard's index file next to it (or into ``out_dir``): ``NAME.tfrfs-idx``, or with
    ``fmt="dali"`` the loaders' ``NAME.idx`` text index (uncompressed shards only)."""
    from tfrfs.index import loader_files as loaderidx
    from tfrfs.format.tfrecord import NONE
    done: list[Shipped] = []
    files = source.discovery.access
    storage = source.storage
    for idx in indexes:
        shard = idx.shard
        if fmt == "dali":
            if shard.compression != NONE:
                done.append(Shipped(shard.relpath, None, f"{shard.compression} shard: the loaders' text "
                                                         "indexes are of uncompressed shards"))
                continue
            if idx.ends or (idx.count and idx.offsets[0] != 0):
                done.append(Shipped(shard.relpath, None, "damaged shard (records resume after a gap): the "
                                                         "loaders would read the damage; `tfrfs repair` it first"))
                continue
            data, suffix = loaderidx.format_lines(idx.offsets), loaderidx.CANDIDATE_SUFFIXES[0]
        else:
            data, suffix = cache.shipped_bytes(idx), idxfile.SUFFIX
        if out_dir:
            path = os.path.join(out_dir, shard.relpath + suffix)   # the source's folders, mirrored
            os.makedirs(os.path.dirname(path), exist_ok=True)
            SourceFiles(out_dir).write_bytes(path, data)
        else:
            path = beside_path(shard, suffix)
            local = storage.local_path(path)
            if local is None or not _holds(local, data):   # an index file as it is: not written (and synced) again
                files.write_bytes(path, data)
        done.append(Shipped(shard.relpath, path, size=len(data), crc32c=crc32c.crc32c(data)))
    return done


def _holds(path: str, data: bytes) -> bool:
    """Whether the local file at ``path`` holds exactly ``data``."""
    try:
        with open(path, "rb") as f:
            return os.fstat(f.fileno()).st_size == len(data) and f.read() == data
    except OSError:
        return False


def write_manifest(source: Source, indexes: list[ShardIndex], cache: IndexCache, shipped: list[Shipped],
                   schema: dict | None) -> str:
    """Write the dataset's manifest at SOURCE's root (SPEC 1.2), after its shards' index files:
    where it went."""
    disc = source.discovery
    if not disc.mirrors_dir:
        raise UsageError(f"{source.name}: a manifest is written at a dataset's root: give the folder or "
                         "prefix, not a shard or a glob")
    data = manifest.build(disc, indexes, cache, {s.shard: (s.size, s.crc32c) for s in shipped if s.path}, schema)
    where = source.storage.join(disc.root, manifest.NAME)
    disc.access.write_bytes(where, data)
    return where


# --- the indexes of a SOURCE's shards as shard jobs (``tfrfs index``, ``inspect``, ...) -------------

SourceProgress = Callable[[int, int, int, int, int], None]   # as ``index.IndexProgress``


def index_with(source: Source, runner: jobs.Runner, progress: SourceProgress | None = None,
               schema: bool = False, index_dir: str | None = None,
               memory: IndexMemory | None = None) -> tuple[list[ShardIndex], IndexCache]:
    """The indexes of SOURCE's shards, as ``index_source`` gives them: those in the cache
    or shipped beside their shards are taken here; the others are shard jobs on ``runner``
    (``schema``: with their schema's part), whose index files this process writes into the
    cache and loads from there, so the indexes are those one process makes, byte for byte. A
    remote source without Ray is indexed by threads here (its requests overlap), as before."""
    if source.manifest is not None or (source.storage.requests_overlap and not isinstance(runner, jobs.RayRunner)):
        with reading_schema() if schema else contextlib.nullcontext():
            return index_source(source, progress, index_dir, memory)
    disc = source.discovery
    shards = list(disc.shards)
    cache = IndexCache(source.cache_dir, source.readers, disc.access, index_dir, memory)
    found: dict[int, ShardIndex] = {}
    total_bytes = sum(s.size for s in shards)
    done_bytes = [0]
    records = [0]

    def done(n: int, idx: ShardIndex) -> None:
        found[n] = idx
        records[0] += idx.count
        done_bytes[0] += shards[n].size
        if progress is not None:
            progress(len(found), len(shards), records[0], done_bytes[0], total_bytes)
    cold: list[int] = []
    for n, shard in enumerate(shards):
        idx = cache.load(shard)
        if idx is not None:
            done(n, idx)
        elif cache.shipped_candidates(shard):
            done(n, cache.get(shard)[0])   # an index file beside it: read here
        else:
            cold.append(n)
    where = jobs.Where.of(source)
    todo = [(where, shards[n], schema) for n in cold]
    try:
        for n, data in zip(cold, shardjobs.gather(runner, index_job, todo)):
            cache.save_bytes(shards[n], data)
            idx = cache.load(shards[n])
            if idx is None:
                # Not usable here (a compressed shard whose stream a job on another machine made):
                # indexed again in this process.
                idx = cache.get(shards[n])[0]
            else:
                cache.scans += 1
            done(n, idx)
    finally:
        disc.access.done_indexing()
    return [found[n] for n in range(len(shards))], cache
