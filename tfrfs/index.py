"""Shard discovery and the compact record index.

A shard's index is the header offset of every record (plus the end of the
last one) in an ``array('Q')``: 8 bytes a record, so ten million records need
80 MB. It is found from record headers alone and persisted in a cache
directory, keyed by the shard's absolute path and validated against its size
and mtime, so mounting an already-indexed dataset only reads the cache.
GZIP and ZLIB shards are decompressed once into the cache, because a deflate
stream cannot be read at an offset; offsets then refer to that plain stream,
as SPEC 5 asks.
"""

from __future__ import annotations

import fnmatch
import glob as _glob
import hashlib
import itertools
import json
import os
import stat
import struct
import tempfile
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from . import proto, tfrecord
from .errors import DataLoss, UsageError
from .readers import Readers, ShardReader, default_readers
from .tfrecord import Problem

INDEX_VERSION = 2
STAGING_DIR = ".tfrfs-staging"
SNIFF_BYTES = 4096
KIND_SAMPLE = 16
RECORD_KINDS = ("example", "sequence", "raw")
_SHARD_NAME_PATTERNS = ("*.tfrecord*", "*.tfrecords*", "*.record*", "*-of-*")
_MAGIC = b"TFRFSIDX"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tfrfs"


def named_like_shard(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in _SHARD_NAME_PATTERNS)


@dataclass(frozen=True)
class ShardFile:
    """A file found to be a shard: where it is and how it is compressed."""

    path: str          # absolute path of the shard file
    relpath: str       # path relative to SOURCE (what users and errors see)
    compression: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class Discovery:
    """What a SOURCE holds: shards, plain files and folders, all relative to ``root``."""

    root: str                      # folder the relative paths start from
    shards: tuple[ShardFile, ...]
    plain_files: tuple[str, ...]   # relative paths of non-shard regular files
    dirs: tuple[str, ...]          # relative paths of mirrored sub-folders ("" is the root)
    mirrors_dir: bool              # SOURCE is a folder (new shards may be made in it)


def sniff_file(path: str, *, named_as_source: bool = False) -> str | None:
    """The compression of the shard at ``path``, or None when it is not a shard."""
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    if not head:
        return tfrecord.NONE if named_as_source or named_like_shard(os.path.basename(path)) else None
    comp = tfrecord.sniff(head)
    if comp in (tfrecord.GZIP, tfrecord.ZLIB):
        # A compressed stream of zero records is an empty shard: judge it by name like an empty file.
        if _decompresses_empty(path, comp) and not (named_as_source or named_like_shard(os.path.basename(path))):
            return None
    return comp


def _decompresses_empty(path: str, comp: str) -> bool:
    """Whether a GZIP/ZLIB file inflates to nothing; stops at the first byte it yields."""
    import zlib
    wbits = 16 + zlib.MAX_WBITS if comp == tfrecord.GZIP else zlib.MAX_WBITS
    d = zlib.decompressobj(wbits)
    with open(path, "rb") as f:
        while block := f.read(1 << 16):
            try:
                if d.decompress(block, 1):
                    return False
            except zlib.error:
                return False   # damaged: it is judged (and reported) when indexed
            if d.eof:
                break
    return True


def _shard_file(path: str, relpath: str, comp: str) -> ShardFile:
    st = os.stat(path)
    return ShardFile(path=os.path.abspath(path), relpath=relpath, compression=comp, size=st.st_size,
                     mtime_ns=st.st_mtime_ns)


def discover(source: str) -> Discovery:
    """Find the shards of SOURCE (a shard file, a folder, or a glob). Raises UsageError."""
    if os.path.isdir(source):
        return _discover_dir(source)
    if os.path.exists(source):
        return _discover_files([source], named=True)
    if any(ch in source for ch in "*?["):
        matches = sorted(p for p in _glob.glob(source, recursive=True) if os.path.isfile(p))
        if not matches:
            raise UsageError(f"no file matches {source!r}")
        return _discover_files(matches, named=False)
    raise UsageError(f"{source}: no such file or directory")


