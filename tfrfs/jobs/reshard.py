"""``tfrfs reshard SOURCE DEST`` (SPEC 8): SOURCE's records copied byte for byte into new shards.

The driver plans (``reshardplan``: the order, the cuts, the names, each new shard's task), runs
the jobs (``jobs``: here, a local pool, or Ray; a job writes one or several new shards, each
with its index file, then one receipt for them) and publishes the result whole (``publish``).
This module is the job. It streams each shard's records from SOURCE: without ``--shuffle`` they are a few contiguous byte ranges of
the source streams, read in large blocks, every record's header and data checksum checked on the
way, and written out as read (framed anew only when the compression changes, by compressing the
same framed bytes); under ``--shuffle`` each record is read where it lies. A worker holds one
block (``BLOCK``) and its new shard's offsets (8 bytes a record), whatever the shard's size; a
record larger than a block is checked and copied a piece at a time.

Damaged SOURCE (SPEC 6): every sound record is copied, as ``repair`` salvages; what is dropped (a
gap, a record whose data checksum fails, a damaged compressed stream's tail) is printed, one line
each, and the command exits 1 once DEST is published.
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
from array import array
from typing import Callable, Iterator

import crc32c

from tfrfs.index import idxfile
from tfrfs.format import bulk, salvage, tfrecord
from tfrfs.errors import DataLoss
from tfrfs.index.where import Where
from tfrfs.jobs.publish import Dest
from tfrfs.jobs.reshardplan import PICK, SourceShard, Task
from tfrfs.jobs.shardwrite import ShardWriter
from tfrfs.storage.local_reader import advise
from tfrfs.format.tfrecord import FOOTER, HEADER, OVERHEAD, Problem

BLOCK = 8 << 20          # bytes of source read at once (a worker's buffer)
_HDR = struct.Struct("<QI")
_U32 = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8


# --- the job ------------------------------------------------------------------------------------

def copy_shards(where: Where, dest: Dest, tasks: tuple[Task, ...], compression: str, kind: str,
                tally: bool) -> list[dict]:
    """A job: write the shards of ``tasks`` (each with its index file) into DEST, then one receipt
    for them all. Returns their figures, each with the records dropped for a failed data
    checksum (``dropped``). A source shard that several tasks read is opened once."""
    opened = _Opened(where)
    try:
        bodies = [_copy_one(opened, dest, task, compression, kind, tally) for task in tasks]
    finally:
        opened.close()
    dest.receipt(bodies)
    return bodies


def _copy_one(opened: "_Opened", dest: Dest, task: Task, compression: str, kind: str, tally: bool) -> dict:
    w = ShardWriter(dest, task.name, compression, kind, tally)
    dropped: list[dict] = []
    try:
        if task.unchecked:
            dropped.extend(task.dropped)
            for k, (src, start, end, count) in enumerate(task.runs):
                starts = task.starts[k] if task.starts else None
                _copy_unchecked(opened.get(task.sources[src]), start, end, starts, w, count,
                                task.sources[src].relpath)
        elif task.picks is None:
            for src, start, end, count in task.runs:
                got = _copy_run(opened.get(task.sources[src]), start, end, w, dropped, task.sources[src].relpath)
                if got != count:
                    raise DataLoss(f"{task.sources[src].relpath}: {got} records between bytes {start} and {end}, "
                                   f"its index says {count}: the shard changed since it was indexed")
        else:
            _copy_picks(opened, task, w, dropped)
        body = w.finish()
    except BaseException:
        w.abort()
        raise
    body.update(n=task.n, dropped=dropped)
    return body


class _Stream:
    """A source shard's uncompressed stream, read into a caller's buffer."""

    def __init__(self, fd: int | None, pread: Callable[[int, int], bytes], close: Callable[[], None]) -> None:
        self.fd = fd
        self.pread = pread
        self.close = close

    def read_into(self, view: memoryview, pos: int) -> int:
        if self.fd is not None:
            if len(view) >= BLOCK // 2:   # a run read in order: the next blocks asked for meanwhile
                advise(self.fd, pos + len(view), 2 * len(view))
            return os.preadv(self.fd, [view], pos)
        data = self.pread(len(view), pos)
        view[:len(data)] = data
        return len(data)


class _Opened:
    """The source streams a job reads, each opened when first needed."""

    def __init__(self, where: Where) -> None:
        self.where = where
        self.open: dict[SourceShard, _Stream] = {}

    def get(self, src: SourceShard) -> _Stream:
        s = self.open.get(src)
        if s is None:
            s = self.open[src] = _open_stream(self.where, src)
        return s

    def close(self) -> None:
        for s in self.open.values():
            s.close()
        self.open.clear()


def _open_stream(where: Where, src: SourceShard) -> _Stream:
    if src.compression == tfrecord.NONE:
        reader = where.readers().open(src.path)
        return _Stream(reader.fileno(), reader.pread, reader.close)
    try:
        if os.path.getsize(src.data_path) == src.stream_size:
            fd = os.open(src.data_path, os.O_RDONLY)
            return _Stream(fd, lambda n, o: os.pread(fd, n, o), lambda: os.close(fd))
    except OSError:
        pass
    # Not on this machine (another node): inflated here, into a file that goes with the job.
    from tfrfs.format.salvage import inflate
    tmp = tempfile.TemporaryFile()
    with where.open_stream(src.path) as f:
        inflate(f, tmp, src.compression)
    tmp.flush()
    tfd = tmp.fileno()
    return _Stream(tfd, lambda n, o: os.pread(tfd, n, o), tmp.close)


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _copy_unchecked(stream: _Stream, start: int, end: int, starts: bytes | None, w: ShardWriter, count: int,
                    rel: str) -> None:
    """``--no-check``: the bytes between ``start`` and ``end`` copied as they are, within the kernel
    where it can, no record's data looked at. The new shard's offsets are SOURCE's index's: sent
    with the job (``starts``: the records' header offsets there), or, without them, found by
    walking the headers of the blocks read anyway (``salvage.sound_run``, in C: a few ns a
    record), checked to be the ``count`` the index holds. Headers were checked when SOURCE was
    indexed, and a run never spans a gap."""
    buf = bytearray(min(BLOCK, max(end - start, 1)))
    view = memoryview(buf)
    heads = array("Q")
    head = start            # the next header to take (without ``starts``)
    pos = start
    while pos < end:
        # Read, for the new file's checksum (which it is read back against), then copied in the kernel.
        n = stream.read_into(view[:min(len(buf), end - pos)], pos)
        if n <= 0:
            raise DataLoss(f"{rel}: ends at byte {pos}, before {end} as indexed")
        if starts is None and head < pos + n:
            taken, after = salvage.sound_run(view[head - pos:n], head, end, heads)
            head = after if taken else head
            if head < pos + n:   # a header not taken: cut by the block's end (read again from it), or not one
                if head + HEADER <= pos + n or head == pos:
                    raise DataLoss(f"{rel}: no record header at byte {head}: the shard changed since it was indexed")
                w.emit_from(view[:head - pos], stream.fd, pos)
                pos = head
                continue
        w.emit_from(view[:n], stream.fd, pos)
        pos += n
    if starts is None:
        if len(heads) != count or head != end:
            raise DataLoss(f"{rel}: {len(heads)} records between bytes {start} and {end}, its index says {count}: "
                           "the shard changed since it was indexed")
        starts = heads.tobytes()
    w.offsets.extend(idxfile.shifted(starts[8:], w.stream - start))
    w.offsets.append(w.stream + end - start)
    w.stream += end - start
    w.data_bytes += end - start - OVERHEAD * count


def _copy_run(stream: _Stream, start: int, end: int, w: ShardWriter, dropped: list[dict], rel: str) -> int:
    """Copy the records between bytes ``start`` and ``end`` (record boundaries) of a source stream:
    blocks read, every record's data checksum checked, the sound records written as they are
    (within the kernel where it can: ``copy_file_range``). Returns the records found (dropped ones
    too). A header is not checked again: it was when the shard was indexed, the shard has the
    same size and identity, and a record not where the index says fails its data checksum."""
    buf = bytearray(min(BLOCK, max(end - start, HEADER)))
    view = memoryview(buf)
    hdr, u32, crc, record = _HDR.unpack_from, _U32.unpack_from, crc32c.crc32c, w.record
    tally = w.scanner is not None
    append = w.offsets.append
    pos = start
    found = 0
    while pos < end:
        n = stream.read_into(view[:min(len(buf), end - pos)], pos)
        if n <= 0:
            raise DataLoss(f"{rel}: ends at byte {pos}, before {end} as indexed")
        took = _copy_checked(view[:n], pos, end, w, stream.fd)
        if took is not None:
            pos += took[0]
            found += took[1]
            continue
        p = seg = 0
        at, data_bytes = w.stream, 0
        while p + HEADER <= n:
            length = hdr(view, p)[0]
            stop = p + OVERHEAD + length
            if stop > n:
                break
            data = view[p + HEADER:stop - FOOTER]
            c = crc(data)
            if u32(view, stop - FOOTER)[0] != ((((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF):
                w.emit_from(view[seg:p], stream.fd, pos + seg)
                seg = stop
                dropped.append(dict(Problem(pos + p, f"data checksum failed for the record at offset {pos + p}").fields(), shard=rel))
            elif tally:
                record(length, data)
            else:
                at += OVERHEAD + length
                append(at)
                data_bytes += length
            found += 1
            p = stop
        if not tally:
            w.stream, w.data_bytes = at, w.data_bytes + data_bytes
        w.emit_from(view[seg:p], stream.fd, pos + seg)
        if p == 0:   # a record larger than the buffer
            p = _copy_large(stream, pos, w, dropped, rel, bytes(view[:HEADER]))
            found += 1
        pos += p
    return found


def _copy_checked(block: memoryview, pos: int, end: int, w: ShardWriter, fd: int | None) -> tuple[int, int] | None:
    """``_copy_run``'s step for one block in C (``bulk.checked_run``): the sound records wholly in
    ``block`` (read at ``pos``), headers and data checksums checked, written as they are, their
    offsets and tally given to ``w`` in bulk. (bytes taken, records), or None where the Python
    loop must take the block: no compiled walker, a record whose checksum fails, or a first record
    the block does not hold (large, or not where the index says)."""
    # Read with the new shard's stream offsets: the headers' offsets are then the new index's.
    run = bulk.checked_run(block, w.stream, w.stream + end - pos, "raw")
    if run is None or not run.offsets or run.failed:
        return None
    taken = run.next - w.stream
    w.emit_from(block[:taken], fd, pos)
    w.take_block(block, run.offsets, run.next)
    return taken, len(run.offsets)


def _copy_large(stream: _Stream, pos: int, w: ShardWriter, dropped: list[dict], rel: str, head: bytes) -> int:
    """One record too large for a block, at ``pos``: its data checksum checked a piece at a time,
    then copied a piece at a time. Returns its framed size."""
    length, hcrc = _HDR.unpack(head)
    if _masked(crc32c.crc32c(head[:8])) != hcrc:
        raise DataLoss(f"{rel}: no record header at byte {pos}: the shard changed since it was indexed")
    buf = bytearray(BLOCK)
    view = memoryview(buf)

    def pieces() -> Iterator[memoryview]:
        at, stop = pos + HEADER, pos + HEADER + length
        while at < stop:
            n = stream.read_into(view[:min(BLOCK, stop - at)], at)
            if n <= 0:
                raise DataLoss(f"{rel}: the record at byte {pos} is cut short")
            yield view[:n]
            at += n
    crc = 0
    for piece in pieces():
        crc = crc32c.crc32c(piece, crc)
    tail = bytearray(FOOTER)
    stream.read_into(memoryview(tail), pos + HEADER + length)
    if _U32.unpack(tail)[0] != _masked(crc):
        dropped.append(dict(Problem(pos, f"data checksum failed for the record at offset {pos}").fields(), shard=rel))
        return OVERHEAD + length
    w.emit(head)
    for piece in pieces():
        w.emit(piece)
    w.emit(bytes(tail))
    if stream.fd is not None:
        # The tally reads a large record where it lies (mapped), never copied.
        first = (pos + HEADER) // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
        with mmap.mmap(stream.fd, pos + HEADER + length - first, offset=first, access=mmap.ACCESS_READ) as m:
            mv = memoryview(m)
            try:
                w.record(length, mv[pos + HEADER - first:])
            finally:
                mv.release()
    else:
        w.record(length, None)
    return OVERHEAD + length


def _copy_picks(opened: _Opened, task: Task, w: ShardWriter, dropped: list[dict]) -> None:
    """Copy shuffled records, each read where it lies; written out a block at a time."""
    assert task.picks is not None
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    out = bytearray()
    for src, offset, length in PICK.iter_unpack(task.picks):
        stream = opened.get(task.sources[src])
        rel = task.sources[src].relpath
        if OVERHEAD + length > BLOCK:
            w.emit(out)
            out = bytearray()
            got = stream.read_into(view[:HEADER], offset)
            _copy_large(stream, offset, w, dropped, rel, bytes(view[:got]))
            continue
        frame = view[:OVERHEAD + length]
        if stream.read_into(frame, offset) < len(frame):
            raise DataLoss(f"{rel}: the record at byte {offset} is cut short")
        got_length, hcrc = _HDR.unpack_from(frame, 0)
        if got_length != length or _masked(crc32c.crc32c(frame[:8])) != hcrc:
            raise DataLoss(f"{rel}: no record header at byte {offset}: the shard changed since it was indexed")
        data = frame[HEADER:HEADER + length]
        if _U32.unpack_from(frame, HEADER + length)[0] != _masked(crc32c.crc32c(data)):
            dropped.append(dict(Problem(offset, f"data checksum failed for the record at offset {offset}").fields(), shard=rel))
            continue
        w.record(length, data)
        out += frame
        if len(out) >= BLOCK:
            w.emit(out)
            out = bytearray()
    w.emit(out)
