"""The record store: every record's bytes and view, by (shard, record), over the shard readers.

It owns what is true of records while mounted: which bytes a record holds now (those of the
edits laid over the shards in a writable mount, its ``overlay``, where it has any; else the
shard's), the bounded caches of record views and ``.bin`` contents, and what was found wrong
while reading (reported once, and remembered in the index so the next mount lists a record that
does not parse as ``.bin``). The names a changed record keeps showing are the overlay's: the
store asks it for a record's pin when it renders one (``view.overlay``).
Views come from the pure renderer (``render``); bytes come through the shard readers.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import Any, Callable, Generic, Hashable, Sequence, TypeVar, overload

from tfrfs.storage.sharing import Flights
from tfrfs.format import record_kinds
from tfrfs.format import tfrecord
from tfrfs.errors import DataLoss, Unreachable
from tfrfs.index.shard_index import ShardIndex
from tfrfs.view.nodes import Dir, InShard, RecordId
from tfrfs.view.overlay import Overlay, ShardLayer
from tfrfs.view.problems import ErrorLog
from tfrfs.storage.readers import Readers, Served, ShardReader
from tfrfs.view.render import IN_SHARD_MIN, Options, RecordView, render, render_in_shard
from tfrfs.format.tfrecord import Problem

DEFAULT_CACHE_BYTES = 256 << 20
_BIN_CACHE_BYTES = 32 << 20   # recent .bin records, read by path in 128 KiB pieces


class RecordStore:
    """Records of one mount (or one command), shard by shard; thread-safe."""

    def __init__(self, indexes: list[ShardIndex], readers: Readers, *, records: str | None = None,
                 decode_raw: bool = True, writable: bool = False, overlay: Overlay | None = None,
                 errors: ErrorLog | None = None, on_bad: Callable[[ShardIndex], None] | None = None,
                 cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.shards = indexes
        self.records_override = records
        self.kinds = _Kinds(self)   # each shard's record kind, as its index says (or --records)
        self.decode_raw = decode_raw
        self.writable = writable
        self.overlay = overlay
        self.errors = errors or ErrorLog()
        self.on_bad = on_bad   # persists a newly found unparsable record, so the next mount lists it right
        self.on_view: Callable[[Dir, int, RecordId], None] | None = None   # adds the user's scratch entries
        self._readers_factory = readers
        # Opened when a record of the shard is first read: a mount of ten thousand shards opens
        # only those it reads.
        self._readers: list[ShardReader | None] = [None] * len(indexes)
        self._opening: Flights[int, ShardReader | None] = Flights()   # each shard's opened once, by one thread
        self._lock = threading.RLock()   # the two caches, around their bookkeeping only
        self._views: CostLRU[tuple[int, RecordId], RecordView] = CostLRU(cache_bytes, lambda v: v.cost)
        self._bins: CostLRU[tuple[int, RecordId], tuple[bytes, str | None]] = \
            CostLRU(_BIN_CACHE_BYTES, lambda got: len(got[0]))
        # A record read and rendered by one thread while others ask for it: they wait for it.
        self._rendering: Flights[tuple[int, RecordId], RecordView] = Flights()
        self._reading: Flights[tuple[int, RecordId], tuple[bytes, str | None]] = Flights()

    # -- shards --------------------------------------------------------------

    def reader(self, shard: int) -> ShardReader | None:
        """Shard ``shard``'s reader (None for a shard of no record), opened when first asked for."""
        reader = self._readers[shard]   # (an item of a list: read atomically under the GIL)
        if reader is None and self.shards[shard].count:
            reader = self._opening.run(shard, lambda: self._open(shard))
        return reader

    def _open(self, shard: int) -> ShardReader | None:
        reader = self._readers[shard]   # opened by the flight that just ended?
        if reader is None:
            reader = self._readers[shard] = self._readers_factory.open(self.shards[shard].data_path)
        return reader

    def relpath(self, shard: int) -> str:
        return self.shards[shard].shard.relpath

    def shard_number(self, relpath: str) -> int | None:
        for n, idx in enumerate(self.shards):
            if idx.shard.relpath == relpath:
                return n
        return None

    def add_shard(self, idx: ShardIndex, kind: str) -> int:
        """A shard that is not among the source's files yet (a new shard of a writable mount)."""
        idx.detected_kind = kind
        self.shards.append(idx)
        self._readers.append(None)
        return len(self.shards) - 1

    def replace_shard(self, shard: int, idx: ShardIndex) -> None:
        """Read shard ``shard`` from a new file and index (after a commit): records are renumbered."""
        # (In between requests: a writable mount's commit holds its guard, a folder compared with
        # the disk (``Tree.settle``) is not read before that is done.)
        old, self._readers[shard] = self._readers[shard], None
        if old is not None:
            old.close()
        self.shards[shard].release()
        self.shards[shard] = idx
        self.forget_shard(shard)

    def forget_shard(self, shard: int) -> None:
        with self._lock:
            self._views.drop_where(lambda key: key[0] == shard)
            self._bins.drop_where(lambda key: key[0] == shard)
        if self.overlay is not None:
            self.overlay.forget_shard(shard)

    def layer(self, shard: int) -> ShardLayer | None:
        """What the overlay changes in shard ``shard`` (None: nothing, or no overlay)."""
        if self.overlay is None:
            return None
        return self.overlay.layer(self.relpath(shard))

    def options(self, shard: int) -> Options:
        return Options(self.kinds[shard], self.decode_raw, self.shards[shard].shard.mtime_ns,
                       report_shown=self.writable)

    # -- bytes ---------------------------------------------------------------

    def original(self, shard: int, index: int) -> tuple[bytes, str | None]:
        """An original record's bytes, and why they cannot be trusted (data checksum), if so."""
        idx = self.shards[shard]
        offset, length = idx.span(index)
        reader = self.reader(shard)
        assert reader is not None
        try:
            return reader.record(offset, length), None
        except Unreachable as exc:
            self._unreachable(shard, index, offset, exc)
            raise
        except DataLoss as exc:
            self.errors.add(idx.shard.relpath, index, offset, str(exc))
            try:
                return reader.record(offset, length, verify=False), str(exc)
            except DataLoss:
                return b"", str(exc)

    def record_bytes(self, shard: int, rid: RecordId) -> tuple[bytes, str | None]:
        """A record's current bytes: the overlay's if it edited or added it, else the original."""
        if self.overlay is not None:
            data = self.overlay.record(self.relpath(shard), rid)
            if data is not None:
                return data, None
        assert isinstance(rid, int)
        return self.original(shard, rid)

    def parse(self, shard: int, data: bytes) -> Any:
        return record_kinds.decode(data, self.kinds[shard])

    def message(self, shard: int, rid: RecordId) -> Any:
        """The record's current content as a mutable message (writable mounts)."""
        data, damaged = self.record_bytes(shard, rid)
        if damaged:
            raise DataLoss(damaged)
        return self.parse(shard, data)

    def bin_content(self, shard: int, rid: RecordId) -> tuple[bytes, str | None]:
        """``record_bytes``, kept for a while: a ``.bin`` record is read by path in pieces."""
        key = (shard, rid)
        with self._lock:
            hit = self._bins.get(key)
        if hit is not None:
            return hit

        def read() -> tuple[bytes, str | None]:
            with self._lock:
                got = self._bins.get(key)
            if got is None:
                got = self.record_bytes(shard, rid)
                with self._lock:
                    self._bins.put(key, got)
            return got
        return self._reading.run(key, read)

    def is_bad(self, shard: int, index: int) -> bool:
        """Whether record ``index`` does not parse (rendering it now if that is not yet known)."""
        idx = self.shards[shard]
        if index in idx.bad:
            return True
        self.view(shard, index)
        return index in idx.bad

    def serve(self, where: InShard, size: int, offset: int) -> Served:
        """``size`` bytes at ``offset`` of an image left in its shard."""
        reader = self.reader(where.shard)
        assert reader is not None
        try:
            return reader.serve(where.offset + offset, max(0, min(size, where.length - offset)))
        except Unreachable as exc:
            self._unreachable(where.shard, None, where.offset + offset, exc)
            raise

    def _unreachable(self, shard: int, index: int | None, offset: int, exc: Unreachable) -> None:
        """Report a read that failed for want of the store (a remote shard): the read fails with
        EIO, the record is not marked bad, and a later read may succeed."""
        self.errors.add(self.shards[shard].shard.relpath, index, offset, str(exc))

    # -- views ---------------------------------------------------------------

    def view(self, shard: int, rid: RecordId) -> RecordView:
        """The record's view: from the cache, else read and rendered (once, however many
        threads ask for it meanwhile)."""
        key = (shard, rid)
        with self._lock:
            hit = self._views.get(key)
        if hit is not None:
            return hit
        return self._rendering.run(key, lambda: self._render(shard, rid))

    def _render(self, shard: int, rid: RecordId) -> RecordView:
        key = (shard, rid)
        with self._lock:
            hit = self._views.get(key)   # put there by a flight that just ended?
        if hit is not None:
            return hit
        pin = self.overlay.pin(shard, rid) if self.overlay is not None else None
        view = None if self.writable else self._view_in_shard(shard, rid)
        if view is None:
            data, damaged = self.record_bytes(shard, rid)
            view = render(data, self.options(shard), damaged=damaged, pin=pin, made=isinstance(rid, str))
            if view.failure is not None:
                self._unparsable(shard, rid, view.failure, report=damaged is None)
        if pin is not None and self.overlay is not None:
            # Only what still makes a difference is kept: the rest the rules show alike, and the
            # next change takes its pin from what is shown.
            self.overlay.keep_pin(shard, rid, view.pin)
        if self.on_view is not None:
            self.on_view(view.root, shard, rid)
        with self._lock:
            self._views.put(key, view)
        return view

    def _unparsable(self, shard: int, rid: RecordId, reason: str, *, report: bool = True) -> None:
        """A record found not to parse: shown as ``.bin`` from now on, and reported (unless its
        data checksum failed: that is reported already, and explains it)."""
        idx = self.shards[shard]
        if not isinstance(rid, int) or rid in idx.bad:
            return
        offset, _ = idx.span(rid)
        if report:
            self.errors.add(idx.shard.relpath, rid, offset, reason)   # (each once)
        layer = self.layer(shard)
        if not (layer is not None and rid in layer.edited):
            if idx.note_bad(rid, Problem(offset, reason, rid) if report else None) and self.on_bad is not None:
                self.on_bad(idx)

    def _view_in_shard(self, shard: int, rid: RecordId) -> RecordView | None:
        """A large Example's view with its large images left in the shard (read-only mounts), or
        None when the record is not such a record or is damaged (then ``render`` reports it)."""
        if not isinstance(rid, int) or self.kinds[shard] != "example":
            return None
        idx = self.shards[shard]
        offset, length = idx.span(rid)
        reader = self.reader(shard)
        if length < IN_SHARD_MIN or reader is None or rid in idx.bad:
            return None
        try:
            lent = reader.borrow(rid, offset, length, following=functools.partial(self._large_span, shard),
                                 prepare=functools.partial(self._prepare, shard))
        except Unreachable as exc:
            self._unreachable(shard, rid, offset, exc)
            raise
        except DataLoss:
            return None
        try:
            if lent.prepared is not None:
                return lent.prepared[0]   # rendered on a read-ahead worker
            return render_in_shard(lent.data, self.options(shard), shard=shard, data_offset=offset + tfrecord.HEADER)
        finally:
            lent.done()

    def _large_span(self, shard: int, index: int) -> tuple[int, int] | None:
        """Where record ``index`` is, if it is one to read ahead for ``_view_in_shard``."""
        idx = self.shards[shard]
        if index >= idx.count or index in idx.bad:
            return None
        span = idx.span(index)
        return span if span[1] >= IN_SHARD_MIN else None

    def _prepare(self, shard: int, index: int, offset: int, data: memoryview) -> RecordView | None:
        # On a read-ahead worker: read-only mounts change nothing it reads, and pin no names.
        return render_in_shard(data, self.options(shard), shard=shard, data_offset=offset + tfrecord.HEADER)

    def invalidate(self, shard: int, rid: RecordId) -> None:
        with self._lock:
            self._views.pop((shard, rid))
            self._bins.pop((shard, rid))

    def note_problems(self) -> None:
        """What indexing found wrong in each shard, and its notes, into ``errors`` (each once, with
        a warning in the log): ``.tfrfs/errors`` lists them, ``tfrfs inspect`` counts them."""
        for idx in self.shards:
            for p in idx.problems:
                f = p.fields()
                self.errors.add(idx.shard.relpath, f.pop("index"), f.pop("offset"), f.pop("reason"), **f)
            for note in idx.notes:
                self.errors.add(idx.shard.relpath, None, None, note)

    def close(self, *, factory: bool = True) -> None:
        """Close the shards' readers, and (``factory``) what opened them."""
        if factory:
            self._readers_factory.close()
        for n, reader in enumerate(self._readers):
            if reader is not None:
                reader.close()
                self._readers[n] = None
        with self._lock:
            self._bins.drop_where(lambda key: True)
            self._views.drop_where(lambda key: True)


