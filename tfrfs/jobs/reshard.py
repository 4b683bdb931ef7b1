"""``tfrfs reshard SOURCE DEST`` (SPEC 8): SOURCE's records copied byte for byte into new shards.

The driver plans (``reshardplan``: the order, the cuts, the names), one job per new shard
(``jobs``: here, a local pool, or Ray), and publishes the result whole (``publish``). A job
streams its records from SOURCE: without ``--shuffle`` they are a few contiguous byte ranges of
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

import bisect
import hashlib
import json
import math
import mmap
import os
import struct
import tempfile
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import crc32c

from tfrfs.index import idxfile
from tfrfs.jobs import reshardplan
from tfrfs.index import tfds_info as tfds
from tfrfs.format import bulk, salvage, tfrecord
from tfrfs.errors import DataLoss, UsageError
from tfrfs.index.shard_index import ShardIndex
from tfrfs.index.discovery import INDEX_SUFFIXES
from tfrfs.index.where import Where
from tfrfs.jobs.publish import Dest
from tfrfs.jobs.shardwrite import ShardWriter
from tfrfs.storage.local_reader import advise
from tfrfs.format.tfrecord import FOOTER, HEADER, OVERHEAD, Problem

BLOCK = 8 << 20          # bytes of source read at once (a worker's buffer)
_HDR = struct.Struct("<QI")
_U32 = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
_PICK = struct.Struct("<IQQ")   # a shuffled record: source shard, offset, length


# --- what a job gets ----------------------------------------------------------------------------

@dataclass(frozen=True)
class SourceShard:
    """How a job reads one shard's uncompressed stream."""

    path: str
    relpath: str
    compression: str
    data_path: str          # the driver's inflated copy of a compressed shard (used when here)
    stream_size: int


@dataclass(frozen=True)
class Task:
    """One new shard: its number, name, and the records it takes, in order: contiguous ``runs``
    of source streams ``(source, start byte, end byte, records)``, or ``picks`` (packed
    ``_PICK``s) under a shuffle."""

    n: int
    name: str
    count: int
    sources: tuple[SourceShard, ...]
    runs: tuple[tuple[int, int, int, int], ...] = ()
    picks: bytes | None = None
    unchecked: bool = False          # runs copied as byte ranges, no record read (``_copy_unchecked``)
    starts: tuple[bytes, ...] = ()   # ... each run's record offsets in SOURCE (packed u64)
    dropped: tuple[dict, ...] = ()   # ... and the records left out for a data checksum indexing saw fail


# --- the job ------------------------------------------------------------------------------------

def copy_shard(where: Where, dest: Dest, task: Task, compression: str, kind: str, tally: bool) -> dict:
    """A job: write ``task``'s shard (and its index file and receipt) into DEST. Returns its
    figures, with the records dropped for a failed data checksum (``dropped``)."""
    w = ShardWriter(dest, task.name, compression, kind, tally)
    dropped: list[dict] = []
    opened = _Opened(where, task.sources)
    try:
        if task.unchecked:
            dropped.extend(task.dropped)
            for k, (src, start, end, count) in enumerate(task.runs):
                starts = task.starts[k] if task.starts else None
                _copy_unchecked(opened.get(src), start, end, starts, w, count, task.sources[src].relpath)
        elif task.picks is None:
            for src, start, end, count in task.runs:
                got = _copy_run(opened.get(src), start, end, w, dropped, task.sources[src].relpath)
                if got != count:
                    raise DataLoss(f"{task.sources[src].relpath}: {got} records between bytes {start} and {end}, "
                                   f"its index says {count}: the shard changed since it was indexed")
        else:
            _copy_picks(opened, task, w, dropped)
        body = w.finish()
    except BaseException:
        w.abort()
        raise
    finally:
        opened.close()
    body.update(n=task.n, dropped=dropped)
    dest.receipt(task.n, body)
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
    """The source streams a job reads, opened when first needed."""

    def __init__(self, where: Where, sources: tuple[SourceShard, ...]) -> None:
        self.where = where
        self.sources = sources
        self.open: dict[int, _Stream] = {}

    def get(self, n: int) -> _Stream:
        s = self.open.get(n)
        if s is None:
            s = self.open[n] = _open_stream(self.where, self.sources[n])
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
    for src, offset, length in _PICK.iter_unpack(task.picks):
        stream = opened.get(src)
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


