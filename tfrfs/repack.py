"""Commit: turn each changed shard's staged edits into a new sequential shard file.

Per shard, as a transaction: stream the records into a temporary file in the
shard's own folder — unchanged runs of records copied byte for byte (never
re-serialized), edited and added records framed from their staged bytes —
with the shard's compression; fsync; read the new file back and check it;
write a ``committing`` marker naming the new file; rename it over the old one;
fsync the folder; and only then drop the shard's staged changes. Recovery at
the next mount uses the marker to tell a finished rename from an unfinished
one, so every shard is wholly old or wholly new and no staged change is lost.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Container, Iterable, Protocol

from . import durable, mutate, salvage, tfrecord
from .errors import DataLoss, TfrfsError
from .index import TMP_PREFIX, ShardIndex
from .readers import ShardReader
from .staging import ShardChanges, Staging

log = logging.getLogger("tfrfs")

COPY_CHUNK = 8 << 20
STREAM_MIN = 1 << 20   # staged records from this size on are framed without being read whole


class CommitFailed(TfrfsError, OSError):
    """A commit could not finish; the old shards and the staged changes are untouched."""

    errno: int

    def __init__(self, message: str, errno_: int) -> None:
        super().__init__(message)
        self.errno = errno_


@dataclass(frozen=True)
class ShardResult:
    relpath: str
    action: str          # "rewritten", "created", "removed"
    records: int
    bytes: int


class _FaultedFile:
    """A file object whose writes pass through the durable fault seam."""

    def __init__(self, f: BinaryIO, path: str) -> None:
        self._f = f
        self._path = path

    def write(self, data: bytes | memoryview) -> int:
        durable.write(self._f, data, self._path)
        return len(data)


class _Source(Protocol):
    def fileno(self) -> int | None: ...
    def pread(self, size: int, offset: int) -> bytes: ...


class _StagedFile:
    """A journal file as a ``_Source`` (what ``_copy_range`` reads)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)


def _copy_range(src: _Source, dst: BinaryIO, start: int, end: int, writer: tfrecord.StreamWriter,
                path: str) -> None:
    """Copy bytes [start, end) of the plain source stream into the new shard: in the kernel
    (copy_file_range) where the reader has a descriptor and nothing is compressed."""
    src_fd = src.fileno()
    if writer.compression == tfrecord.NONE and src_fd is not None:
        dst.flush()
        out_fd = dst.fileno()
        pos = start
        while pos < end:
            durable.fault_point("write", path)
            n = os.copy_file_range(src_fd, out_fd, min(COPY_CHUNK, end - pos), pos)
            if n == 0:
                raise DataLoss(f"shard ended while copying bytes {pos}..{end}")
            pos += n
        writer.raw_bytes += end - start
        return
    pos = start
    while pos < end:
        chunk = src.pread(min(COPY_CHUNK, end - pos), pos)
        if not chunk:
            raise DataLoss(f"shard ended while copying bytes {pos}..{end}")
        writer.write_framed(chunk)
        pos += len(chunk)


def copy_records(src: ShardReader, dst: BinaryIO, idx: ShardIndex, indexes: Iterable[int],
                 writer: tfrecord.StreamWriter, path: str) -> None:
    """Copy the framed records ``indexes`` (ascending) byte for byte, never the damage between
    them (SPEC 6): one range per run of adjacent records."""
    for start, end in idx.runs(indexes):
        _copy_range(src, dst, start, end, writer, path)


def _write_shard(dst_path: str, ch: ShardChanges, idx: ShardIndex | None, src: ShardReader | None,
                 staging: Staging, compression: str) -> tuple[int, set[int]]:
    """Write the new shard; returns its record count and the positions of records written fresh."""
    fresh: set[int] = set()
    count = 0
    with open(dst_path, "r+b", buffering=0) as raw:
        out: BinaryIO = raw
        faulted = _FaultedFile(out, dst_path)
        writer = tfrecord.StreamWriter(faulted, compression)  # type: ignore[arg-type]
        if idx is not None and src is not None:
            run_from: int | None = None
            for i in range(idx.count):
                keep = i not in ch.deleted and i not in ch.edited
                if keep:
                    if run_from is None:
                        run_from = i
                    count += 1
                    continue
                if run_from is not None:
                    copy_records(src, out, idx, range(run_from, i), writer, dst_path)
                    run_from = None
                if i in ch.edited and i not in ch.deleted:
                    _write_staged(staging.edit_path(ch, i), 0, out, writer, dst_path)
                    fresh.add(count)
                    count += 1
            if run_from is not None:
                copy_records(src, out, idx, range(run_from, idx.count), writer, dst_path)
        for name in ch.added_names():
            if ch.kind == "sequence":
                writer.write(mutate.with_both_parts(staging.get_added(ch, name)))
            else:
                _write_staged(*staging.added_path(ch, name), out, writer, dst_path)
            fresh.add(count)
            count += 1
        writer.close()
        durable.fsync(out.fileno(), dst_path)
    return count, fresh


def _write_staged(path: Path, skip: int, out: BinaryIO, writer: tfrecord.StreamWriter, dst_path: str) -> None:
    """Frame the staged record in the file at ``path`` (its bytes from ``skip`` on) into the new
    shard. A large one is never read into memory whole: its checksum is computed a piece at a
    time, and its bytes copied from file to file (in the kernel when nothing is compressed)."""
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        length = os.fstat(fd).st_size - skip
        if length < STREAM_MIN:
            writer.write(os.pread(fd, length, skip))
            return
        crc = tfrecord.masked_crc_at(fd, skip, length)
        writer.write_framed(tfrecord.header(length))
        _copy_range(_StagedFile(fd), out, skip, skip + length, writer, dst_path)
        writer.write_framed(tfrecord.footer(crc))


