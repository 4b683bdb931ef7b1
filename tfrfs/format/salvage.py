"""SPEC 6: walking a shard's records, and past the damage in it.

TensorFlow stops at the first record it cannot read. The walk here does what it does while the
records are sound, and where they are not — a header whose length checksum fails, a length that
runs past the end, zeroed or garbage bytes — it looks for the next offset where a record is sound
again (header checksum, a length that fits, data checksum) and goes on from there. The gap is one
problem. The index builder (headers only) and ``verify`` (every byte) share this one walk.

Looking for the next sound record must not cost a Python step per byte. A record's length is
smaller than the stream, so the top bytes of its u64 length are zero: the candidates are where
that run of zero bytes occurs (``bytes.find``, in C), and a long run of zeros is skipped whole
(a header of twelve zero bytes never checks). Only candidates have their header checksum tested.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass, field
from array import array
from typing import BinaryIO, Callable, Iterator

from tfrfs.format import bulk, tfrecord
from tfrfs.errors import DataLoss
from tfrfs.format.tfrecord import HEADER, OVERHEAD, Problem, PRead

CHUNK = 1 << 20            # bytes read at once while walking small records and while resyncing
_SMALL = 64 << 10          # a record at least this long is stepped over, not read, in a header walk
_HDR = struct.Struct("<QI")
_U64 = struct.Struct("<Q")
BLOCK = 4 << 20            # bytes read at once by ``Walk.offsets`` while records are small
_LENGTH_CRCS: dict[int, int] = {}   # record length -> its header's checksum (a pure function)
_NONZERO = re.compile(rb"[^\x00]")
_ZERO_STEPS = tuple(bytes(n) for n in (1 << 16, 1 << 12, 1 << 8))
_EMPTY_CRC = struct.pack("<I", tfrecord.masked_crc(bytes(8)))   # the header checksum of a 0 length
assert 0 not in _EMPTY_CRC


class _Window:
    """Reads of a stream through ``pread`` served from one buffer, refilled as the walk moves on."""

    def __init__(self, pread: PRead, size: int) -> None:
        self.pread = pread
        self.size = size
        self.start = 0
        self.buf = b""

    def get(self, pos: int, n: int, ahead: int = CHUNK) -> bytes:
        """Bytes [pos, pos + n) (fewer at the end of the stream); a refill reads ``ahead`` more."""
        rel = pos - self.start
        if 0 <= rel and rel + n <= len(self.buf):
            return self.buf[rel:rel + n]
        if n > CHUNK:
            return self.pread(n, pos)   # a large record's data: not kept
        self.start = pos
        self.buf = self.pread(min(n + ahead, max(0, self.size - pos)), pos)
        return self.buf[:n]


def find_sound(pread: PRead, size: int, start: int) -> int | None:
    """The first offset at or after ``start`` where a whole sound record begins (header checksum,
    a length that fits in ``size``, data checksum), or None."""
    nb = max(1, (size.bit_length() + 7) // 8)   # a length < size fits in this many low bytes
    zeros = 8 - nb                               # ... so the length's top bytes are zero
    needle = b"\x00" * zeros
    pos = start
    while pos + HEADER <= size:
        buf = pread(min(CHUNK + HEADER - 1, size - pos), pos)
        limit = min(len(buf) - HEADER + 1, CHUNK)   # candidates p = pos + i, i < limit
        if limit <= 0:
            return None   # the stream ended early (it shrank while read)
        room = size - pos - OVERHEAD
        unpack, crc = _HDR.unpack_from, tfrecord.masked_crc
        for i in _candidates(buf, limit, nb, needle):
            length, hcrc = unpack(buf, i)
            if length > room - i or crc(buf[i:i + 8]) != hcrc:
                continue
            at = pos + i
            try:
                tfrecord.read_record(pread, at, length)
            except DataLoss:
                continue    # not sound: look further
            return at
        pos += limit
    return None


def _candidates(buf: bytes, limit: int, nb: int, needle: bytes) -> Iterator[int]:
    """Offsets ``i < limit`` in ``buf`` where a record header may start, in order: its length's
    top bytes (``needle``, at ``i + nb``) are zero and its twelve bytes are not all zero."""
    if not needle:          # a stream of 2^56 bytes or more: every offset
        yield from range(limit)
        return
    done = 0                # candidates below this were given
    j = buf.find(needle, nb)
    while j != -1 and j - nb < limit:
        run_end = _zero_run_end(buf, j)              # zeros fill [j, run_end)
        # A candidate p has p + nb .. p + 7 inside the run: p in [j - nb, run_end - 8]. One that
        # starts inside the run (p >= j) has a length of 0, so its checksum is the empty record's,
        # whose bytes are all non-zero: only p = run_end - 8 can be one, and only if they follow.
        hi = run_end - 8
        for p in range(max(j - nb, done), min(j, hi + 1, limit)):
            yield p
            done = p + 1
        if j <= hi < limit and hi >= done and buf.startswith(_EMPTY_CRC, run_end):
            yield hi
            done = hi + 1
        j = buf.find(needle, run_end + 1)


def _zero_run_end(buf: bytes, j: int) -> int:
    """Where the run of zero bytes at ``buf[j]`` ends: long runs in big steps (memcmp), the rest
    of it (under 256 bytes) by a regular expression."""
    n = len(buf)
    for zeros in _ZERO_STEPS:
        step = len(zeros)
        while j + step <= n and buf.startswith(zeros, j):
            j += step
    m = _NONZERO.search(buf, j, j + 256)
    return m.start() if m else n


@dataclass
class Walk:
    """The records of a plain stream, in order, past any damage (SPEC 6).

    Iterating gives ``(offset, length, data)`` per record: ``data`` is None in a header walk,
    else the record's bytes with ``ok`` telling whether their checksum held (a record whose
    data checksum fails is still a record: its header was sound). ``problems`` gets one problem
    per gap and for the end of the walk; ``ends`` the end of each record a gap follows.

    A walk may cover part of a stream: from ``start``, a record boundary an index gives (the
    record numbered ``count``), to ``size``, the start of a later record or the stream's end.
    It then gives exactly what the walk of the whole stream gives between those points.
    """

    pread: PRead
    size: int
    with_data: bool = False
    problems: list[Problem] = field(default_factory=list)
    ends: dict[int, int] = field(default_factory=dict)
    count: int = 0
    end: int = 0              # where the last record ends (0: no record)
    ok: bool = True           # the last record's data checksum held (with_data)
    cut: bool = False         # the walk ended in a record cut short by the end of the stream
    start: int = 0            # where the walk starts (``count``: the number of the record there)

    def __iter__(self) -> Iterator[tuple[int, int, bytes | None]]:
        win = _Window(self.pread, self.size)
        pos, size = self.start, self.size
        ahead = CHUNK
        while pos < size:
            head = win.get(pos, HEADER, ahead)
            length, resume = self._judge(head, pos)
            if length is None:
                if resume is None:
                    return
                pos = resume
                continue
            data: bytes | None = None
            if self.with_data:
                body = win.get(pos + HEADER, length + tfrecord.FOOTER)
                data = body[:length]
                self.ok = tfrecord.check_data(body[length:], data)
            yield pos, length, data
            self.count += 1
            pos += OVERHEAD + length
            self.end = pos
            ahead = CHUNK if length < _SMALL else 4096

    def runs(self, kind: str, *, read_large: bool = True) -> Iterator[bulk.Checked]:
        """What iterating with data gives, in runs taken in C (``bulk.checked_run``, which must be
        ``available``) a block at a time. A record that a block does not hold whole is read
        alone (a run of one; without ``read_large``, checked a piece at a time, and the run holds
        its header only), and damage is judged by the walk's own step, so
        ``problems``, ``ends``, ``count``, ``end`` and ``cut`` are what iterating gives; so are
        the records whose checksum fails (``failed``). Their parse as ``kind`` is left to the
        caller for the records in ``unsure``."""
        assert self.with_data
        pos, size = self.start, self.size
        while pos < size:
            block = self.pread(min(BLOCK, size - pos), pos)
            run = bulk.checked_run(block, pos, size, kind)
            assert run is not None, "runs() needs the compiled walker"
            if run.offsets:
                yield run
                self.count += len(run.offsets)
                self.end = pos = run.next
                continue
            framed = block[:HEADER]
            length, resume = self._judge(framed, pos)
            if length is None:
                if resume is None:
                    return
                pos = resume
                continue
            # A record larger than a block: read whole, or checked a piece at a time.
            if read_large:
                framed = self.pread(OVERHEAD + length, pos)
                ok = tfrecord.check_data(framed[HEADER + length:], memoryview(framed)[HEADER:HEADER + length])
            else:
                try:
                    tfrecord.check_record_at(self.pread, pos, length)
                    ok = True
                except DataLoss:
                    ok = False
            failed = [] if ok else [0]
            yield bulk.Checked(array("Q", [pos]), pos + OVERHEAD + length, failed,
                               bulk.parse_unsure(kind, 1, failed, [0] if ok else []), length, framed, pos)
            self.count += 1
            self.end = pos = pos + OVERHEAD + length

    def offsets(self, seen: Seen | None = None) -> array:
        """The header offsets a header walk gives (``__iter__`` without data), as an array, with
        the same ``problems``, ``ends``, ``count``, ``end`` and ``cut``.

        Sound headers are taken a block at a time by ``sound_run`` (no read, no generator step
        per record); at the first header it does not take, this falls back to the walk's own
        step for that one header, so damage is judged and reported exactly as ``__iter__`` does.
        ``seen(block, base, offsets, taken, end)`` is shown each block read (the stream's bytes
        from ``base``) once the ``taken`` headers it gave are at the end of ``offsets``, the last
        record ending at ``end``."""
        assert not self.with_data
        out = array("Q")
        pos, size = 0, self.size
        ahead = BLOCK
        while pos < size:
            block = self.pread(min(ahead, size - pos), pos)
            taken, nxt = sound_run(block, pos, size, out)
            if taken and seen is not None:
                seen(block, pos, out, taken, nxt)
            if taken:
                self.count += taken
                self.end = pos = nxt
                # After a large record only its successor's header is wanted, not a block.
                ahead = BLOCK if nxt - out[-1] < _SMALL else 4096
                continue
            length, resume = self._judge(block[:HEADER], pos)
            if length is None:
                if resume is None:
                    break
                pos = resume
                continue
            out.append(pos)        # (``sound_run`` takes every header this takes)
            self.count += 1
            self.end = pos = pos + OVERHEAD + length
        return out

    def _judge(self, head: bytes, pos: int) -> tuple[int | None, int | None]:
        """The header ``head`` at ``pos``: (its record's length, None) when sound; else the
        problem is recorded and it is (None, where records resume), or (None, None) at the end."""
        length, problem = tfrecord.header_problem(head, pos, self.size, self.count)
        if length is not None:
            return length, None
        assert problem is not None
        # Fewer than 12 bytes left, or a sound header whose length runs past the end: the stream
        # was cut short (unless records resume after it).
        cut = len(head) < HEADER or tfrecord.parse_header(head) is not None
        if not self._resync(pos, problem, trailing=len(head) < HEADER, cut=cut):
            return None, None
        return None, self.problems[-1].resync_offset

    def _resync(self, pos: int, problem: Problem, *, trailing: bool, cut: bool) -> bool:
        """Record the problem at ``pos``; whether records resume after it (then the last problem
        says where)."""
        found = None if trailing else find_sound(self.pread, self.size, pos + 1)
        if found is None:
            self.cut = cut
            reason = problem.reason if self.cut else \
                f"{problem.reason}; no sound record in the {self.size - pos} bytes after it"
            self.problems.append(Problem(pos, reason, self.count, skipped=self.size - pos))
            return False
        if self.count:
            self.ends[self.count - 1] = pos
        self.problems.append(Problem(pos, f"{problem.reason}; {found - pos} bytes skipped, records resume "
                                          f"at offset {found}", self.count, resync_offset=found,
                                     skipped=found - pos))
        return True


Seen = Callable[[bytes, int, array, int, int], None]
"""What ``Walk.offsets`` shows each block it reads: (block, base, offsets, taken, end)."""


def sound_run(block: bytes | memoryview, base: int, size: int, out: array) -> tuple[int, int]:
    """Take the run of sound headers at the start of ``block`` (the stream's bytes from offset
    ``base``; the stream is ``size`` bytes): each whole in the block, its length checksum holding
    and its record fitting in the stream, as ``tfrecord.header_problem`` judges. Their offsets go
    to ``out``; returns (how many, the offset after the last). A header's checksum is a function
    of its length alone, so it is computed once per length seen (records of a shard share few).
    In C (``bulk.sound_run``) where it was built."""
    fast = bulk.sound_run(block, base, size, out)
    if fast is not None:
        return fast
    unpack, crcs, append = _HDR.unpack_from, _LENGTH_CRCS, out.append
    room = size - base - OVERHEAD      # a record at p fits when p + length <= room
    limit = len(block) - HEADER
    before = len(out)
    p = 0
    while p <= limit:
        length, hcrc = unpack(block, p)
        if crcs.get(length) != hcrc:
            if length in crcs or p + length > room:
                break
            if len(crcs) >= 1 << 16:
                crcs.clear()
            crcs[length] = tfrecord.masked_crc(_U64.pack(length))
            if crcs[length] != hcrc:
                break
        if p + length > room:
            break
        append(base + p)
        p += OVERHEAD + length
    return len(out) - before, base + p


# --- compressed streams ---------------------------------------------------------------------

def inflate(src: BinaryIO, dst: BinaryIO, compression: str, chunk: int = 1 << 20) -> Problem | None:
    """Inflate a whole GZIP or ZLIB shard into ``dst``, as far as it goes.

    Where the stream is damaged, everything zlib gives before the damage is kept: the input that
    failed is fed again in smaller and smaller pieces from a copy of the decompressor taken before
    it. Returns the problem (``offset`` in the inflated stream, ``compressed_offset`` in the file),
    or None.
    """
    wbits = 16 + zlib.MAX_WBITS if compression == tfrecord.GZIP else zlib.MAX_WBITS
    state = _Inflater(zlib.decompressobj(wbits), dst, wbits, compression)
    while block := src.read(chunk):
        problem = state.feed(block)
        if problem is not None:
            return problem
    return state.finish()


class _Inflater:
    def __init__(self, d: zlib._Decompress, dst: BinaryIO, wbits: int, compression: str) -> None:
        self.d = d
        self.dst = dst
        self.wbits = wbits
        self.compression = compression
        self.written = 0      # bytes inflated
        self.consumed = 0     # compressed bytes fed

    def _out(self, data: bytes) -> None:
        self.dst.write(data)
        self.written += len(data)

    def feed(self, block: bytes, piece: int = 64 << 10) -> Problem | None:
        view = memoryview(block)
        i = 0
        while i < len(view):
            part = view[i:i + piece]
            saved = self.d.copy()
            try:
                out = self.d.decompress(part)
            except zlib.error as exc:
                if len(part) == 1:
                    return Problem(self.written, f"{self.compression} stream is damaged: {exc}; the records "
                                                 "wholly before it are served", compressed_offset=self.consumed)
                self.d = saved
                problem = self.feed(bytes(part), max(1, piece // 16))
                if problem is not None:
                    return problem
                i += len(part)
                continue
            self._out(out)
            if self.d.eof:
                used = len(part) - len(self.d.unused_data)
                self.consumed += used
                rest = bytes(view[i + used:])
                return self._after_end(rest) if rest else None
            self.consumed += len(part)
            i += len(part)
        return None

    def _after_end(self, rest: bytes) -> Problem | None:
        """Bytes after the end of a stream: another gzip member, read on as one stream; else damage."""
        if self.compression == tfrecord.GZIP and rest[:2] == b"\x1f\x8b":
            self.d = zlib.decompressobj(self.wbits)
            return self.feed(rest)
        return Problem(self.written, f"{len(rest)} bytes of trailing data after the {self.compression} stream",
                       compressed_offset=self.consumed)

    def finish(self) -> Problem | None:
        if self.d.eof:
            return None
        try:
            self._out(self.d.flush())
        except zlib.error:
            pass
        return Problem(self.written, f"{self.compression} stream is cut short; the records wholly before "
                                     "its end are served", compressed_offset=self.consumed)


def merge_stream_problem(stream: Problem | None, walk: Walk) -> list[Problem]:
    """The problems of a compressed shard: the stream's damage, and the framing problems of what
    inflated, except a record cut short by the end of what inflated (the same damage, seen
    again). A header that fails before that end is kept: it says where the records stop."""
    if stream is None:
        return list(walk.problems)
    if not walk.cut:
        return [stream, *walk.problems]
    return [stream, *walk.problems[:-1]]