# --- the plan -----------------------------------------------------------------------------------

@dataclass
class Group:
    """Source shards resharded together (a TFDS split, or the whole dataset) and the new names."""

    split: dict | None              # the TFDS split, or None
    indexes: list[ShardIndex]
    numbers: list[int]              # the shards' numbers in SOURCE
    cuts: list[tuple[int, int]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)


@dataclass
class Plan:
    key: str
    groups: list[Group]
    sources: tuple[SourceShard, ...]
    compression: str
    kind: str
    shuffle: int | None
    info: dict | None                    # the source's dataset_info.json, parsed
    copies: list[str]                    # TFDS plain files copied as they are (relative paths)
    problems: list[tuple[str, dict]]     # what SOURCE's indexes already say is lost
    total: int = 0
    schema: bool = True                  # the jobs tally their shards' records (SPEC 5)
    unchecked: bool = False              # --no-check: runs copied without reading their records
    source_tallies: list | None = None   # else SOURCE's own, when all are known (the same records)

    @property
    def names(self) -> list[str]:
        return [n for g in self.groups for n in g.names]


def _group_cuts(g: Group, shards: int | None, shard_size: int | None, shuffled: bool) -> list[tuple[int, int]]:
    total = sum(i.count for i in g.indexes)
    if shards is not None:
        return reshardplan.cut_by_count(total, shards)
    assert shard_size is not None
    if shuffled:
        # Shuffled records are spread at random, so their sizes even out: equal counts.
        stream = sum((i.offsets[-1] - i.offsets[0]) if i.count else 0 for i in g.indexes)
        return reshardplan.cut_by_count(total, max(1, math.ceil(stream / shard_size)))
    return reshardplan.cut_by_size([i.offsets for i in g.indexes], shard_size)


def _runs(g: Group, order: reshardplan.Order, lo: int, hi: int, starts: list[bytes] | None = None,
          drops: list[dict] | None = None, *, pack: bool = True) -> list[tuple[int, int, int, int]]:
    """Contiguous byte ranges holding global records [lo, hi) of a group, split at gaps; with
    ``starts``, each run's record offsets (packed u64; unless not ``pack``) are appended to it, and the records whose
    data checksums indexing found failing (``ShardIndex.checked``) are left out, each one a
    problem appended to ``drops`` as a job that read it would report it."""
    out: list[tuple[int, int, int, int]] = []

    def run(k: int, first: int, start: int, end: int, count: int) -> None:
        if count <= 0:
            return
        out.append((g.numbers[k], start, end, count))
        if starts is not None and pack:
            starts.append(idxfile.as_u64(g.indexes[k].offsets[first:first + count]))
    # Only the shards holding records [lo, hi): a shard's first record at most hi - 1, its end past lo.
    first_shard = bisect.bisect_right(order.starts, lo) - 1
    last_shard = bisect.bisect_left(order.starts, hi, lo=first_shard)
    for k in range(max(0, first_shard), min(len(g.indexes), last_shard)):
        idx = g.indexes[k]
        a, b = max(lo, order.starts[k]) - order.starts[k], min(hi, order.starts[k + 1]) - order.starts[k]
        if a >= b:
            continue
        offsets, ends = idx.offsets, idx.ends
        cuts = {i: "gap" for i in ends if a <= i < b - 1} if ends else {}
        if starts is not None and idx.checked:
            cuts.update((i, "failed") for i in idx.checked if a <= i < b)
        first = a
        for i in sorted(cuts):
            if cuts[i] == "failed":
                run(k, first, offsets[first], offsets[i], i - first)
                if drops is not None:
                    at = offsets[i]
                    drops.append(dict(Problem(at, f"data checksum failed for the record at offset {at}").fields(),
                                      shard=idx.shard.relpath))
            else:
                run(k, first, offsets[first], ends[i], i + 1 - first)
            first = i + 1
        if first < b:
            last = ends.get(b - 1) if ends else None
            run(k, first, offsets[first], offsets[b] if last is None else last, b - first)
    return out


