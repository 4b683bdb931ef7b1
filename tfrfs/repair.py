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
from typing import TYPE_CHECKING, BinaryIO, Iterator

from . import durable, idxfile, salvage, tfds, tfrecord
from .errors import UsageError
from .index import DAMAGED_DIR, ShardFile
from .repack import TMP_PREFIX, _FaultedFile, check_new_shard
from .sources import Source
from .staging import Staging
from .verify import Progress, ShardReport, verify_source

if TYPE_CHECKING:
    from . import jobs

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
    written: str | None = None            # the repaired copy, checked, not yet renamed into place


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
                  progress: "Progress | None" = None, runner: "jobs.Runner | None" = None) -> Iterator[Repaired]:
    """Verify every shard and repair each damaged one; yields one result per damaged shard.

    Checking and rewriting run as shard jobs on ``runner`` (this process by default): a job
    writes a damaged shard's sound records into a temporary file beside it, fsynced and checked
    (the shards are on a local file system this process and the jobs share: a remote source is
    refused). Here, in shard order, the original is kept, the new file renamed over it, the
    folder fsynced and the TFDS metadata updated, as one process did it."""
    from . import jobs, shardjobs
    check_repairable(source)
    runner = runner or jobs.InProcess()
    if not dry_run:
        for folder in {os.path.dirname(s.path) for s in source.discovery.shards}:
            _clear_leftovers(folder)
    reports = list(verify_source(source, None, progress, runner))
    # What each sound (or repaired) shard holds, by folder: a TFDS dataset_info.json there follows.
    figures: dict[str, dict[str, tfds.ShardFigures]] = {}
    repaired: list[ShardFile] = []
    for r in reports:
        if not r.damaged:
            figures.setdefault(os.path.dirname(r.shard.path), {})[os.path.basename(r.shard.path)] = \
                tfds.ShardFigures(r.records, r.data_bytes)
    damaged = [(report, dry_run) for report in reports if report.damaged]
    try:
        for result in shardjobs.gather(runner, shardjobs.repair_job, damaged):
            if result.error is None and not dry_run:
                try:
                    _put_in_place(result, backup=backup)
                except OSError as exc:
                    result.error = _why(exc)
            if result.error is None and not dry_run:
                repaired.append(result.shard)
                folder, name = os.path.split(result.shard.path)
                figures.setdefault(folder, {})[name] = tfds.ShardFigures(result.kept, result.kept_bytes)
                result.notes += tfds.update(folder, figures[folder])
            yield result
    finally:
        for report, _ in damaged:   # what a failed or stopped run left (renamed ones are gone)
            _unlink_quietly(_tmp_path(report.shard))
    if not dry_run:
        # Also where an earlier repair stopped between the shard and its metadata.
        for folder, shards in figures.items():
            for note in tfds.update(folder, shards):
                log.info("%s", note)
        _follow_manifest(source, repaired)


def _why(exc: OSError) -> str:
    return f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")


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


def _tmp_path(shard: ShardFile) -> str:
    """Where a shard's repaired copy is written: one name per shard, so a job that runs again
    (its worker was lost) writes over what the lost one left."""
    folder, name = os.path.split(shard.path)
    return os.path.join(folder, f"{TMP_PREFIX}repair-{name}")


def rewrite(report: ShardReport, dry_run: bool) -> Repaired:
    """A shard job: the sound records of the damaged shard ``report`` is of, in order, into its
    temporary file (``_tmp_path``), fsynced and read back; nothing is renamed. ``error`` says
    why it could not be written."""
    result = Repaired(report.shard, report)
    try:
        _write_repaired(result, dry_run=dry_run)
    except OSError as exc:
        result.error = _why(exc)
    return result


def _write_repaired(result: Repaired, *, dry_run: bool) -> None:
    shard = result.shard
    target = shard.path
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
            tmp = _tmp_path(shard)
            tfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, os.stat(target).st_mode & 0o7777)
            os.fchmod(tfd, os.stat(target).st_mode & 0o7777)
            out = stack.enter_context(os.fdopen(tfd, "wb"))
            stack.callback(_unlink_unless, tmp, result)
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
        result.written = tmp


def _unlink_unless(tmp: str, result: Repaired) -> None:
    if result.written is None:
        _unlink_quietly(tmp)


def _put_in_place(result: Repaired, *, backup: bool) -> None:
    """Keep the original (unless not ``backup``), rename the repaired copy over it, fsync the
    folder: the shard is old or new, whole, at every moment."""
    shard = result.shard
    assert result.written is not None
    folder = os.path.dirname(shard.path)
    if backup:
        result.backup = _keep_original(shard.path)
    durable.rename(result.written, shard.path)
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
