"""Runs of sound records taken a block at a time, in C (``tfrfs.format._records``) where it was
built: the per-record loops of ``index``, ``verify``, ``reshard`` and ``repair``.

Each function here answers None where the compiled part is missing (or ``TFRFS_PURE=1``): its
caller then takes its own Python path, which stays the reference. Where it answers, the answer is
the Python path's, record for record (tests/unit/test_bulk.py holds both to it); what C cannot
vouch for (damage, an unusual encoding) it hands back to the caller's Python path.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass, field
from typing import Any, Iterable, Sized

from tfrfs.format import compiled, shown_as

_C: Any = compiled.optional("tfrfs.format._records")

KINDS = ("none", "bytes_list", "float_list", "int64_list")   # ``_example_wire.h``'s numbering
SUFFIXES = (".jpg", ".png", ".gif", ".bmp", ".webp", ".tif", ".wav", ".flac", ".mp3", ".ogg",
            ".txt", ".bin", shown_as.JSON, ".list")          # ``_records.c``'s TALLY suffixes
_PARSE_KIND = {"example": 1}                                 # record kinds whose parse C checks
_U64 = struct.Struct("<Q")
_FEATURE = struct.Struct("=BQBBB")   # kind, count, suffix, newline, raw (as C wrote them: native order)


def available() -> bool:
    return _C is not None


def sound_run(block: bytes | memoryview, base: int, size: int, out: array) -> tuple[int, int] | None:
    """``salvage.sound_run`` in C: the run of sound headers at the start of ``block`` appended
    to ``out`` (an array of "Q"); (how many, the offset after the last). None without C."""
    if _C is None:
        return None
    offsets, nxt, _, _, _ = _C.run(block, base, size, False, 0)
    out.frombytes(offsets)
    return len(offsets) // 8, nxt


@dataclass
class Checked:
    """The run of whole sound records at the start of a block, every data checksum checked: they
    lie back to back in ``block`` (the stream's bytes from ``base``)."""

    offsets: array                                      # their header offsets
    next: int                                           # where the record after them starts
    failed: list[int] = field(default_factory=list)     # their numbers in the run: checksum failed
    unsure: list[int] = field(default_factory=list)     # ... parse left to protobuf
    data_bytes: int = 0
    block: bytes | memoryview = b""
    base: int = 0

    def length(self, i: int) -> int:
        """Record ``i``'s data length (its header's)."""
        return _U64.unpack_from(self.block, self.offsets[i] - self.base)[0]

    def data(self, i: int) -> bytes | memoryview:
        """Record ``i``'s data."""
        at = self.offsets[i] - self.base
        return self.block[at + 12:at + 12 + self.length(i)]

    def framed(self, start: int, stop: int) -> bytes | memoryview:
        """Records ``start``..``stop-1`` as framed in the stream."""
        if start >= stop:
            return b""
        begin, end = self.span(start, stop)
        return self.block[begin - self.base:end - self.base]

    def span(self, start: int, stop: int) -> tuple[int, int]:
        """Where records ``start``..``stop-1`` (``start < stop``) lie in the stream: [begin, end).
        Also for a run that holds a large record's header only (``Walk.runs``)."""
        end = self.offsets[stop] if stop < len(self.offsets) else self.next
        return self.offsets[start], end


def checked_run(block: bytes | memoryview, base: int, size: int, kind: str) -> Checked | None:
    """The sound records wholly in ``block`` (the plain stream's bytes from ``base``; the stream
    is ``size`` bytes), taken as ``sound_run`` takes them, with each data checksum checked and,
    for Examples, each record's parse where C can vouch for it. None without C."""
    if _C is None:
        return None
    packed, nxt, failed, unsure, data_bytes = _C.run(block, base, size, True, _PARSE_KIND.get(kind, 0))
    offsets = array("Q")
    offsets.frombytes(packed)
    return Checked(offsets, nxt, failed, parse_unsure(kind, len(offsets), failed, unsure), data_bytes, block, base)


def parse_unsure(kind: str, records: int, failed: list[int], unsure: list[int]) -> list[int]:
    """The records of a run whose parse as ``kind`` is left to protobuf: those C left (Examples),
    none (raw records always parse), or every one whose checksum held (a kind C does not read)."""
    if kind in _PARSE_KIND:
        return unsure
    if kind == "raw":
        return []
    bad = set(failed)
    return [i for i in range(records) if i not in bad]


Gives = tuple[tuple[tuple[str, tuple], ...], tuple]   # shardschema.Scanner's per-record key


@dataclass
class Tallied:
    """What ``tally`` counted in one block: records by the rows they give, and the numbers (in
    the block's run) of records whose checksum failed and of those left to the Python scanner."""

    gives: dict[Gives, int]
    failed: list[int]
    unsure: list[int]


_SIGNATURES: dict[bytes, Gives] = {}


def tally(block: bytes | memoryview, start: int, offsets: Any, check: bool, skipped: Sized | None) -> Tallied | None:
    """The Examples whose header offsets are ``offsets`` (an array or a view of one; the last is
    the end of the last record) in ``block`` (the stream from ``start``), counted by the rows
    ``shardschema.Scanner`` gives them; ``check``: data checksums checked; ``skipped``: record
    numbers (from 0) not counted. None without C."""
    if _C is None:
        return None
    counts, failed, unsure = _C.tally(block, start, offsets, check, skipped if skipped else None)
    gives: dict[Gives, int] = {}
    for sig, n in counts.items():
        got = _SIGNATURES.get(sig)
        if got is None:
            if len(_SIGNATURES) >= 1 << 14:
                _SIGNATURES.clear()
            got = _SIGNATURES[sig] = (tuple(_rows(sig)), ())
        gives[got] = gives.get(got, 0) + n
    return Tallied(gives, failed, unsure)


def _rows(sig: bytes) -> Iterable[tuple[str, tuple]]:
    """A signature read back: (key, row) per feature, the row as ``shardschema.Row``."""
    pos = 0
    while pos < len(sig):
        (klen,) = struct.unpack_from("=I", sig, pos)
        key = sig[pos + 4:pos + 4 + klen].decode("utf-8")
        pos += 4 + klen
        kind, count, suffix, newline, raw = _FEATURE.unpack_from(sig, pos)
        pos += _FEATURE.size
        yield key, (KINDS[kind], count, SUFFIXES[suffix], bool(newline), bool(raw))


def offsets_as(data: Any, width: int, to: int, delta: int = 0) -> bytes | None:
    """Packed offsets of ``width`` bytes each as offsets of ``to`` bytes (4 or 8, native order),
    each plus ``delta``; None without C."""
    return None if _C is None else _C.offsets_as(data, width, to, delta)


def crc32c(data: bytes, value: int = 0) -> int | None:
    """CRC-32C of ``data`` by the compiled part (the tests check it), or None without it."""
    return None if _C is None else _C.crc32c(data, value)