def _picks(g: Group, order: reshardplan.Order, perm: reshardplan.Permutation, lo: int, hi: int) -> bytes:
    packed = bytearray()
    pack = _PICK.pack
    for i in range(lo, hi):
        k, r = order.locate(perm(i))
        start, length = g.indexes[k].span(r)
        packed += pack(g.numbers[k], start, length)
    return bytes(packed)


class Tasks(Sequence):
    """The jobs of a plan, made when the runner asks for them (a shuffle's picks are computed one
    shard at a time, while earlier shards are written), less those an earlier run finished."""

    def __init__(self, plan: Plan, skip: set[int]) -> None:
        self.plan = plan
        self.todo: list[tuple[Group, int, int]] = []    # (group, cut number, job number)
        n = 0
        for g in plan.groups:
            for c in range(len(g.cuts)):
                if n not in skip:
                    self.todo.append((g, c, n))
                n += 1
        self._orders = {id(g): reshardplan.Order([i.count for i in g.indexes]) for g in plan.groups}
        self._perms = {id(g): reshardplan.Permutation(self._orders[id(g)].total, plan.shuffle)
                       for g in plan.groups} if plan.shuffle is not None else {}

    def __len__(self) -> int:
        return len(self.todo)

    def task(self, k: int) -> Task:
        g, c, n = self.todo[k]
        lo, hi = g.cuts[c]
        order = self._orders[id(g)]
        if self.plan.shuffle is None:
            starts: list[bytes] | None = [] if self.plan.unchecked else None
            drops: list[dict] = []
            # The offsets of an unchecked copy go with the job only where its headers cannot be
            # walked in C (sending them costs more than finding them again).
            runs = _runs(g, order, lo, hi, starts, drops, pack=not bulk.available())
            # The job gets the source shards it reads, numbered in its runs.
            used = sorted({run[0] for run in runs})
            mine = {src: k for k, src in enumerate(used)}
            return Task(n, g.names[c], hi - lo, tuple(self.plan.sources[k] for k in used),
                        runs=tuple((mine[src], a, b, count) for src, a, b, count in runs),
                        unchecked=self.plan.unchecked, starts=tuple(starts or ()), dropped=tuple(drops))
        return Task(n, g.names[c], hi - lo, self.plan.sources, picks=_picks(g, order, self._perms[id(g)], lo, hi))

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        return self.task(k)


def tfds_info(path: str, files: Any) -> dict | None:
    """SOURCE's ``dataset_info.json`` at ``path`` when it is a TFDS dataset folder (its splits
    list shards)."""
    try:
        info = json.loads(files.read_bytes(path))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and tfds.splits_of(info) else None


