"""Commit: turn each changed shard's staged edits into a new sequential shard file.

Per shard, as a transaction: stream the records into a temporary file in the
shard's own folder — unchanged runs of records copied byte for byte (never
re-serialized), edited and added records framed from their staged bytes —
with the shard's compression; fsync; read the new file back and check it;
write a ``committing`` marker naming the new file; rename it over the old one;
fsync the folder; and only then drop the shard's staged changes. Recovery at
the next mount uses the marker to tell a finished rename from an unfinished
one, so every shard is wholly old or wholly new and no staged change is lost.

The heavy part, writing the new file and reading it back (``write_job``), is a shard job (see
``jobs``): ``commit SOURCE`` runs one per changed shard on its runner, in other processes or on
other machines; the rest (``put_in_place``) is the caller's, shard by shard in order.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Container, Iterable, Iterator, Protocol

from tfrfs.storage import durable
from tfrfs.edit import mutate
from tfrfs.format import bulk, salvage
from tfrfs.format import tfrecord
from tfrfs.errors import DataLoss, TfrfsError
from tfrfs.index.shard_index import ShardIndex
from tfrfs.index.discovery import TMP_PREFIX, ShardFile
from tfrfs.index.where import Where, plain_stream, readers_of
from tfrfs.edit.journal import ShardChanges, Staging

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


class FaultedFile:
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
        durable.copy_range(src_fd, out_fd, start, end, path,
                           lambda pos: DataLoss(f"shard ended while copying bytes {pos}..{end}"),
                           chunk=COPY_CHUNK, may_refuse=False)
        writer.raw_bytes += end - start
        return
    pos = start
    while pos < end:
        chunk = src.pread(min(COPY_CHUNK, end - pos), pos)
        if not chunk:
            raise DataLoss(f"shard ended while copying bytes {pos}..{end}")
        writer.write_framed(chunk)
        pos += len(chunk)


@dataclass(frozen=True)
class ShardPlan:
    """One changed shard's new file, for the job that writes it (in any process that sees
    SOURCE's folder at the same path): ``steps`` in order, each a byte range ``(start, end)`` of
    the old shard's plain stream to copy or the original index of an edited record, then the
    added records; into ``tmp``, which the caller made."""

    root: str                 # SOURCE's folder: the staged records are read from its journal
    ch: ShardChanges
    tmp: str
    compression: str
    count: int                # records the new file holds
    fresh: tuple[int, ...] = ()   # their positions among them that are edited (not copied) records
    steps: tuple[tuple[int, int] | int, ...] = ()
    shard: ShardFile | None = None   # the old shard, to copy from
    data_path: str = ""       # its plain stream where the caller sees it (compressed: inflated)
    stream_size: int = -1


@dataclass(frozen=True)
class Written:
    """What a write job sends back: the records written, or why it failed (the old shard and the
    staged edits are untouched either way)."""

    count: int
    error: OSError | None = None


def temp_path(root: str, ch: ShardChanges) -> str:
    """Where a shard's new file is written: one name per shard, so a job that runs again (its
    worker was lost) writes over what the lost one left; ``recover`` removes a leftover."""
    return os.path.join(root, os.path.dirname(ch.relpath), TMP_PREFIX + ch.sid)


def plan_shard(root: str, ch: ShardChanges, idx: ShardIndex | None) -> ShardPlan:
    """Make the shard's temporary file (empty, with the old file's mode, or the umask's for a new
    shard) and plan what goes into it. Raises OSError."""
    target = os.path.join(root, ch.relpath)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = temp_path(root, ch)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            mode = os.stat(target).st_mode & 0o7777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    if idx is None or ch.new:
        added = len(ch.added)
        return ShardPlan(root, ch, tmp, ch.compression if idx is None else idx.shard.compression, added,
                         tuple(range(added)))
    steps: list[tuple[int, int] | int] = []
    fresh: list[int] = []
    count = prev = 0
    for i in sorted(i for i in ch.edited | ch.deleted if i < idx.count):
        steps.extend(idx.runs(range(prev, i)))
        count += i - prev
        if i not in ch.deleted:
            steps.append(i)
            fresh.append(count)
            count += 1
        prev = i + 1
    steps.extend(idx.runs(range(prev, idx.count)))
    count += idx.count - prev
    fresh.extend(range(count, count + len(ch.added)))
    size = idx.shard.size
    if idx.shard.compression != tfrecord.NONE:
        try:
            size = os.path.getsize(idx.data_path)
        except OSError:
            size = -1
    return ShardPlan(root, ch, tmp, idx.shard.compression, count + len(ch.added), tuple(fresh), tuple(steps),
                     idx.shard, idx.data_path, size)


def write_job(where: Where, plan: ShardPlan, old: _Source | None = None) -> Written:
    """The heavy part of committing one shard, as a shard job: stream its records into its
    temporary file, fsync it, read it back and check it. It takes no lock of the journal: the
    staged files it reads are durable, and stay until the caller has put this file in place.
    ``old``: the old shard's plain stream as the caller holds it open (else opened here)."""
    try:
        with _locked(plan.tmp) as fd:
            os.ftruncate(fd, 0)   # what a lost run of this job left
            with contextlib.nullcontext(old) if old is not None else _old_stream(where, plan) as src:
                _write_planned(fd, plan, src, Staging(plan.root))
            check_new_shard(plan.tmp, plan.compression, plan.count, frozenset(plan.fresh))
    except OSError as exc:
        return Written(0, exc)
    return Written(plan.count)


