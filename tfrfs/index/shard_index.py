"""The compact record index of each shard, and the cache that keeps it.

A shard's index is the header offset of every record (plus the end of the
last one) in an ``array('Q')``: 8 bytes a record in memory, 4 in its file
(``idxfile``). It is found from record headers alone and persisted in a cache
directory, keyed by the shard's absolute path or URL and validated against its
size and identity, so mounting an already-indexed dataset only reads the cache;
an index file shipped beside a shard that matches it saves the scan too.
GZIP and ZLIB shards are decompressed once into the cache, because a deflate
stream cannot be read at an offset; offsets then refer to that plain stream,
as SPEC 5 asks.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import struct
import tempfile
import threading
from array import array
from pathlib import Path
from typing import Callable, Iterable, Iterator

from tfrfs.storage.sharing import KeyedLocks
from tfrfs.index.cache_dir import default_cache_dir
from tfrfs.index import idxfile
from tfrfs.storage import durable
from tfrfs.format.record_kinds import choose_kind, parse_problem
from tfrfs.format import salvage
from tfrfs.format import tfrecord
from tfrfs.errors import DataLoss
from tfrfs.index.memory import Droppable, IndexMemory
from tfrfs.storage.readers import Readers, ShardReader, default_readers
from tfrfs.index.shardschema import Tally
from tfrfs.format.tfrecord import Problem

from tfrfs.index.discovery import ShardFile, SourceFiles, shipped_names

log = logging.getLogger("tfrfs")


# --- the index ---------------------------------------------------------------

class ShardIndex:
    """Record offsets of one shard, and what was learned about it while indexing.

    The offsets are either held (an index just built) or loaded when first needed through
    ``loader`` (a map of the shard's index file) and then held within ``memory``'s budget, which
    may drop them again (SPEC 1.2): ``count`` and the rest of what indexing learned are known
    without them. ``tally`` may be loaded late too (``header``: the index file's header).
    """

    def __init__(self, shard: ShardFile, data_path: str, offsets: idxfile.Offsets | None, detected_kind: str,
                 problems: list[Problem] | None = None, bad: set[int] | None = None,
                 notes: list[str] | None = None, ends: dict[int, int] | None = None, tally: Tally | None = None,
                 *, count: int | None = None, loader: Callable[[], idxfile.Offsets] | None = None,
                 header: Callable[[], Tally | None] | None = None, memory: IndexMemory | None = None,
                 checked: tuple[int, ...] | None = None) -> None:
        if offsets is None and (loader is None or count is None):
            raise ValueError("an index without offsets needs their count and a loader")
        self.shard = shard
        self.data_path = data_path                 # plain stream to read records from
        self.detected_kind = detected_kind
        self.problems: list[Problem] = problems if problems is not None else []
        self.bad: set[int] = bad if bad is not None else set()   # records known not to parse or verify
        self.notes: list[str] = notes if notes is not None else []   # index files ignored (not persisted)
        # Where a record ends when damage follows it (SPEC 6): the next record starts at
        # ``offsets[index + 1]``, after the gap. One entry per gap, none in a sound shard.
        self.ends: dict[int, int] = ends if ends is not None else {}
        self._count: int = len(offsets) - 1 if offsets is not None else (count or 0)
        self.origin: str | None = None   # the index file beside the shard it came from, if any
        self._offsets = offsets
        self._loader = loader
        self._memory = memory if loader is not None else None
        self._lock = threading.Lock()        # loading and dropping the offsets
        self._learning = threading.Lock()    # what is learned while mounted (``note_bad``); taken alone
        self._tally_lock = threading.Lock()
        # What the records hold (the schema's part of this shard), once read: kept in the index file.
        self._tally = tally
        self._header = header if tally is None else None
        # When every record's data checksum was checked while indexing: the records whose
        # checksum failed (so a copy need not check them again: ``tfrfs reshard``). None: not checked.
        self.checked = checked
        self.stream_size: int | None = None   # a compressed shard's plain stream's, known before it is made

    def __repr__(self) -> str:
        return f"ShardIndex({self.shard.relpath!r}, {self._count} records, {self.detected_kind})"

    @property
    def count(self) -> int:
        return self._count

    @property
    def offsets(self) -> idxfile.Offsets:
        """Header offsets of every record, plus the end of the last one (loaded if need be).

        Thread-safe: the offsets are loaded once however many threads ask at once (the others
        wait for them under the index's lock), and what ``memory`` counts is what is held: both
        change together under that lock. The offsets a caller got stay valid after a drop."""
        held = self._offsets   # (one read of an attribute: atomic under the GIL)
        if held is not None:
            if self._memory is not None:
                self._memory.used(self)
            return held
        doomed: list[Droppable] = []
        with self._lock:
            held = self._offsets
            if held is None:
                assert self._loader is not None
                held = self._loader()
                if len(held) != self._count + 1:
                    raise DataLoss(f"{self.shard.relpath}: its index now holds {len(held) - 1} records, "
                                   f"{self._count} when it was mounted")
                self._offsets = held
                if self._memory is not None:
                    doomed = self._memory.take(self, len(held) * held.itemsize)
        for other in doomed:   # others' locks are taken with this one let go
            other.drop_offsets()
        return held

    def peek_offsets(self) -> idxfile.Offsets:
        """The offsets, loaded if need be but not held (for a caller that keeps them itself)."""
        held = self._offsets
        if held is not None:
            return held
        assert self._loader is not None
        return self._loader()

    @property
    def loaded(self) -> bool:
        """Whether the offsets are in memory now."""
        return self._offsets is not None

    def drop_offsets(self) -> None:
        """Let the offsets go (they are loaded again when next needed); kept when they cannot be."""
        if self._loader is not None:
            with self._lock:
                self._offsets = None
                if self._memory is not None:
                    self._memory.forget(self)

    def release(self) -> None:
        """This index is no longer served (its shard was written anew): its memory is freed."""
        if self._memory is not None:
            self._memory.forget(self)

    @property
    def tally(self) -> Tally | None:
        if self._header is None:
            return self._tally
        with self._tally_lock:   # read once; a caller meanwhile waits for it
            if self._header is not None:
                read, self._header = self._header, None
                try:
                    self._tally = read()
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    log.debug("%s: the schema kept in its index is not read: %s", self.shard.relpath, exc)
            return self._tally

    @tally.setter
    def tally(self, value: Tally | None) -> None:
        with self._tally_lock:   # not overwritten by a read of the header under way
            self._header = None
            self._tally = value

    def note_bad(self, index: int, problem: Problem | None) -> bool:
        """Record ``index`` was found not to parse (``problem``: and is to be listed among the
        shard's problems); False if that was known already. ``bad`` and ``problems`` are
        replaced, never changed in place, so whoever goes through them meanwhile (a listing, a
        save, the schema's jobs) sees them whole."""
        with self._learning:
            if index in self.bad:
                return False
            self.bad = self.bad | {index}
            if problem is not None:
                self.problems = [*self.problems, problem]
            return True

    def learned(self) -> tuple[list[Problem], list[int]]:
        """(problems, bad records) as they are now, sorted, for a save."""
        with self._learning:
            problems, bad = self.problems, self.bad
        return list(problems), sorted(bad)

    def learn_from(self, other: ShardIndex) -> None:
        """What an index made of the shard itself says, where it differs from this one's (the
        manifest's): its kind and gaps, its bad records and problems added."""
        with self._learning:
            self.detected_kind, self.ends = other.detected_kind, other.ends
            self.bad = self.bad | other.bad
            self.problems = [*self.problems, *other.problems]

    def span(self, index: int) -> tuple[int, int]:
        """(header offset, data length) of record ``index``."""
        offsets = self.offsets
        start = offsets[index]
        end = self.ends.get(index) if self.ends else None
        return start, (offsets[index + 1] if end is None else end) - start - tfrecord.OVERHEAD

    def runs(self, indexes: Iterable[int]) -> Iterator[tuple[int, int]]:
        """Byte ranges [start, end) holding the framed records ``indexes`` (ascending), adjacent
        records in one range: what a copy of them reads."""
        offsets = self.offsets
        ends = self.ends
        start = end = 0
        open_run = False
        for i in indexes:
            s = offsets[i]
            stop = ends.get(i) if ends else None
            e = offsets[i + 1] if stop is None else stop
            if open_run and s != end:
                yield start, end
                open_run = False
            if not open_run:
                start, open_run = s, True
            end = e
        if open_run:
            yield start, end


def _cache_key(shard: ShardFile) -> str:
    return hashlib.sha256(shard.path.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _sample_records(reader: ShardReader, idx: ShardIndex) -> Iterator[bytes]:
    """Non-empty records with sound checksums, from the start; bad ones are noted on the way."""
    problems, bad = idx.problems, idx.bad
    for i in range(idx.count):
        start, length = idx.span(i)
        if length == 0:
            continue
        try:
            yield reader.record(start, length)
        except DataLoss as exc:
            problems.append(Problem(start, str(exc), i))
            # Still listed as a folder if it parses (its reads fail with EIO); else shown as .bin.
            data = reader.record(start, length, verify=False)
            if parse_problem(data, "example") and parse_problem(data, "sequence"):
                bad.add(i)


class IndexCache:
    """Shard indexes: loaded from the local cache (keyed by the shard's path or URL, validated
    against its size and identity), else from an index file shipped beside it (``shipped``) when
    that matches, else built from the shard's headers. Built and shipped ones are saved to the
    cache. Shards are read through ``readers``; other files (shipped indexes, compressed streams)
    through ``files``."""

    def __init__(self, cache_dir: Path | str | None = None, readers: Readers | None = None,
                 files: SourceFiles | None = None, index_dir: str | None = None,
                 memory: IndexMemory | None = None) -> None:
        self.dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.readers = readers or default_readers()
        self.files = files or SourceFiles("/")
        self.index_dir = index_dir
        self.memory = memory or IndexMemory()   # offsets held at once, of every index this gives
        self.scans = 0       # shards indexed from their headers (not from a cache or shipped index)
        self._scans_lock = threading.Lock()   # (``+=`` is a read and a write: two threads may meet between)
        self._saving: KeyedLocks[str] = KeyedLocks()

    def _paths(self, shard: ShardFile) -> tuple[Path, Path]:
        key = _cache_key(shard)
        return self.dir / "index" / f"{key}.idx", self.dir / "streams" / f"{key}.raw"

    def load(self, shard: ShardFile) -> ShardIndex | None:
        """The cached index of ``shard`` when it matches: its header is read now, its offsets
        when first needed."""
        idx_path, _ = self._paths(shard)
        try:
            meta = idxfile.read_header(str(idx_path))
        except (OSError, idxfile.IndexFileError):
            return None
        if meta.get("path") != shard.path or not _matches(meta, shard):
            return None
        return self._from_meta(shard, meta, None, self._cached_offsets(shard, str(idx_path), meta))

    def _cached_offsets(self, shard: ShardFile, path: str, meta: dict) -> Callable[[], idxfile.Offsets]:
        """How the offsets of a cached index are loaded (again): the file mapped; should it have
        gone or changed, the shard is indexed again."""
        def load() -> idxfile.Offsets:
            try:
                got, offsets = idxfile.map_file(path)
                if got.get("crc") == meta.get("crc") and _matches(got, shard):
                    return offsets
                reason = "it was replaced"
            except (OSError, idxfile.IndexFileError) as exc:
                reason = str(exc)
            log.warning("%s: its cached index cannot be read again (%s): the shard is indexed again",
                        shard.relpath, reason)
            idx = self.build(shard)
            self.save(idx)
            return idx.offsets
        return load

    def _from_meta(self, shard: ShardFile, meta: dict, offsets: idxfile.Offsets | None,
                   loader: Callable[[], idxfile.Offsets] | None = None) -> ShardIndex | None:
        data_path = shard.path
        if shard.compression != tfrecord.NONE:
            _, raw_path = self._paths(shard)
            data_path = str(raw_path)
            try:
                if os.path.getsize(raw_path) != meta["stream_size"]:
                    return None
            except OSError:
                defer = getattr(self.readers, "defer", None)
                if defer is None:
                    return None
                # A remote shard: fetched and inflated when one of its records is first read.
                defer(data_path, meta["stream_size"], lambda: self._decompress(shard))
        try:
            problems = [Problem.from_fields(p) for p in meta["problems"]]
            ends = {int(i): int(end) for i, end in meta["gaps"]}
            idx = ShardIndex(shard, data_path, offsets, meta["kind"], problems, set(meta["bad"]), ends=ends,
                             count=int(meta["count"]), loader=loader, memory=self.memory,
                             header=functools.partial(_tally_of, meta) if "schema" in meta else None,
                             checked=tuple(int(i) for i in meta["checked"]) if "checked" in meta else None)
            idx.stream_size = int(meta["stream_size"])
            return idx
        except (KeyError, TypeError, ValueError):
            return None

    def meta(self, idx: ShardIndex) -> dict:
        problems, bad = idx.learned()
        return {
            "shard": os.path.basename(idx.shard.relpath), "size": idx.shard.size, "identity": idx.shard.identity,
            "compression": idx.shard.compression, "kind": idx.detected_kind,
            "stream_size": idx.shard.size if idx.shard.compression == tfrecord.NONE else
            idx.stream_size if idx.stream_size is not None and not os.path.exists(idx.data_path) else
            os.path.getsize(idx.data_path),
            "problems": [p.fields() for p in problems],
            "bad": bad,
            "gaps": sorted(idx.ends.items()),
            **({"schema": idx.tally.to_json()} if idx.tally is not None and idx.tally.kind == idx.detected_kind
               else {}),
            **({"checked": list(idx.checked)} if idx.checked is not None else {}),
        }

    def save(self, idx: ShardIndex) -> None:
        # One save of a shard at a time, each of the index as it is when its turn comes: two
        # threads that each found a record bad end with both in the file, whichever writes last.
        try:
            offsets = idx.offsets   # first, with no lock held: loading them may save an index of the shard
            with self._saving(idx.shard.path):
                self.save_bytes(idx.shard, idxfile.dump(dict(self.meta(idx), path=idx.shard.path), offsets))
        except OSError:
            pass   # as ``save_bytes``: the stream of a compressed shard is gone from the cache

    def entry_bytes(self, idx: ShardIndex) -> bytes:
        """The cache entry of ``idx``, as ``save`` writes it (a shard job sends these back)."""
        return idxfile.dump(dict(self.meta(idx), path=idx.shard.path), idx.offsets)

    def save_bytes(self, shard: ShardFile, data: bytes) -> None:
        """Write ``data`` (``entry_bytes``) as the cache entry of ``shard``."""
        idx_path, _ = self._paths(shard)
        try:
            idx_path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=idx_path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, idx_path)
        except OSError:
            # The cache only saves time; a mount works without it.
            pass

    def shipped_bytes(self, idx: ShardIndex) -> bytes:
        """The ``NAME.tfrfs-idx`` file to ship beside the shard."""
        return idxfile.dump(self.meta(idx), idx.offsets)

    # -- a dataset's manifest (SPEC 1.2) --------------------------------------------

    def from_manifest(self, shard: ShardFile, kind: str, count: int, summary: dict) -> ShardIndex:
        """The index of a shard as the dataset's manifest gives it: nothing is read now. Its
        offsets come, when first needed, from the cache or the index file beside it (checked
        against the shard as any shipped index is), or else from a scan; its tally from the
        header of either."""
        data_path = shard.path if shard.compression == tfrecord.NONE else str(self._paths(shard)[1])

        def offsets() -> idxfile.Offsets:
            idx, _ = self.get(shard)   # a local NAME.tfrfs-idx that matches is mapped in place
            if (idx.count, idx.detected_kind, idx.ends, idx.bad) != (count, kind, ends, lazy.bad):
                # The shard is not what the manifest says, though its size and identity are (a
                # copy that kept both): what the shard holds wins (a count that differs is refused
                # by the caller: the records are listed already).
                log.warning("%s: differs from the manifest though its size and time match: %d records as %s "
                            "(the manifest: %d as %s); tfrfs index --beside writes it anew",
                            shard.relpath, idx.count, idx.detected_kind, count, kind)
                lazy.learn_from(idx)
            return idx.peek_offsets()
        problems = [Problem.from_fields(p) for p in summary["problems"]]
        ends = {int(i): int(end) for i, end in summary["gaps"]}
        lazy = ShardIndex(shard, data_path, None, kind, problems, set(summary["bad"]), ends=ends, count=count,
                          loader=offsets, memory=self.memory,
                          header=functools.partial(self._shipped_tally, shard, kind))
        return lazy

    def _shipped_tally(self, shard: ShardFile, kind: str) -> Tally | None:
        """A shard's tally from the header of its cached or shipped index, or None."""
        cached = self.load(shard)
        if cached is not None:
            return cached.tally
        for path, files in self.shipped_candidates(shard):
            if not path.endswith(idxfile.SUFFIX):
                continue
            try:
                meta = _header_of(files, path)
            except (OSError, idxfile.IndexFileError):
                continue
            if _matches(meta, shard) and meta.get("kind") == kind and "schema" in meta:
                return _tally_of(meta)
        return None

    # -- shipped indexes -------------------------------------------------------------

    def shipped_candidates(self, shard: ShardFile) -> list[tuple[str, SourceFiles]]:
        """Index files that may be the shard's, and what reads each: beside the shard (through
        the source), then in ``index_dir`` (a local folder)."""
        found = [(path, self.files) for path in shard.shipped]
        if self.index_dir:
            # As ``tfrfs index --out-dir`` writes them: the source's folders mirrored, or flat.
            local = SourceFiles(self.index_dir)
            name = os.path.basename(shard.relpath)
            for folder in dict.fromkeys((os.path.join(self.index_dir, os.path.dirname(shard.relpath)),
                                         self.index_dir)):
                try:
                    present = set(os.listdir(folder))
                except OSError:
                    continue
                found += [(os.path.join(folder, n), local) for n in shipped_names(name, present)]
        return found

    def _local_file(self, shard: ShardFile, path: str) -> str | None:
        """A shipped index file ``path`` as a local file to read in place, or None: one in
        ``index_dir`` is local; one beside the shard is when the source's storage is."""
        return self.files.local_path(path) if path in shard.shipped else path

    def from_shipped(self, shard: ShardFile) -> tuple[ShardIndex | None, list[str]]:
        """The index of an index file beside the shard (or in ``index_dir``) that matches it, and
        why the others found were ignored."""
        from tfrfs.index import loader_files as loaderidx
        ignored: list[str] = []
        for path, files in self.shipped_candidates(shard):
            try:
                data = files.read_bytes(path)
            except OSError as exc:
                ignored.append(f"index file {path} ignored: cannot read it: {exc}")
                continue
            try:
                if data.startswith(idxfile.MAGIC):
                    meta, offsets = idxfile.load(data)
                    if not _matches(meta, shard):
                        ignored.append(f"index file {path} ignored: it is of another version of the shard "
                                       f"(size {meta.get('size')}, {meta.get('identity')}; the shard: "
                                       f"size {shard.size}, {shard.identity})")
                        continue
                    idx = self._shipped_stream(shard, meta, offsets)
                elif shard.compression == tfrecord.NONE:
                    idx = self._from_loader(shard, loaderidx.parse(data, stream_size=shard.size))
                else:
                    ignored.append(f"index file {path} ignored: an OFFSET LENGTH index is of an uncompressed "
                                   f"shard, this one is {shard.compression}")
                    continue
            except (ValueError, OSError) as exc:
                ignored.append(f"index file {path} ignored: it does not fit the shard: {exc}")
                continue
            if idx is not None:
                log.info("%s: using the index file %s", shard.relpath, path)
                idx.origin = path
                return idx, ignored
        return None, ignored

    def _shipped_stream(self, shard: ShardFile, meta: dict, offsets: array) -> ShardIndex | None:
        if shard.compression != tfrecord.NONE and not hasattr(self.readers, "defer"):
            self._decompress(shard)   # the offsets are of the plain stream
        idx = self._from_meta(shard, meta, offsets)
        # (A compressed shard's sample is checked when its stream is made: see readers.remote.)
        if idx is not None and shard.compression == tfrecord.NONE and not self.sample_holds(idx.data_path, offsets,
                                                                                            idx.ends):
            raise ValueError("a record header at an indexed offset does not check")
        return idx

    def _from_loader(self, shard: ShardFile, offsets: array) -> ShardIndex:
        if not self.sample_holds(shard.path, offsets, {}):
            raise ValueError("a record header at an indexed offset does not check")
        idx = ShardIndex(shard, shard.path, offsets, "example")
        reader = self.readers.open(shard.path)
        try:
            idx.detected_kind = choose_kind(_sample_records(reader, idx))
        finally:
            reader.close()
        return idx

    def sample_holds(self, data_path: str, offsets: idxfile.Offsets, ends: dict[int, int]) -> bool:
        """Whether the headers of a few indexed records (the first, one in the middle, the last)
        check and give the indexed lengths: an index of another version of the shard, with the
        same size and count, is caught here (SPEC 1.2). In a bucket each costs a request: the
        last record's alone is checked there (the others are checked as they are read)."""
        count = len(offsets) - 1
        if count <= 0:
            return True
        reader = self.readers.open(data_path)
        try:
            for i in sorted({count - 1} if reader.reads_are_requests else {0, count // 2, count - 1}):
                start = offsets[i]
                end = ends.get(i, offsets[i + 1])
                if tfrecord.parse_header(reader.pread(tfrecord.HEADER, start)) != end - start - tfrecord.OVERHEAD:
                    return False
            return True
        finally:
            reader.close()

    # -- building ----------------------------------------------------------------------

    def _decompress(self, shard: ShardFile) -> tuple[str, Problem | None]:
        """Inflate a GZIP/ZLIB shard into the cache: (the stream's path, the problem that ended it)."""
        _, raw_path = self._paths(shard)
        raw_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=raw_path.parent, prefix=".tmp-")
        with durable.removed_on_failure(tmp):
            with os.fdopen(fd, "wb") as out, self.files.open_stream(shard.path) as src:
                problem = salvage.inflate(src, out, shard.compression)
            os.replace(tmp, raw_path)
        return str(raw_path), problem

    def build(self, shard: ShardFile, seen: salvage.Seen | None = None) -> ShardIndex:
        """Index ``shard`` from its headers (decompressing it into the cache first if needed);
        ``seen``: shown each block the walk reads (``Walk.offsets``)."""
        data_path = shard.path
        stream_problem = None
        with self._scans_lock:
            self.scans += 1
        if shard.compression != tfrecord.NONE:
            data_path, stream_problem = self._decompress(shard)
        reader = self.readers.open(data_path)
        try:
            walk = salvage.Walk(reader.pread, reader.size)
            offsets = walk.offsets(seen)
            offsets.append(walk.end if walk.count else 0)
            idx = ShardIndex(shard, data_path, offsets, "example",
                             salvage.merge_stream_problem(stream_problem, walk), ends=walk.ends)
            idx.detected_kind = choose_kind(_sample_records(reader, idx))
        finally:
            reader.close()
        idx.problems.sort(key=lambda p: p.offset)
        return idx

    def get(self, shard: ShardFile) -> tuple[ShardIndex, bool]:
        """The index of ``shard`` and whether it came from the cache or a shipped index file.
        One built or taken from a shipped file is saved to the cache and served from there: its
        offsets are then loaded only when needed."""
        idx = self.load(shard)
        if idx is not None:
            return idx, True
        shipped, ignored = self.from_shipped(shard)
        for note in ignored:
            log.warning("%s: %s", shard.relpath, note)
        local = self._local_file(shard, shipped.origin) if shipped is not None and shipped.origin else None
        if shipped is not None and local is not None and local.endswith(idxfile.SUFFIX) and \
                shard.compression == tfrecord.NONE:
            # A local NAME.tfrfs-idx that matches: read in place when needed, not copied.
            meta = idxfile.read_header(local)
            lazy = self._from_meta(shard, meta, None, self._cached_offsets(shard, local, meta))
            if lazy is not None:
                lazy.origin = shipped.origin
                lazy.notes.extend(ignored)
                return lazy, True
        idx = shipped if shipped is not None else self.build(shard)
        self.save(idx)
        lazy = self.load(shard)
        if lazy is not None:
            lazy.tally = idx.tally
            idx = lazy
        idx.notes.extend(ignored)
        return idx, shipped is not None


def _header_of(files: SourceFiles, path: str) -> dict:
    """An index file's header, from its first bytes. Raises IndexFileError, OSError."""
    head = files.read_head(path, 1 << 16)
    try:
        return idxfile.header(head)[0]
    except idxfile.IndexFileError:
        if len(head) < len(idxfile.MAGIC) + 4 or not head.startswith(idxfile.MAGIC):
            raise
        (hlen,) = struct.unpack_from("<I", head, len(idxfile.MAGIC))
        return idxfile.header(files.read_head(path, len(idxfile.MAGIC) + 4 + hlen))[0]


def _tally_of(meta: dict) -> Tally | None:
    """The tally an index file's header keeps, if it is of the records as they are indexed."""
    tally = Tally.from_json(meta["schema"])
    return tally if tally is not None and tally.kind == meta.get("kind") else None


def _matches(meta: dict, shard: ShardFile) -> bool:
    return (meta.get("size") == shard.size and meta.get("identity") == shard.identity
            and meta.get("compression") == shard.compression)


# (shards done, shards in all, records so far, bytes of the shards done, bytes in all)
IndexProgress = Callable[[int, int, int, int, int], None]
