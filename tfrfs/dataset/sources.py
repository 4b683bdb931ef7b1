"""SOURCE as the user names it — a local path or glob, or a URL (SPEC 1, 1.1) — opened into what
every command works from: the ``Discovery`` of its shards, plain files and folders, and the shard
readers to read them with. ``index_source`` then indexes its shards (from the cache, a shipped
index file, or a scan).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c

from tfrfs.index import idxfile
from tfrfs.jobs import runner as jobs
from tfrfs.index import manifest
from tfrfs.errors import UsageError
from tfrfs.index.discovery import Discovery, ShardFile, SourceFiles, discover
from tfrfs.index.cache_dir import default_cache_dir
from tfrfs.index.shard_index import IndexCache, IndexProgress, ShardIndex
from tfrfs.jobs.indexing import index_shards
from tfrfs.index.memory import IndexMemory
from tfrfs.index.manifest import Manifest
from tfrfs.storage.base import ObjectInfo, Storage
from tfrfs.storage.factory import open_storage
from tfrfs.storage.readers import Readers, default_readers
from tfrfs.index.storage_discovery import discover_in, manifest_discovery, read_manifest
from tfrfs.index.where import Where

log = logging.getLogger("tfrfs")

REMOTE_INDEX_WORKERS = 32   # remote shards indexed at a time (their requests overlap; the blocks of
                            # scans share the readers' four fetch workers)


@dataclass(eq=False)
class Source:
    """An opened SOURCE."""

    name: str                  # as the user gave it
    discovery: Discovery
    readers: Readers
    cache_dir: Path
    manifest: Manifest | None = None   # what the dataset's manifest says, when it was mounted from one

    _storage: Storage | None = field(default=None, repr=False)

    @property
    def local_root(self) -> str | None:
        """The local folder that holds the source (where edits are staged), None for a store's."""
        return self.storage.local_path(self.discovery.root)

    @property
    def storage(self) -> Storage:
        """Where the source's bytes live (the storage it was opened with is shared)."""
        if self._storage is None:
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
    # Objects in a store, listed (or named by the manifest) and read through the storage.
    from tfrfs.storage.remote_reader import RemoteReaders
    remote_readers = storage.open_readers(cache, cache_size)
    assert isinstance(remote_readers, RemoteReaders)
    found = None
    try:
        found = read_manifest(storage, source) if use_manifest else None
        disc = manifest_discovery(storage, source, cache, found) if found is not None else \
            discover_in(storage, source, cache)
    except BaseException:
        remote_readers.close()
        raise
    remote_readers.know([ObjectInfo(s.path, s.size, s.identity, s.mtime_ns) for s in disc.shards])
    return Source(source, disc, remote_readers, cache, manifest=found, _storage=storage)


def index_source(source: Source, progress: IndexProgress | None = None, index_dir: str | None = None,
                 memory: IndexMemory | None = None, *, runner: jobs.Runner | None = None,
                 schema: bool = False) -> tuple[list[ShardIndex], IndexCache]:
    """The indexes of SOURCE's shards (cached, shipped or built now; from its manifest, only what
    the manifest says until a shard is touched), and the cache that gave them. The shards built
    now are ``indexing.index_job``s (``schema``: with their schema's part) on ``runner``, or by
    default on a local pool when worth it, or in threads for a store (see ``index_shards``)."""
    disc = source.discovery
    cache = IndexCache(source.cache_dir, source.readers, disc.access, index_dir, memory)
    if source.manifest is not None:
        indexes = [cache.from_manifest(shard, e.kind, e.count, e.summary)
                   for shard, e in zip(disc.shards, source.manifest.shards)]
        if progress is not None:
            progress(len(indexes), len(indexes), sum(i.count for i in indexes), 0, 0)
        return indexes, cache
    workers = REMOTE_INDEX_WORKERS if source.storage.requests_overlap else 1
    try:
        return index_shards(disc.shards, cache, Where.of(source), progress, runner=runner, schema=schema,
                            workers=workers), cache
    finally:
        disc.access.done_indexing()


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
    before = source.manifest if source.manifest is not None else _manifest_at(source)
    data = manifest.build(disc, indexes, cache, {s.shard: (s.size, s.crc32c) for s in shipped if s.path}, schema,
                          before)
    where = source.storage.join(disc.root, manifest.NAME)
    disc.access.write_bytes(where, data)
    return where


def _manifest_at(source: Source) -> manifest.Manifest | None:
    """The dataset's manifest, where it has one (a source opened by listing)."""
    try:
        return manifest.parse(source.storage.read(source.storage.join(source.discovery.root, manifest.NAME)))
    except (OSError, manifest.ManifestError):
        return None