@contextlib.contextmanager
def _locked(tmp: str) -> Iterator[int]:
    """``tmp`` open for writing under an exclusive lock, never made anew: a job run again while a
    lost run of it still writes waits for that one's end, and one that starts after the file was
    put in place (or taken back) finds it gone."""
    fd = os.open(tmp, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_ino != os.stat(tmp).st_ino:
            raise FileNotFoundError(errno.ENOENT, "the new shard file was taken away", tmp)
        yield fd
    finally:
        os.close(fd)


class _PReadOnly:
    """A plain stream known by its pread alone (inflated here): copied a chunk at a time."""

    def __init__(self, pread: tfrecord.PRead) -> None:
        self._pread = pread

    def fileno(self) -> None:
        return None

    def pread(self, size: int, offset: int) -> bytes:
        return self._pread(size, offset)


@contextlib.contextmanager
def _old_stream(where: Where, plan: ShardPlan) -> Iterator[_Source | None]:
    """The old shard's plain stream: the shard itself, or (compressed) its inflated copy where
    this process sees the caller's, else inflated here."""
    shard = plan.shard
    if shard is None or not any(isinstance(s, tuple) for s in plan.steps):
        yield None
        return
    seen = where.storage().stat(shard.path)
    if seen is not None and seen.identity != shard.identity:
        raise DataLoss(f"{shard.relpath} changed on disk since it was indexed; commit again")
    if shard.compression == tfrecord.NONE:
        reader = readers_of(where, shard).open(shard.path)
        try:
            yield reader
        finally:
            reader.close()
        return
    try:
        held = os.path.getsize(plan.data_path) == plan.stream_size
    except OSError:
        held = False
    if held:
        with open(plan.data_path, "rb", buffering=0) as f:
            yield _StagedFile(f.fileno())
        return
    with plain_stream(where, shard) as (pread, _, _):
        yield _PReadOnly(pread)


def _write_planned(fd: int, plan: ShardPlan, src: _Source | None, staging: Staging) -> None:
    ch, path = plan.ch, plan.tmp
    with open(fd, "r+b", buffering=0, closefd=False) as out:
        writer = tfrecord.StreamWriter(FaultedFile(out, path), plan.compression)  # type: ignore[arg-type]
        for step in plan.steps:
            if isinstance(step, int):
                _write_staged(staging.edit_path(ch, step), 0, out, writer, path)
            elif src is None:
                raise DataLoss(f"{ch.relpath}: the old shard cannot be read to copy its records")
            else:
                _copy_range(src, out, step[0], step[1], writer, path)
        for name in ch.added_names():
            if ch.kind == "sequence":
                writer.write(mutate.with_both_parts(staging.get_added(ch, name)))
            else:
                _write_staged(*staging.added_path(ch, name), out, writer, path)
        writer.close()
        durable.fsync(out.fileno(), path)


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
        if bulk.available():
            # Every record's checksum is checked in C, as cheap as walking the headers; those
            # of ``fresh`` records must hold.
            walk = salvage.Walk(lambda n, off: os.pread(fd, n, off), os.fstat(fd).st_size, with_data=True)
            for run in walk.runs("raw", read_large=False):
                if walk.problems:
                    break
                for i in run.failed:
                    if walk.count + i in fresh:
                        at = run.offsets[i]
                        raise DataLoss(f"data checksum failed for the record at offset {at}")
        else:
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


def put_in_place(plan: ShardPlan, written: Written, staging: Staging) -> ShardResult:
    """The rest of a shard's commit, after its job wrote the new file: the ``committing`` marker,
    the rename over the old file, the folder's fsync, and dropping the staged changes. Raises
    CommitFailed, leaving everything as it was (or, when only the last fsync of the folder failed,
    the new shard in place and the edits staged until a commit or the next mount's recovery
    settles it)."""
    ch = plan.ch
    target = os.path.join(plan.root, ch.relpath)
    folder = os.path.dirname(target)
    replaced = False
    try:
        marker = staging.committing_path(ch)
        try:
            if written.error is not None:
                raise written.error
            with _locked(plan.tmp) as fd:   # a lost run of the job that still writes is waited for
                st = os.fstat(fd)
                stamp = {"ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
                durable.write_file(marker, json.dumps(stamp).encode())
                durable.rename(plan.tmp, target)
        except BaseException:
            # Nothing was replaced: take back the temporary file and the marker, so the shard is
            # as it was and stays open to edits.
            for leftover in (plan.tmp, marker):
                try:
                    os.unlink(leftover)
                except OSError:
                    pass
            raise
        replaced = True
        durable.fsync_dir(folder)
        _forget(staging, ch.relpath)
        return ShardResult(ch.relpath, "created" if ch.new else "rewritten", written.count, st.st_size)
    except OSError as exc:
        raise failure(ch, exc, replaced) from exc


def take_back(plans: Iterable[ShardPlan]) -> None:
    """Remove the temporary files of shards a failed commit did not reach (a job still writing one
    writes into a file no longer there; one not started yet finds none)."""
    for plan in plans:
        try:
            os.unlink(plan.tmp)
        except OSError:
            pass


def remove_shard(root: str, ch: ShardChanges, staging: Staging) -> ShardResult:
    """Commit a shard's removal. Raises CommitFailed."""
    target = os.path.join(root, ch.relpath)
    try:
        if os.path.exists(target):
            durable.unlink(target)
        _forget(staging, ch.relpath)
        return ShardResult(ch.relpath, "removed", 0, 0)
    except OSError as exc:
        raise failure(ch, exc, not os.path.exists(target)) from exc


def settle(staging: Staging, first: ShardChanges) -> None:
    """Before a commit: a call whose intent was published but whose files are not all in place yet
    (an I/O error) is finished first, as the new shards must hold all of it or none of it. Raises
    CommitFailed (naming ``first``, the shard the commit starts with)."""
    try:
        staging.settle()
    except OSError as exc:
        raise failure(first, exc, False) from exc


def commit_shard(root: str, ch: ShardChanges, idx: ShardIndex | None, staging: Staging,
                 where: Where) -> ShardResult:
    """Make one shard's staged changes permanent, here and now. Raises CommitFailed."""
    settle(staging, ch)
    if ch.removed:
        return remove_shard(root, ch, staging)
    try:
        plan = plan_shard(root, ch, idx)
    except OSError as exc:
        raise failure(ch, exc, False) from exc
    return put_in_place(plan, write_job(where, plan), staging)


def failure(ch: ShardChanges, exc: OSError, replaced: bool) -> CommitFailed:
    errno_ = exc.errno or 5
    what = "disk full" if errno_ == 28 else (exc.strerror or str(exc))
    if replaced:
        done = "removed" if ch.removed else "replaced by the new one"
        return CommitFailed(f"commit of {ch.relpath} failed: {what} after the old shard file was {done}; "
                            f"its edits stay staged until a commit (or the next mount) settles it", errno_)
    return CommitFailed(f"commit of {ch.relpath} failed: {what}; the old shard is unchanged and "
                        f"its edits stay staged", errno_)


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
