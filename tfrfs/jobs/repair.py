"""``tfrfs repair`` (SPEC 6): rewrite each damaged shard with every record that can be saved.

A shard is damaged when bytes of it are lost to a reader: a gap (a bad header, garbage, zeros),
a record whose data checksum fails, a cut-short end, a damaged compressed stream. Its records
whose checksums hold are written, in order and byte for byte (a sound record's framing is the
one ``frame`` gives; a local uncompressed shard's are copied within the kernel), into a new
file beside it with the shard's compression, by the commit's crash-safe path: temporary file,
fsync, read back and checked, then the original is linked into ``.tfrfs-damaged/NAME`` and the
new file renamed over it, and the folder fsynced. A crash at any point leaves the shard old or
new, whole. Records that do not parse but whose checksums hold are the user's data and are
kept. A TFDS ``dataset_info.json`` beside the shard follows.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO, Iterator

from tfrfs.storage import durable
from tfrfs.index import idxfile
from tfrfs.jobs import runner as jobs
from tfrfs.format import bulk, salvage
from tfrfs.jobs import shard_work as shardjobs
from tfrfs.index import tfds_info as tfds
from tfrfs.format import tfrecord
from tfrfs.errors import UsageError
from tfrfs.index.discovery import DAMAGED_DIR, ShardFile
from tfrfs.edit.repack import TMP_PREFIX, FaultedFile, check_new_shard
from tfrfs.index.opened import OpenedSource
from tfrfs.edit.journal import Staging
from tfrfs.jobs.verify import Progress, ShardReport, verify_source
from tfrfs.index.where import Where, plain_stream, readers_of

if TYPE_CHECKING:
    from tfrfs.storage.places import Place

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
    written_size: int = 0                 # its bytes


def check_repairable(source: OpenedSource) -> None:
    """Refuse a web server (read-only), a source mounted writable, and shards with staged edits
    (their record numbers would change under the edits). A bucket is never mounted writable: it
    has no staged edits. Raises UsageError."""
    if source.local_root is None:   # no staged edits outside a local folder
        if not source.storage.writable:
            raise UsageError(f"{source.name}: a web server is read-only: copy the damaged shards to a "
                             "local folder or a bucket and repair them there")
        return
    staging = Staging(source.discovery.root)
    if staging.lock.is_locked():
        raise UsageError(f"{source.name} is mounted writable: unmount it first")
    if staging.exists():
        staged = set(staging.load())
        hit = sorted(staged & {s.relpath for s in source.discovery.shards})
        if hit:
            raise UsageError(f"{hit[0]} has staged edits: commit or discard them first "
                             f"(tfrfs status {source.name})")


def repair_source(source: OpenedSource, *, backup: bool = True, dry_run: bool = False,
                  progress: "Progress | None" = None, runner: "jobs.Runner | None" = None) -> Iterator[Repaired]:
    """Verify every shard and repair each damaged one; yields one result per damaged shard.

    Checking and rewriting run as shard jobs on ``runner`` (this process by default): a job
    writes a damaged shard's sound records into a temporary file beside it, fsynced and checked
    (a local source: its file system is the one this process and the jobs share), or into a
    temporary object beside it in a bucket, checked (``bucketrepair``). Here, in shard order, the
    original is kept, the new file renamed (the new object copied) over it, and the TFDS
    metadata updated, as one process did it; the index files beside the shards and the manifest
    follow last."""
    from tfrfs.jobs import bucketrepair
    check_repairable(source)
    runner = runner or jobs.InProcess()
    where = Where.of(source)
    # Where nothing renames (a bucket), objects are replaced by a copy over them instead.
    bucket = bucketrepair.place_of(source) if not source.storage.renames_atomically else None
    if not dry_run:
        if bucket is not None:
            bucketrepair.clear_leftovers(source, bucket)
        else:
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
    damaged = [(where, report, dry_run) for report in reports if report.damaged]
    try:
        for result in shardjobs.gather(runner, repair_job, damaged):
            if result.error is None and not dry_run:
                try:
                    if bucket is not None:
                        bucketrepair.put_in_place(bucket, result, backup=backup)
                    else:
                        _put_in_place(result, backup=backup)
                except OSError as exc:
                    result.error = _why(exc)
            if result.error is None and not dry_run:
                repaired.append(result.shard)
                folder, name = os.path.split(result.shard.path)
                figures.setdefault(folder, {})[name] = tfds.ShardFigures(result.kept, result.kept_bytes)
                result.notes += tfds.update(folder, figures[folder], place=bucket)
            yield result
    finally:
        if not dry_run:   # what a failed or stopped run left (renamed ones are gone)
            done = {s.path for s in repaired}
            for _, report, _ in damaged:
                if bucket is not None:
                    if report.shard.path not in done:
                        bucketrepair.drop_quietly(bucket, _tmp_path(report.shard))
                else:
                    _unlink_quietly(_tmp_path(report.shard))
    if not dry_run:
        # Also where an earlier repair stopped between the shard and its metadata.
        for folder, shards in figures.items():
            for note in tfds.update(folder, shards, place=bucket):
                log.info("%s", note)
        _follow_manifest(source, repaired, bucket)
        if bucket is not None:
            from tfrfs.edit.bucket_versions import remove_unnamed
            for note in remove_unnamed(source.storage, source.discovery.root):
                log.info("%s", note)


def _why(exc: OSError) -> str:
    return f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")


def _follow_manifest(source: OpenedSource, repaired: list[ShardFile], place: "Place | None" = None) -> None:
    """The repaired shards' index files beside them and the dataset's manifest follow them
    (SPEC 1.2), where the dataset has them: the new shards are indexed for that. With a
    manifest, also when nothing was repaired now: an earlier repair may have stopped between a
    shard and its manifest entry."""
    from tfrfs.index import manifest
    from tfrfs.index.shard_index import IndexCache
    from tfrfs.storage.places import Place
    root = source.discovery.root
    place = place if place is not None else Place.at(root)
    if not (place.stat(place.join(manifest.NAME)) is not None or
            any(place.stat(s.path + idxfile.SUFFIX) is not None for s in repaired)):
        return
    cache = IndexCache(source.cache_dir, source.readers, source.discovery.access)
    written = []
    for old in repaired:
        seen = place.stat(old.path)
        if seen is None:
            continue
        size, identity, mtime_ns = seen
        shard = ShardFile(path=old.path, relpath=old.relpath, compression=old.compression, size=size,
                          mtime_ns=mtime_ns, identity=identity)
        written.append(cache.get(shard)[0])
    for note in manifest.follow(root, cache, written, [], None, place):
        log.info("%s", note)


def _tmp_path(shard: ShardFile) -> str:
    """Where a shard's repaired copy is written: one name per shard, so a job that runs again
    (its worker was lost) writes over what the lost one left."""
    folder, name = os.path.split(shard.path)
    return os.path.join(folder, f"{TMP_PREFIX}repair-{name}")


def rewrite(where: Where, report: ShardReport, dry_run: bool) -> Repaired:
    """A shard job: the sound records of the damaged shard ``report`` is of, in order, into its
    temporary file (``_tmp_path``), fsynced and read back, or in a bucket into its temporary
    object, checked; nothing is renamed. ``error`` says why it could not be written."""
    result = Repaired(report.shard, report)
    try:
        if dry_run:
            _copy_sound(where, result, None)
        elif not where.storage().renames_atomically:
            from tfrfs.jobs import bucketrepair
            bucketrepair.write_repaired(where, result, _tmp_path(report.shard), _copy_sound)
        else:
            _write_repaired(where, result)
    except OSError as exc:
        result.error = _why(exc)
    return result


def _copy_sound(where: Where, result: Repaired, out: BinaryIO | None) -> None:
    """Walk the shard's plain stream (a compressed shard inflated as far as it goes, into a
    temporary file) and write its sound records to ``out`` with the shard's compression, a
    record at a time; count what is kept and what is dropped."""
    shard = result.shard
    with plain_stream(where, shard) as (pread, size, problem):
        if problem is not None and problem.compressed_offset is not None:
            result.compressed_tail = (problem.compressed_offset, shard.size)
        writer = tfrecord.StreamWriter(out if out is not None else _Discard(), shard.compression)  # type: ignore[arg-type]
        walk = salvage.Walk(pread, size, with_data=True)
        if bulk.available():
            _copy_runs(walk, writer, result)
        else:
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


def _copy_runs(walk: salvage.Walk, writer: tfrecord.StreamWriter, result: Repaired) -> None:
    """``_copy_sound``'s loop over runs of records checked in C (``salvage.Walk.runs``): each run's
    sound records written as they lie (a sound record's bytes are the framing ``frame`` gives
    its data), around those whose data checksum fails."""
    for run, start, stop in _sound_runs(walk, result):
        writer.write_framed(run.framed(start, stop))


def _sound_runs(walk: salvage.Walk, result: Repaired, *,
                read_large: bool = True) -> Iterator[tuple[bulk.Checked, int, int]]:
    """The runs of records checked in C (``salvage.Walk.runs``) cut around the records whose
    data checksum fails: (run, start, stop) for its records ``start``..``stop-1``, each stretch
    of sound records (maybe none) in order. What is kept and dropped is counted in ``result``
    as they are given."""
    for run in walk.runs("raw", read_large=read_large):
        first, records = walk.count, len(run.offsets)
        kept_from = 0
        for i in run.failed:
            yield run, kept_from, i
            length = run.length(i)
            result.dropped_records.append((first + i, run.offsets[i], length))
            result.kept_bytes -= length
            kept_from = i + 1
        yield run, kept_from, records
        result.kept += records - len(run.failed)
        result.kept_bytes += run.data_bytes


def _copy_sound_in_kernel(where: Where, result: Repaired, out: int, tmp: str) -> bool:
    """``_copy_sound`` of an uncompressed shard in a local file, into the new file ``out``
    (``tmp``): the compiled walk finds the sound records, and each stretch of them between what
    is dropped is copied from the shard's file within the kernel (``copy_file_range``) at once,
    not read into this process and written back. The bytes are those a write of the records
    gives (a sound record's bytes are the framing ``frame`` gives its data). Should the shard
    change between the walk and the copy, the read-back (``check_new_shard``, every checksum)
    finds it.

    False, with nothing written or counted, where this cannot be done: no compiled walker, a
    compressed shard, a reader without a descriptor, or copy_file_range missing or refused
    between these two files (at its first call)."""
    shard = result.shard
    if shard.compression != tfrecord.NONE or not bulk.available() or not hasattr(os, "copy_file_range"):
        return False
    reader = readers_of(where, shard).open(shard.path)
    try:
        src = reader.fileno()
        if src is None:
            return False
        copy = _KernelCopy(src, out, shard.path, tmp)
        # Large records are checked a piece at a time: their bytes are not wanted here.
        walk = salvage.Walk(reader.pread, reader.size, with_data=True)
        try:
            for run, start, stop in _sound_runs(walk, result, read_large=False):
                if start < stop:
                    copy.add(*run.span(start, stop))
            copy.flush()
        except _CannotCopy:
            # Written from the start by ``_copy_sound``, whatever a refused copy may have left.
            result.kept = result.kept_bytes = 0
            result.dropped_records = []
            os.ftruncate(out, 0)
            os.lseek(out, 0, os.SEEK_SET)
            return False
        result.dropped_ranges = [(p.offset, p.offset + (p.skipped or 0)) for p in walk.problems]
    finally:
        reader.close()
    return True


class _CannotCopy(Exception):
    """copy_file_range cannot copy between the two files (this platform, these file systems)."""


# Sound bytes held back before they are copied: the copy, and the disk's writing of it, keep up
# with the walk instead of all waiting for its end.
_COPY_AHEAD = 64 << 20


class _KernelCopy:
    """Byte ranges of the file ``src`` (``source``), in order, appended to the file ``dst``
    (``path``) within the kernel; ranges that meet are one copy. Each call passes the durable
    write seam, as a write does."""

    def __init__(self, src: int, dst: int, source: str, path: str) -> None:
        self.src, self.dst, self.source, self.path = src, dst, source, path
        self.start = self.end = 0      # the range not copied yet
        self.copied = 0

    def add(self, start: int, end: int) -> None:
        if start != self.end or self.end - self.start >= _COPY_AHEAD:
            self.flush()
            self.start = start
        self.end = end

    def flush(self) -> None:
        """Copy the range held; _CannotCopy where the very first call is refused as unsupported."""
        end = self.end

        def ended(pos: int) -> OSError:
            return OSError(errno.EIO, f"the shard ends at byte {pos}, before byte {end} it was to be "
                                      "copied up to (it changed during the repair)", self.source)
        if not durable.copy_range(self.src, self.dst, self.start, end, self.path, ended, may_refuse=not self.copied):
            raise _CannotCopy()
        self.copied += end - self.start
        self.start = end
        durable.start_writeback(self.dst)   # the disk writes it while the walk reads on


def _write_repaired(where: Where, result: Repaired) -> None:
    shard = result.shard
    tmp = _tmp_path(shard)
    mode = os.stat(shard.path).st_mode & 0o7777
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as out:
            os.fchmod(out.fileno(), mode)
            if not _copy_sound_in_kernel(where, result, out.fileno(), tmp):
                _copy_sound(where, result, FaultedFile(out, tmp))  # type: ignore[arg-type]
            out.flush()
            durable.fsync(out.fileno(), tmp)
            result.written_size = os.fstat(out.fileno()).st_size
        check_new_shard(tmp, shard.compression, result.kept, range(result.kept))
    except BaseException:
        _unlink_quietly(tmp)
        raise
    result.written = tmp


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


def repair_job(where: Where, report: ShardReport, dry_run: bool) -> Any:
    """``repair.rewrite``: the damaged shard's sound records into a temporary file beside it, or
    a temporary object beside it in a bucket (the caller puts it in place)."""
    return rewrite(where, report, dry_run)
