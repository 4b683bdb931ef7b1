"""``tfrfs repair`` (SPEC 6): rewrite each damaged shard with every record that can be saved.

A shard is damaged when bytes of it are lost to a reader: a gap (a bad header, garbage, zeros),
a record whose data checksum fails, a cut-short end, a damaged compressed stream. Its records
whose checksums hold are written, in order and byte for byte (a sound record's framing is the
one ``frame`` gives), into a new file beside it with the shard's compression, by the commit's
crash-safe path: temporary file, fsync, read back and checked, then the original is linked into
``.tfrfs-damaged/NAME`` and the new file renamed over it, and the folder fsynced. A crash at any
point leaves the shard old or new, whole. Records that do not parse but whose checksums hold
are the user's data and are kept. A TFDS ``dataset_info.json`` beside the shard follows.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Iterator

from . import durable, idxfile, salvage, tfds, tfrecord
from .errors import UsageError
from .index import DAMAGED_DIR, ShardFile
from .repack import TMP_PREFIX, _FaultedFile, check_new_shard
from .sources import Source
from .staging import Staging
from .verify import ShardReport, verify_source

log = logging.getLogger("tfrfs")


@dataclass
class Repaired:
    """What repair did to one damaged shard (or would do, in a dry run)."""

    shard: ShardFile
    report: ShardReport                   # what verify found before
    kept: int = 0
    kept_bytes: int = 0                   # the kept records' data
    dropped_records: list[tuple[int, int, int]] = field(default_factory=list)   # (index, offset, length)
    dropped_ranges: list[tuple[int, int]] = field(default_factory=list)   # [start, end) of the stream
    compressed_tail: tuple[int, int] | None = None   # [start, end) of the file that does not inflate
    backup: str | None = None
    notes: list[str] = field(default_factory=list)
    error: str | None = None              # it could not be repaired: why


def check_repairable(source: Source) -> None:
    """Refuse a remote source, a source mounted writable, and shards with staged edits (their
    record numbers would change under the edits). Raises UsageError."""
    if source.remote:
        raise UsageError(f"{source.name}: a remote source is read-only: copy the damaged shards to a "
                         "local folder and repair them there")
    staging = Staging(source.discovery.root)
    if staging.lock.is_locked():
        raise UsageError(f"{source.name} is mounted writable: unmount it first")
    if staging.exists():
        staged = set(staging.load())
        hit = sorted(staged & {s.relpath for s in source.discovery.shards})
        if hit:
            raise UsageError(f"{hit[0]} has staged edits: commit or discard them first "
                             f"(tfrfs status {source.name})")


def repair_source(source: Source, *, backup: bool = True, dry_run: bool = False,
                  progress: Callable[[ShardFile, int, int], None] | None = None) -> Iterator[Repaired]:
    """Verify every shard and repair each damaged one; yields one result per damaged shard."""
    check_repairable(source)
    if not dry_run:
        for folder in {os.path.dirname(s.path) for s in source.discovery.shards}:
            _clear_leftovers(folder)
    reports = list(verify_source(source, None, progress))
    # What each sound (or repaired) shard holds, by folder: a TFDS dataset_info.json there follows.
    figures: dict[str, dict[str, tfds.ShardFigures]] = {}
    repaired: list[ShardFile] = []
    for r in reports:
        if not r.damaged:
            figures.setdefault(os.path.dirname(r.shard.path), {})[os.path.basename(r.shard.path)] = \
                tfds.ShardFigures(r.records, r.data_bytes)
    for report in reports:
        if not report.damaged:
            continue
        result = Repaired(report.shard, report)
        try:
            _repair_shard(result, backup=backup, dry_run=dry_run)
        except OSError as exc:
            result.error = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
        if result.error is None and not dry_run:
            repaired.append(report.shard)
            folder, name = os.path.split(report.shard.path)
            figures.setdefault(folder, {})[name] = tfds.ShardFigures(result.kept, result.kept_bytes)
            result.notes += tfds.update(folder, figures[folder])
        yield result
    if not dry_run:
        # Also where an earlier repair stopped between the shard and its metadata.
        for folder, shards in figures.items():
            for note in tfds.update(folder, shards):
                log.info("%s", note)
        _follow_manifest(source, repaired)


def _follow_manifest(source: Source, repaired: list[ShardFile]) -> None:
    """The repaired shards' index files beside them and the dataset's manifest follow them
    (SPEC 1.2), where the dataset has them: the new shards are indexed for that."""
    from . import manifest
    from .index import IndexCache, local_identity
    root = source.discovery.root
    if not repaired or not (os.path.exists(os.path.join(root, manifest.NAME)) or
                            any(os.path.exists(s.path + idxfile.SUFFIX) for s in repaired)):
        return
    cache = IndexCache(source.cache_dir)
    written = []
    for old in repaired:
        st = os.stat(old.path)
        shard = ShardFile(path=old.path, relpath=old.relpath, compression=old.compression, size=st.st_size,
                          mtime_ns=st.st_mtime_ns, identity=local_identity(st))
        written.append(cache.get(shard)[0])
    for note in manifest.follow(root, cache, written, [], None):
        log.info("%s", note)


def _repair_shard(result: Repaired, *, backup: bool, dry_run: bool) -> None:
    shard = result.shard
    target = shard.path
    folder = os.path.dirname(target)
    with ExitStack() as stack:
        stream: BinaryIO
        if shard.compression != tfrecord.NONE:
            stream = stack.enter_context(tempfile.TemporaryFile())
            with open(target, "rb") as src:
                problem = salvage.inflate(src, stream, shard.compression)
            stream.flush()
            if problem is not None and problem.compressed_offset is not None:
                result.compressed_tail = (problem.compressed_offset, shard.size)
        else:
            stream = stack.enter_context(open(target, "rb"))
        fd = stream.fileno()
        size = os.fstat(fd).st_size
        out: BinaryIO | None = None
        tmp = None
        if not dry_run:
            tfd, tmp = durable.mkstemp(folder, prefix=TMP_PREFIX)
            os.fchmod(tfd, os.stat(target).st_mode & 0o7777)
            out = stack.enter_context(os.fdopen(tfd, "wb"))
            stack.callback(_unlink_quietly, tmp)    # unless renamed into place (then it is gone)
        writer = tfrecord.StreamWriter(_FaultedFile(out, tmp) if out is not None and tmp else _Discard(),  # type: ignore[arg-type]
                                       shard.compression)
        walk = salvage.Walk(lambda n, off: os.pread(fd, n, off), size, with_data=True)
        for index, (offset, length, data) in enumerate(walk):
            assert data is not None
            if walk.ok:
                writer.write(data)
                result.kept += 1
                result.kept_bytes += length
            else:
                result.dropped_records.append((index, offset, length))
        writer.close()
        result.dropped_ranges = [(p.offset, p.offset + (p.skipped or 0)) for p in walk.problems]
        if dry_run or out is None or tmp is None:
            return
        out.flush()
        durable.fsync(out.fileno(), tmp)
        check_new_shard(tmp, shard.compression, result.kept, range(result.kept))
        if backup:
            result.backup = _keep_original(target)
        durable.rename(tmp, target)
        durable.fsync_dir(folder)
        log.info("%s: repaired: %d records kept, %d dropped", shard.relpath, result.kept,
                 len(result.dropped_records))


class _Discard:
    def write(self, data: bytes | memoryview) -> int:
        return len(data)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _same_bytes(a: str, b: str) -> bool:
    import filecmp
    try:
        return os.path.samefile(a, b) or filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def _clear_leftovers(folder: str) -> None:
    """Temporary shard files of a repair or commit that stopped before its rename: never needed
    again (no writable mount holds the source: see ``check_repairable``)."""
    for name in os.listdir(folder):
        if name.startswith(TMP_PREFIX):
            try:
                durable.unlink(os.path.join(folder, name))
            except OSError:
                pass


def _keep_original(target: str) -> str:
    """Keep the damaged shard as ``.tfrfs-damaged/NAME`` in its folder (``NAME~2``... when taken):
    a hard link, so that the shard's own name never stops holding a whole file."""
    folder, name = os.path.split(target)
    keep_dir = os.path.join(folder, DAMAGED_DIR)
    os.makedirs(keep_dir, exist_ok=True)
    dest, n = os.path.join(keep_dir, name), 2
    while os.path.lexists(dest):
        if _same_bytes(target, dest):
            return dest    # kept by a repair that stopped before it replaced the shard
        dest, n = os.path.join(keep_dir, f"{name}~{n}"), n + 1
    try:
        os.link(target, dest)
    except OSError:
        # A file system without hard links: a copy, whole under its name or not there at all.
        fd, tmp = durable.mkstemp(keep_dir)
        os.close(fd)
        try:
            shutil.copy2(target, tmp)
            with open(tmp, "rb") as f:
                durable.fsync(f.fileno(), tmp)
            durable.rename(tmp, dest)
        except BaseException:
            _unlink_quietly(tmp)
            raise
    durable.fsync_dir(keep_dir)
    durable.fsync_dir(folder)
    return dest