def _discover_files(paths: list[str], *, named: bool) -> Discovery:
    shards = []
    seen: set[str] = set()
    for p in paths:
        if not os.path.isfile(p):
            raise UsageError(f"{p}: not a regular file")
        try:
            comp = sniff_file(p, named_as_source=named)
        except OSError as exc:
            raise UsageError(f"{p}: cannot read: {exc.strerror}") from exc
        if comp is None:
            if named:
                raise UsageError(f"{p}: not a TFRecord file (its first record header has no valid checksum, "
                                 "plain or after GZIP/ZLIB decompression)")
            continue
        name = os.path.basename(p)
        base, n = name, 2
        while name in seen:  # two globbed files of one name from different folders
            name = f"{base}~{n}"
            n += 1
        seen.add(name)
        shards.append(_shard_file(p, name, comp))
    if not shards:
        raise UsageError(f"no TFRecord shard among {len(paths)} matching files")
    root = os.path.dirname(os.path.abspath(paths[0]))
    return Discovery(root=root, shards=tuple(shards), plain_files=(), dirs=("",), mirrors_dir=False)


def _discover_dir(source: str) -> Discovery:
    root = os.path.abspath(source)
    shards: list[ShardFile] = []
    plain: list[str] = []
    dirs: list[str] = [""]
    if not os.access(root, os.R_OK | os.X_OK):
        raise UsageError(f"{source}: permission denied")
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != STAGING_DIR)
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        for d in dirnames:
            dirs.append(os.path.join(rel_dir, d))
        for name in sorted(filenames):
            if name.startswith(".tfrfs-commit-"):
                continue   # a commit's temporary file (see repack)
            full = os.path.join(dirpath, name)
            rel = os.path.join(rel_dir, name)
            try:
                if not stat.S_ISREG(os.stat(full).st_mode):
                    continue
                comp = sniff_file(full)
            except OSError:
                continue  # unreadable files are left out of the mirror
            if comp is None:
                plain.append(rel)
            else:
                shards.append(_shard_file(full, rel, comp))
    if not shards:
        raise UsageError(f"{source}: no TFRecord shard in this folder")
    return Discovery(root=root, shards=tuple(shards), plain_files=tuple(plain), dirs=tuple(dirs),
                     mirrors_dir=True)


# --- the index ---------------------------------------------------------------

@dataclass
class ShardIndex:
    """Record offsets of one shard, and what was learned about it while indexing."""

    shard: ShardFile
    data_path: str                 # plain stream to read records from
    offsets: array                 # header offsets, plus the end of the last record
    detected_kind: str
    problems: list[Problem] = field(default_factory=list)
    bad: set[int] = field(default_factory=set)   # records known not to parse or verify

    @property
    def count(self) -> int:
        return len(self.offsets) - 1

    def span(self, index: int) -> tuple[int, int]:
        """(header offset, data length) of record ``index``."""
        start = self.offsets[index]
        return start, self.offsets[index + 1] - start - tfrecord.OVERHEAD