def make_plan(src: Any, indexes: list[ShardIndex], dest: Dest, *, shards: int | None, shard_size: int | None,
              compression: str, shuffle: int | None, template: str | None, schema: bool | None = None,
              check: bool = True) -> Plan:
    """Everything the jobs and the publishing need, from SOURCE's indexes. Raises UsageError."""
    disc = src.discovery
    info = tfds_info(src.storage.join(disc.root, tfds.INFO), disc.access) \
        if disc.mirrors_dir and tfds.INFO in disc.plain_files else None
    sources = tuple(SourceShard(i.shard.path, i.shard.relpath, i.shard.compression, i.data_path,
                                _stream_size(i)) for i in indexes)
    groups: list[Group] = []
    copies: list[str] = []
    if info is not None:
        by_split: dict[str, Group] = {}
        if template is not None:
            reshardplan.check_template(template, ("DATASET", "SPLIT", "FILEFORMAT"))
        for n, idx in enumerate(indexes):
            found = tfds.place(info, idx.shard.relpath) if os.sep not in idx.shard.relpath else None
            if found is None:
                raise UsageError(f"{idx.shard.relpath}: a shard that no split of {tfds.INFO} lists; "
                                 "reshard the split's shards alone, or fix dataset_info.json")
            split = found[0]
            g = by_split.setdefault(str(split.get("name")), Group(split, [], []))
            g.indexes.append(idx)
            g.numbers.append(n)
        # Shards in their split's order (TFDS reads them so), splits in the file's order.
        for split in tfds.splits_of(info):
            g2 = by_split.get(str(split.get("name")))
            if g2 is None:
                continue
            t = tfds.FileTemplate(info, split)
            names = t.names(len(split["shardLengths"]))
            pairs = sorted(zip(g2.indexes, g2.numbers), key=lambda p: names.index(p[0].shard.relpath))
            g2.indexes, g2.numbers = [p[0] for p in pairs], [p[1] for p in pairs]
            groups.append(g2)
        copies = [rel for rel in disc.plain_files if os.sep not in rel and "/" not in rel
                  and rel != tfds.INFO and not rel.endswith(INDEX_SUFFIXES)]
        info = json.loads(json.dumps(info))
    else:
        if template is not None:
            reshardplan.check_template(template, ("PREFIX",))
        groups.append(Group(None, list(indexes), list(range(len(indexes)))))
    fixed = {"PREFIX": reshardplan.prefix_of([os.path.basename(i.shard.relpath) for i in indexes], dest.name)}
    for g in groups:
        g.cuts = _group_cuts(g, shards, shard_size, shuffle is not None)
        if g.split is not None:
            assert info is not None
            if template is not None:
                g.split["filepathTemplate"] = template
            g.names = tfds.FileTemplate(info, g.split).names(len(g.cuts))
        else:
            g.names = [reshardplan.shard_name(template or reshardplan.PLAIN_TEMPLATE, i, len(g.cuts), fixed)
                       for i in range(len(g.cuts))]
    names = [n for g in groups for n in g.names]
    if len(set(names)) != len(names):
        raise UsageError(f"--name {template}: gives two shards the same name")
    kinds = {i.detected_kind for i in indexes}
    kind = kinds.pop() if len(kinds) == 1 else "raw"
    problems = [(i.shard.relpath, p.fields()) for i in indexes for p in i.problems]
    key = hashlib.sha256(json.dumps({
        "source": src.storage.absolute(src.name),
        "shards": [[i.shard.relpath, i.shard.size, i.shard.identity] for i in indexes],
        "cut": [shards, shard_size], "compression": compression, "shuffle": shuffle, "names": names,
    }, sort_keys=True).encode()).hexdigest()
    # Splits are rewritten in ``info``'s own dicts (the groups hold them).
    # The new dataset's schema is SOURCE's when every record is copied and SOURCE's is known (the
    # same records): the jobs then tally nothing (``schema=None``), unless asked to (True).
    tallies = [i.tally for i in indexes] if not problems and not any(i.checked for i in indexes) else []
    known = bool(tallies) and all(t is not None and t.kind == kind for t in tallies)
    if schema is None:
        schema = not known
    plan = Plan(key, groups, sources, compression, kind, shuffle, info, copies, problems, schema=schema)
    if not schema and known:
        plan.source_tallies = [t for t in tallies if t is not None]
    # A record need not be looked at when its data checksum was checked while SOURCE was indexed
    # (or the user says not to check): a plain copy without a tally is then made of byte ranges.
    checked = all(i.checked is not None for i in indexes)
    plan.unchecked = (not check or checked) and not schema and shuffle is None and compression == tfrecord.NONE
    plan.total = sum(i.count for i in indexes)
    return plan


def _stream_size(idx: ShardIndex) -> int:
    if idx.shard.compression == tfrecord.NONE:
        return idx.shard.size
    try:
        return os.path.getsize(idx.data_path)
    except OSError:
        return -1
