"""Shards in a bucket or on a web server (SPEC 1.1), read in blocks through an on-disk cache.

A remote shard's bytes are fetched in aligned blocks of ``BLOCK`` bytes and kept as files in the
cache folder (``blocks/``), least recently used first out once they pass ``capacity``; a block
is fetched once however many records lie in it, and a second pass costs no request. A read
whose blocks are missing fetches them in one ranged request, so one record costs at most one
request; reads in order (a scan, ``cp -r``, large images one after the other) make the reader
fetch the next blocks ahead, in larger requests, on worker threads. Blocks are named by the
object's URL and identity: a changed object never serves old bytes.

Local paths (the decompressed streams of GZIP/ZLIB shards, which live in the cache folder) are
opened by the local readers.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from tfrfs.errors import DataLoss, Unreachable
from tfrfs.storage.fsspec_store import ObjectInfo, Store, cache_key, describe, is_url
from tfrfs.storage.readers import Borrowed, Prepare, Served, ShardReader, Spans
from tfrfs.storage.local_reader import LocalReaders

log = logging.getLogger("tfrfs")

BLOCK = 1 << 20                 # bytes a block holds (the cache's unit)
AHEAD_REQUEST = 4               # blocks per read-ahead request at first ...
AHEAD_REQUEST_MAX = 32          # ... doubling while reads stay in order (at once, for reads in order
                                # from the start: a copy, a scan), up to this. A response is held
                                # whole (twice, while the client joins it): this bounds the memory
AHEAD_WINDOW = 64               # blocks asked for ahead of the furthest read (at least two requests)
AHEAD_WORKERS = 4               # read-ahead requests in flight at most
_BEHIND = AHEAD_REQUEST_MAX     # blocks behind the furthest read that a read may touch and still be "in order"
_SKIP = 2                       # blocks a read may skip ahead and still be "in order" (a scan of headers)
DEFAULT_CACHE_SIZE = 4 << 30    # bytes of blocks kept on disk by default


Block = bytes | memoryview   # a block just fetched: a slice of the response, not copied


class BlockCache:
    """Fetched blocks as files under ``folder``, at most ``capacity`` bytes, least recently used
    out first. Shared by one mount's readers (several mounts of one cache folder each keep their
    own count, so together they may pass it)."""

    def __init__(self, folder: Path, capacity: int) -> None:
        self.folder = folder
        self.capacity = capacity
        self._lock = threading.Lock()
        self._lru: OrderedDict[tuple[str, int], int] = OrderedDict()   # (object key, block) -> bytes
        self._bytes = 0
        self.hits = 0
        self._load()

    def _load(self) -> None:
        """Blocks left by earlier mounts, oldest first."""
        found: list[tuple[float, str, int, int]] = []
        try:
            objects = list(os.scandir(self.folder))
        except OSError:
            return
        for obj in objects:
            try:
                for f in os.scandir(obj.path):
                    if f.name.isdigit():
                        st = f.stat()
                        found.append((st.st_mtime, obj.name, int(f.name), st.st_size))
            except OSError:
                continue
        for _, key, n, size in sorted(found):
            self._lru[(key, n)] = size
            self._bytes += size
        self._evict()

    def _path(self, key: str, n: int) -> str:
        return os.path.join(self.folder, key, str(n))

    def has(self, key: str, n: int) -> bool:
        with self._lock:
            return (key, n) in self._lru

    def read(self, key: str, n: int, start: int, stop: int) -> bytes | None:
        """Bytes ``start``..``stop`` of a cached block, or None when it is not (or no longer) there."""
        with self._lock:
            if (key, n) not in self._lru:
                return None
            self._lru.move_to_end((key, n))
            self.hits += 1
        try:
            fd = os.open(self._path(key, n), os.O_RDONLY)
        except OSError:
            self._forget(key, n)
            return None
        try:
            data = os.pread(fd, stop - start, start)
        finally:
            os.close(fd)
        return data if len(data) == stop - start else None

    def put(self, key: str, n: int, data: bytes | memoryview) -> None:
        if len(data) > self.capacity:
            return
        path = self._path(key, n)
        tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"   # (another mount may share the folder)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            # A full or read-only cache costs requests, never a read.
            log.debug("cannot keep block %s/%d in the cache: %s", key, n, exc)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return
        with self._lock:
            old = self._lru.pop((key, n), 0)
            self._lru[(key, n)] = len(data)
            self._bytes += len(data) - old
        self._evict()

    def _forget(self, key: str, n: int) -> None:
        with self._lock:
            self._bytes -= self._lru.pop((key, n), 0)

    def _evict(self) -> None:
        while True:
            with self._lock:
                if self._bytes <= self.capacity or not self._lru:
                    return
                (key, n), size = self._lru.popitem(last=False)
                self._bytes -= size
            try:
                os.unlink(self._path(key, n))
            except OSError:
                pass

    @property
    def size(self) -> int:
        with self._lock:
            return self._bytes


class RemoteReaders:
    """Opens URLs of one store as ``RemoteReader`` (and local paths as local readers); the readers
    share the block cache and the read-ahead workers."""

    name = "remote"

    def __init__(self, store: Store, cache_dir: Path, capacity: int = DEFAULT_CACHE_SIZE) -> None:
        self.store = store
        self.blocks = BlockCache(cache_dir / "blocks", capacity)
        self.local = LocalReaders()
        self.objects: dict[str, ObjectInfo] = {}
        self.pool = ThreadPoolExecutor(AHEAD_WORKERS, thread_name_prefix="tfrfs-fetch")
        self._inflight: dict[tuple[str, int], Future[Block]] = {}
        self._lock = threading.Lock()
        self._deferred: dict[str, tuple[int, Callable[[], object]]] = {}
        self.closed = False

    def know(self, objects: list[ObjectInfo]) -> None:
        """Objects whose size and identity a listing already gave (no look-up when opened)."""
        for obj in objects:
            self.objects[obj.url] = obj

    def defer(self, path: str, size: int, make: Callable[[], object]) -> None:
        """The local file ``path`` (a compressed shard's plain stream, ``size`` bytes) is made by
        ``make`` when it is first read."""
        self._deferred[path] = (size, make)

    def open(self, path: str) -> ShardReader:
        if not is_url(path):
            if path in self._deferred and not os.path.exists(path):
                size, make = self._deferred[path]
                return DeferredReader(self, path, size, make)
            return self.local.open(path)
        obj = self.objects.get(path)
        if obj is None:
            from tfrfs.storage.fsspec_store import object_info
            info = self.store.info(path)
            obj = object_info(self.store, {**info, "name": info.get("name", self.store.path_of(path))})
            obj = ObjectInfo(path, obj.size, obj.identity, obj.mtime_ns)   # asked anew each time
        return RemoteReader(self, obj)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.local.close()
        log.info("remote reads: %s; %d block reads from the cache (%.1f MiB cached)", self.store.stats(),
                 self.blocks.hits, self.blocks.size / 2**20)

    # -- fetching ----------------------------------------------------------------

    def fetch(self, reader: RemoteReader, first: int, last: int) -> dict[int, Block]:
        """Blocks ``first``..``last`` of ``reader``'s object that are neither cached nor being
        fetched, in one ranged request; the blocks others are fetching are waited for. Returns the
        blocks it has in memory (the caller reads the rest from the cache)."""
        key = reader.key
        mine: list[int] = []
        waits: dict[int, Future[Block]] = {}
        with self._lock:
            for n in range(first, last + 1):
                if (key, n) in self._inflight:
                    waits[n] = self._inflight[(key, n)]
                elif not self.blocks.has(key, n):
                    mine.append(n)
            if mine:
                lo, hi = mine[0], mine[-1]   # one request: blocks in between that are cached come again
                mine = list(range(lo, hi + 1))
                futures = {}
                for n in mine:
                    if (key, n) not in self._inflight:
                        fut: Future[Block] = Future()
                        self._inflight[(key, n)] = fut
                        futures[n] = fut
        got: dict[int, Block] = {}
        if mine:
            got = self._get(reader, mine[0], mine[-1], futures)
        for n, fut in waits.items():
            got[n] = fut.result()
        return got

    def _get(self, reader: RemoteReader, lo: int, hi: int, futures: dict[int, Future[Block]]) -> dict[int, Block]:
        key = reader.key
        start, end = lo * BLOCK, min((hi + 1) * BLOCK, reader.size)
        try:
            data = self.store.read_range(reader.url, start, end)
        except BaseException as exc:
            with self._lock:
                for n, fut in futures.items():
                    self._inflight.pop((key, n), None)
                    fut.set_exception(exc)
            raise
        view = memoryview(data)
        got: dict[int, Block] = {}
        for n in range(lo, hi + 1):
            block = view[(n - lo) * BLOCK:(n - lo + 1) * BLOCK]   # no copy: the response's memory
            got[n] = block
            self.blocks.put(key, n, block)
        with self._lock:
            for n, fut in futures.items():
                self._inflight.pop((key, n), None)
                fut.set_result(got[n])
        return got

    def ahead(self, reader: RemoteReader, lo: int, hi: int) -> None:
        """Fetch blocks ``lo``..``hi`` of ``reader``'s object on a worker (those not there yet)."""
        while lo <= hi and (self.blocks.has(reader.key, lo) or self._busy(reader.key, lo)):
            lo += 1   # the run's first blocks are there already
        if lo <= hi:
            try:
                self.pool.submit(self._ahead_one, reader, lo, hi)
            except RuntimeError:   # shutting down
                pass

    def _busy(self, key: str, n: int) -> bool:
        with self._lock:
            return (key, n) in self._inflight

    def _ahead_one(self, reader: RemoteReader, lo: int, hi: int) -> None:
        try:
            self.fetch(reader, lo, hi)
        except Exception as exc:  # noqa: BLE001 - the read that needs the block reports it
            log.debug("read-ahead of %s blocks %d-%d failed: %s", reader.url, lo, hi, exc)


class DeferredReader(ShardReader):
    """A compressed remote shard's plain stream, fetched and inflated into the cache when first
    read (a shipped index told its offsets at mount, with no download)."""

    def __init__(self, owner: RemoteReaders, path: str, size: int, make: Callable[[], object]) -> None:
        self.owner = owner
        self.path = path
        self.size = size
        self.identity = f"deferred:{path}"
        self._make = make
        self._real: ShardReader | None = None
        self._lock = threading.Lock()

    def _stream(self) -> ShardReader:
        real = self._real   # (one read of an attribute: atomic under the GIL)
        if real is not None:
            return real
        with self._lock:   # one thread fetches and inflates; the others wait for it
            if self._real is None:
                if not os.path.exists(self.path):
                    log.info("fetching and inflating %s", self.path)
                    try:
                        self._make()
                    except (DataLoss, Unreachable):
                        raise
                    except Exception as exc:  # noqa: BLE001 - the store's own errors
                        raise Unreachable(f"cannot fetch the compressed shard: {describe(exc)}") from exc
                real = self.owner.local.open(self.path)
                if real.size != self.size:
                    real.close()
                    raise DataLoss(f"the inflated shard has {real.size} bytes, its index says {self.size}")
                self._real = real
            return self._real

    def pread(self, size: int, offset: int) -> bytes:
        return self._stream().pread(size, offset)

    def fileno(self) -> int | None:
        return self._stream().fileno()

    def record(self, offset: int, length: int, *, verify: bool = True) -> bytes:
        return self._stream().record(offset, length, verify=verify)

    def borrow(self, index: int, offset: int, length: int, *, following: Spans | None = None,
               prepare: Prepare | None = None) -> Borrowed:
        return self._stream().borrow(index, offset, length, following=following, prepare=prepare)

    def serve(self, offset: int, size: int) -> Served:
        return self._stream().serve(offset, size)

    def close(self) -> None:
        with self._lock:
            if self._real is not None:
                self._real.close()
                self._real = None


class RemoteReader(ShardReader):
    """One remote object's bytes, through the block cache."""

    reads_are_requests = True

    def __init__(self, owner: RemoteReaders, obj: ObjectInfo) -> None:
        self.owner = owner
        self.url = obj.url
        self.size = obj.size
        self.identity = obj.identity
        self.key = cache_key(obj.url, f"{obj.identity}:{BLOCK}")
        self.blocks = (obj.size + BLOCK - 1) // BLOCK
        self._next = -1          # the block a read in order would start in
        self._streak = 0
        self._ahead_until = 0    # blocks before this one have been asked for ahead
        self._run_start = -1     # the first block of the reads in order
        self._lock = threading.Lock()

    def pread(self, size: int, offset: int) -> bytes:
        end = min(offset + size, self.size)
        if end <= offset:
            return b""
        first, last = offset // BLOCK, (end - 1) // BLOCK
        self._follow(first, last)
        got: dict[int, Block] = {}
        parts: list[bytes] = []
        for n in range(first, last + 1):
            lo = offset - n * BLOCK if n == first else 0
            hi = end - n * BLOCK if n == last else min(BLOCK, self.size - n * BLOCK)
            part = None if n in got else self.owner.blocks.read(self.key, n, lo, hi)
            if part is None:
                if n not in got:
                    got.update(self.owner.fetch(self, n, last))
                block = got.get(n)
                if block is None:   # fetched by another thread and already evicted: ask again
                    block = self.owner.store.read_range(self.url, n * BLOCK, min((n + 1) * BLOCK, self.size))
                part = bytes(block[lo:hi])
            parts.append(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _follow(self, first: int, last: int) -> None:
        """Notice reads in order; from the second block on, keep the next blocks coming, in
        requests that grow while the reads stay in order (a request to a store costs its
        latency, and on some servers time in proportion to the object, whatever its length)."""
        with self._lock:
            if self._next >= 0 and first <= self._next + _SKIP and last + 1 >= self._next:
                if last + 1 > self._next:          # reaches past the blocks read so far
                    self._streak += 1
                    self._next = last + 1
            elif not self._next - _BEHIND <= first < self._next:
                self._streak = 0                   # elsewhere; only a read just behind (a file
                self._next = last + 1              # of the record read last) keeps the streak
                self._ahead_until = 0
                self._run_start = first
            streak = self._streak
            whole = self._run_start == 0           # read in order from the start: a copy or a scan
        if streak >= 2 and last + 1 < self.blocks:
            request = AHEAD_REQUEST_MAX if whole else min(AHEAD_REQUEST << (streak // 8), AHEAD_REQUEST_MAX)
            self._keep_ahead(last + 1, request)

    def _keep_ahead(self, first: int, request: int) -> None:
        """Keep the window of blocks from ``first`` on asked for, ``request`` blocks a request. A
        request goes out whole once the blocks asked for before it run short, so requests stay
        large however little each read moves on."""
        window = max(min(AHEAD_WINDOW, AHEAD_WORKERS * request), 2 * request)
        while True:
            with self._lock:
                start = max(self._ahead_until, first)
                if start >= self.blocks or start - first > window - request:
                    return
                hi = min(start + request, self.blocks) - 1
                self._ahead_until = hi + 1
            self.owner.ahead(self, start, hi)

    def close(self) -> None:
        pass


__all__ = ["BLOCK", "BlockCache", "DEFAULT_CACHE_SIZE", "DeferredReader", "RemoteReader", "RemoteReaders"]