def _cache_key(shard: ShardFile) -> str:
    return hashlib.sha256(shard.path.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def parse_problem(data: bytes, kind: str) -> str | None:
    """Why ``data`` does not parse as a record of ``kind``, or None when it does."""
    if kind == "raw":
        return None
    cls = proto.SequenceExample if kind == "sequence" else proto.Example
    try:
        cls.FromString(data)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several types
        return f"record does not parse as {cls.__name__}: {exc or type(exc).__name__}"
    return None


def detect_kind(records: Iterable[bytes]) -> str:
    """SPEC 2: the record kind of a shard, from its non-empty records whose checksums hold.

    Only the first ``KIND_SAMPLE`` such records are looked at, so that
    indexing never reads a whole shard.
    """
    kind = "example"
    for n, data in enumerate(records):
        if n >= KIND_SAMPLE:
            break
        try:
            seq = proto.SequenceExample.FromString(data)
        except Exception:  # noqa: BLE001
            return "raw"
        if seq.HasField("feature_lists"):
            kind = "sequence"
        elif parse_problem(data, "example"):
            return "raw"
    return kind


def _sample_records(reader: ShardReader, offsets: array, problems: list[Problem], bad: set[int]) -> Iterator[bytes]:
    """Non-empty records with sound checksums, from the start; bad ones are noted on the way."""
    for i in range(len(offsets) - 1):
        start = offsets[i]
        length = offsets[i + 1] - start - tfrecord.OVERHEAD
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
    """Persists shard indexes (and decompressed streams) in a cache directory; builds them
    through the shard readers of ``readers`` (the local ones by default)."""

    def __init__(self, cache_dir: Path | str | None = None, readers: Readers | None = None) -> None:
        self.dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.readers = readers or default_readers()

    def _paths(self, shard: ShardFile) -> tuple[Path, Path]:
        key = _cache_key(shard)
        return self.dir / "index" / f"{key}.idx", self.dir / "streams" / f"{key}.raw"

    def load(self, shard: ShardFile) -> ShardIndex | None:
        idx_path, raw_path = self._paths(shard)
        try:
            with open(idx_path, "rb") as f:
                if f.read(len(_MAGIC)) != _MAGIC:
                    return None
                (hlen,) = struct.unpack("<I", f.read(4))
                meta = json.loads(f.read(hlen))
                if (meta.get("version") != INDEX_VERSION or meta["path"] != shard.path
                        or meta["size"] != shard.size or meta["mtime_ns"] != shard.mtime_ns
                        or meta["compression"] != shard.compression):
                    return None
                offsets = array("Q")
                offsets.frombytes(f.read())
        except (OSError, ValueError, KeyError, struct.error):
            return None
        if len(offsets) != meta["count"] + 1:
            return None
        data_path = shard.path
        if shard.compression != tfrecord.NONE:
            try:
                if os.path.getsize(raw_path) != meta["stream_size"]:
                    return None
            except OSError:
                return None
            data_path = str(raw_path)
        problems = [Problem(p["offset"], p["reason"], p["index"]) for p in meta["problems"]]
        return ShardIndex(shard, data_path, offsets, meta["kind"], problems, set(meta["bad"]))

    def save(self, idx: ShardIndex) -> None:
        idx_path, _ = self._paths(idx.shard)
        meta = {
            "version": INDEX_VERSION, "path": idx.shard.path, "size": idx.shard.size,
            "mtime_ns": idx.shard.mtime_ns, "compression": idx.shard.compression, "count": idx.count,
            "kind": idx.detected_kind, "stream_size": os.path.getsize(idx.data_path),
            "problems": [{"offset": p.offset, "reason": p.reason, "index": p.index} for p in idx.problems],
            "bad": sorted(idx.bad),
        }
        head = json.dumps(meta).encode()
        try:
            idx_path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=idx_path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + struct.pack("<I", len(head)) + head)
                idx.offsets.tofile(f)
            os.replace(tmp, idx_path)
        except OSError:
            # The cache only saves time; a mount works without it.
            pass

    def build(self, shard: ShardFile) -> ShardIndex:
        """Index ``shard`` from its headers (decompressing it into the cache first if needed)."""
        problems: list[Problem] = []
        data_path = shard.path
        if shard.compression != tfrecord.NONE:
            _, raw_path = self._paths(shard)
            raw_path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=raw_path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as out, open(shard.path, "rb") as src:
                problem = tfrecord.decompress_stream(src, out, shard.compression)
            os.replace(tmp, raw_path)
            if problem:
                problems.append(problem)
            data_path = str(raw_path)
        reader = self.readers.open(data_path)
        try:
            offsets_list, problem = tfrecord.scan_offsets(reader.pread, reader.size)
            offsets = array("Q", offsets_list)
            del offsets_list
            if problem:
                problems.append(problem)
            bad: set[int] = set()
            kind = detect_kind(_sample_records(reader, offsets, problems, bad))
        finally:
            reader.close()
        problems.sort(key=lambda p: p.offset)
        return ShardIndex(shard, data_path, offsets, kind, problems, bad)

    def get(self, shard: ShardFile) -> tuple[ShardIndex, bool]:
        """The index of ``shard`` and whether it came from the cache."""
        idx = self.load(shard)
        if idx is not None:
            return idx, True
        idx = self.build(shard)
        self.save(idx)
        return idx, False


ProgressFn = Callable[[int, int, int], None]   # (shards done, shards total, records so far)


def index_all(shards: Iterable[ShardFile], cache: IndexCache,
              progress: ProgressFn | None = None) -> list[ShardIndex]:
    shards = list(shards)
    out: list[ShardIndex] = []
    records = 0
    for n, shard in enumerate(shards, 1):
        idx, _ = cache.get(shard)
        out.append(idx)
        records += idx.count
        if progress:
            progress(n, len(shards), records)
    return out


# (shards done, shards in all, records so far, bytes of the shards done, bytes in all)
IndexProgress = Callable[[int, int, int, int, int], None]


def index_source(source: str, cache_dir: str | None, progress: IndexProgress | None = None,
                 readers: Readers | None = None) -> tuple[Discovery, list[ShardIndex]]:
    """SOURCE's shards and their indexes (from the cache, or built now). Raises UsageError."""
    disc = discover(source)
    upto = [0, *itertools.accumulate(s.size for s in disc.shards)]   # bytes of the first n shards

    def report(done: int, total: int, records: int) -> None:
        if progress is not None:
            progress(done, total, records, upto[done], upto[-1])
    return disc, index_all(disc.shards, IndexCache(cache_dir, readers), report)