def check_new_shard(path: str, compression: str, count: int, fresh: Container[int]) -> None:
    """Read a new shard back: its stream and the framing of every record, and the data checksum
    of the records in ``fresh`` (the others were copied from records already checked)."""
    import tempfile
    with open(path, "rb") as f, tempfile.TemporaryFile() as plain:
        src: BinaryIO = f
        if compression != tfrecord.NONE:
            problem = salvage.inflate(f, plain, compression)
            if problem:
                raise DataLoss(f"new shard does not read back: {problem.reason}")
            plain.flush()   # fstat and pread below see the file, not Python's buffer
            src = plain
        fd = src.fileno()
        walk = salvage.Walk(lambda n, off: os.pread(fd, n, off), os.fstat(fd).st_size)
        for i, (offset, length, _) in enumerate(walk):
            if walk.problems:
                break
            if i in fresh:
                tfrecord.check_record_at(fd, offset, length)
        if walk.problems or walk.count != count:
            raise DataLoss(f"new shard does not read back: "
                           f"{walk.problems[0].reason if walk.problems else 'record count differs'}"
                           f" ({walk.count} records, expected {count})")


def commit_shard(root: str, ch: ShardChanges, idx: ShardIndex | None, src: ShardReader | None,
                 staging: Staging) -> ShardResult:
    """Make one shard's staged changes permanent. Raises CommitFailed, leaving everything as it was
    (or, when only the last fsync of the folder failed, the new shard in place and the edits staged
    until a commit or the next mount's recovery settles it)."""
    target = os.path.join(root, ch.relpath)
    folder = os.path.dirname(target)
    replaced = False
    try:
        # A call whose intent was published but whose files are not all in place yet (an I/O error)
        # is finished first: the new shard must hold all of it or none of it.
        staging.settle()
        if ch.removed:
            if os.path.exists(target):
                durable.unlink(target)
            _forget(staging, ch.relpath)
            return ShardResult(ch.relpath, "removed", 0, 0)
        compression = idx.shard.compression if idx is not None else ch.compression
        os.makedirs(folder, exist_ok=True)
        fd, tmp = durable.mkstemp(folder, prefix=TMP_PREFIX)
        # mkstemp makes 0600; the new shard keeps the old file's mode (a new one gets the umask's).
        try:
            mode = os.stat(target).st_mode & 0o7777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.fchmod(fd, mode)
        os.close(fd)
        marker = staging.committing_path(ch)
        try:
            count, fresh = _write_shard(tmp, ch, idx if not ch.new else None, src, staging, compression)
            check_new_shard(tmp, compression, count, fresh)
            st = os.stat(tmp)
            stamp = {"ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            durable.write_file(marker, json.dumps(stamp).encode())
            durable.rename(tmp, target)
        except BaseException:
            # Nothing was replaced: take back the temporary file and the marker, so the shard is
            # as it was and stays open to edits.
            for leftover in (tmp, marker):
                try:
                    os.unlink(leftover)
                except OSError:
                    pass
            raise
        replaced = True
        durable.fsync_dir(folder)
        _forget(staging, ch.relpath)
        return ShardResult(ch.relpath, "created" if ch.new else "rewritten", count, st.st_size)
    except OSError as exc:
        errno_ = exc.errno or 5
        what = "disk full" if errno_ == 28 else (exc.strerror or str(exc))
        if ch.removed:
            replaced = not os.path.exists(target)
        if replaced:
            done = "removed" if ch.removed else "replaced by the new one"
            raise CommitFailed(f"commit of {ch.relpath} failed: {what} after the old shard file was {done}; "
                               f"its edits stay staged until a commit (or the next mount) settles it",
                               errno_) from exc
        raise CommitFailed(f"commit of {ch.relpath} failed: {what}; the old shard is unchanged and "
                           f"its edits stay staged", errno_) from exc


def _forget(staging: Staging, relpath: str) -> None:
    """Clear a shard's journal once its new file is durably in place. The commit is done either way:
    if clearing fails, the journal is forgotten in memory and the next mount's recovery (which finds
    the shard replaced) or the shard's next edit clears it on disk."""
    try:
        staging.drop_shard(relpath)
    except OSError as exc:
        log.warning("%s is committed, but its staged edits could not be cleared yet: %s", relpath, exc)
        staging.shards.pop(relpath, None)


def recover(root: str, staging: Staging) -> list[str]:
    """Finish or undo commits a crash interrupted. Returns what was done, for the log."""
    done = []
    for relpath, ch in list(staging.shards.items()):
        marker = staging.committing_path(ch)
        target = os.path.join(root, relpath)
        if marker.exists():
            try:
                want = json.loads(marker.read_text())
                st = os.stat(target)
                replaced = (st.st_ino, st.st_size, st.st_mtime_ns) == (want["ino"], want["size"], want["mtime_ns"])
            except (OSError, ValueError, KeyError):
                replaced = False
            if replaced:
                staging.drop_shard(relpath)
                done.append(f"{relpath}: an interrupted commit had finished; its staged edits are cleared")
                continue
            durable.unlink(marker)
            done.append(f"{relpath}: an interrupted commit had not replaced the shard; edits stay staged")
        elif ch.removed and not os.path.exists(target):
            staging.drop_shard(relpath)
            done.append(f"{relpath}: an interrupted removal had finished")
    # Temporary shard files of commits that never reached their rename.
    for relpath in {os.path.dirname(r) for r in staging.shards} | {""}:
        folder = Path(root) / relpath
        for leftover in folder.glob(TMP_PREFIX + "*") if folder.is_dir() else ():
            leftover.unlink()
            done.append(f"removed unfinished commit file {leftover}")
    return done