class _Kinds(Sequence[str]):
    """The record kind of each shard of a store: ``--records``, else what its index says (which
    may learn better when a shard's offsets are first loaded, see ``IndexCache.from_manifest``)."""

    def __init__(self, store: RecordStore) -> None:
        self._store = store

    @overload
    def __getitem__(self, n: int) -> str: ...
    @overload
    def __getitem__(self, n: slice) -> Sequence[str]: ...

    def __getitem__(self, n: int | slice) -> str | Sequence[str]:
        if isinstance(n, slice):
            return [self[i] for i in range(len(self))[n]]
        # The shard is looked up even when --records answers: past the last one it raises
        # IndexError, which is how iteration (``set(kinds)``) knows where to stop.
        detected = self._store.shards[n].detected_kind
        return self._store.records_override or detected

    def __len__(self) -> int:
        return len(self._store.shards)


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class CostLRU(Generic[K, V]):
    """Least recently used entries dropped first, once their costs add up past ``budget`` (the
    last entry put always stays). Not thread-safe: the store holds its lock around every call."""

    def __init__(self, budget: int, cost: Callable[[V], int]) -> None:
        self.budget = budget
        self._cost = cost
        self._entries: OrderedDict[K, V] = OrderedDict()
        self.total = 0

    def get(self, key: K) -> V | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self.pop(key)
        self._entries[key] = value
        self.total += self._cost(value)
        while self.total > self.budget and len(self._entries) > 1:
            _, old = self._entries.popitem(last=False)
            self.total -= self._cost(old)

    def pop(self, key: K) -> None:
        value = self._entries.pop(key, None)
        if value is not None:
            self.total -= self._cost(value)

    def drop_where(self, doomed: Callable[[K], bool]) -> None:
        for key in [k for k in self._entries if doomed(k)]:
            self.pop(key)

