"""TFRecord framing: masked CRC32C, record headers, GZIP and ZLIB streams.

A record is ``u64 length | u32 masked_crc(length) | data | u32 masked_crc(data)``,
little-endian. TensorFlow writes GZIP and ZLIB shards as one compressed stream
over the whole file, so a compressed shard is read by decompressing it into a
plain stream first; offsets always refer to that uncompressed stream.
"""

from __future__ import annotations

import functools
import mmap
import os
import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

import crc32c as _crc32c

from tfrfs.errors import DataLoss

HEADER = 12  # u64 length + u32 masked crc of the length
FOOTER = 4   # u32 masked crc of the data
OVERHEAD = HEADER + FOOTER

NONE, GZIP, ZLIB = "NONE", "GZIP", "ZLIB"
COMPRESSIONS = (NONE, GZIP, ZLIB)

_MASK_DELTA = 0xA282EAD8
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_HDR = struct.Struct("<QI")


def masked_crc(data: bytes | bytearray | memoryview) -> int:
    return _mask(_crc32c.crc32c(data))


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


_CRC_CHUNK = 1 << 20


PRead = Callable[[int, int], bytes]   # (size, offset) -> bytes, as os.pread without its descriptor


def _pread_of(src: int | PRead) -> PRead:
    return functools.partial(os.pread, src) if isinstance(src, int) else src


def masked_crc_at(src: int | PRead, offset: int, length: int) -> int:
    """``masked_crc`` of ``length`` bytes at ``offset`` of a file (a descriptor, or a ``pread``
    function: a shard reader's), read a piece at a time (a record of any size, never whole in
    memory)."""
    crc = 0
    pos, end = offset, offset + length
    if isinstance(src, int):
        buf = bytearray(min(_CRC_CHUNK, length) or 1)
        view = memoryview(buf)
        while pos < end:
            n = os.preadv(src, [view[:min(len(buf), end - pos)]], pos)
            if n == 0:
                raise DataLoss(f"file ends inside the {length} bytes at offset {offset}")
            crc = _crc32c.crc32c(view[:n], crc)
            pos += n
        return _mask(crc)
    while pos < end:
        piece = src(min(_CRC_CHUNK, end - pos), pos)
        if not piece:
            raise DataLoss(f"file ends inside the {length} bytes at offset {offset}")
        crc = _crc32c.crc32c(piece, crc)
        pos += len(piece)
    return _mask(crc)


def header(length: int) -> bytes:
    """A record's header: its length and that length's masked checksum."""
    raw = _U64.pack(length)
    return raw + _U32.pack(masked_crc(raw))


def footer(crc: int) -> bytes:
    """A record's footer, for the masked checksum of its data."""
    return _U32.pack(crc)


def parse_header(header: bytes) -> int | None:
    """The record length a 12-byte header declares, or None when its checksum fails."""
    length, crc = _HDR.unpack(header)
    if masked_crc(header[:8]) != crc:
        return None
    return length


def frame(data: bytes | memoryview) -> bytes:
    """One whole record: header, data and footer."""
    return b"".join((header(len(data)), bytes(data), footer(masked_crc(data))))


def check_data(framed_tail: bytes, data: memoryview | bytes) -> bool:
    """Whether the footer ``framed_tail`` (4 bytes) matches ``data``."""
    return len(framed_tail) == FOOTER and _U32.unpack(framed_tail)[0] == masked_crc(data)


@dataclass(frozen=True)
class Problem:
    """Something wrong in a shard's framing, found while scanning it."""

    offset: int                          # in the (inflated) stream
    reason: str
    index: int | None = None             # the record's, or the next record's at a gap
    resync_offset: int | None = None     # a gap: where sound records resume
    skipped: int | None = None           # a gap or the end of a walk: bytes not served
    compressed_offset: int | None = None   # a damaged GZIP/ZLIB stream: where, in the file

    def fields(self) -> dict:
        """What ``.tfrfs/errors``, the index file and ``verify --json`` say of it (SPEC 6)."""
        out: dict = {"offset": self.offset, "reason": self.reason, "index": self.index}
        for name in ("resync_offset", "skipped", "compressed_offset"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    @classmethod
    def from_fields(cls, d: dict) -> "Problem":
        return cls(d["offset"], d["reason"], d["index"], d.get("resync_offset"), d.get("skipped"),
                   d.get("compressed_offset"))


_SPLIT_READ = 64 << 10


def read_record(src: int | PRead, offset: int, length: int, *, verify: bool = True) -> bytes:
    """The data of the record whose header is at ``offset`` (length already known), read from a
    descriptor or through a ``pread`` function (a shard reader's).

    Raises ``DataLoss`` when the record is cut short or its data checksum fails.
    """
    if length < _SPLIT_READ:
        # (a training loop reads a record this way each step: no partial made for one call)
        at = offset + HEADER
        buf = os.pread(src, length + FOOTER, at) if isinstance(src, int) else src(length + FOOTER, at)
        data, footer = buf[:length], buf[length:]
    else:
        pread = _pread_of(src)
        # A large record is read apart from its footer, so its bytes are not copied once more
        # to cut the footer off.
        data = pread(length, offset + HEADER)
        footer = pread(FOOTER, offset + HEADER + length)
    if len(data) < length or len(footer) < FOOTER:
        raise DataLoss(f"record at offset {offset} is cut short")
    if verify and _U32.unpack(footer)[0] != masked_crc(data):
        raise DataLoss(f"data checksum failed for the record at offset {offset}")
    return data


def check_record_at(src: int | PRead, offset: int, length: int) -> None:
    """``read_record``'s checks, the data read a piece at a time: for a record of any size (of a
    descriptor, or through a ``pread`` function)."""
    footer_bytes = _pread_of(src)(FOOTER, offset + HEADER + length)
    if len(footer_bytes) < FOOTER:
        raise DataLoss(f"record at offset {offset} is cut short")
    if _U32.unpack(footer_bytes)[0] != masked_crc_at(src, offset + HEADER, length):
        raise DataLoss(f"data checksum failed for the record at offset {offset}")


def read_record_into(fd: int, offset: int, length: int, buf: bytearray | mmap.mmap) -> memoryview:
    """``read_record`` into ``buf`` (at least ``length + FOOTER`` bytes long), which is reused:
    the data as a view of ``buf``, valid until ``buf`` is read into again."""
    view = memoryview(buf)[:length + FOOTER]
    if os.preadv(fd, [view], offset + HEADER) < length + FOOTER:
        raise DataLoss(f"record at offset {offset} is cut short")
    data = view[:length]
    if _U32.unpack_from(view, length)[0] != masked_crc(data):
        raise DataLoss(f"data checksum failed for the record at offset {offset}")
    return data


def header_problem(header: bytes, pos: int, size: int, index: int) -> tuple[int | None, Problem | None]:
    """Judge the header read at ``pos`` of a ``size``-byte stream: (data length, None) when the
    record is whole, else (None, the problem that ends the shard there)."""
    if len(header) < HEADER:
        return None, Problem(pos, f"file ends inside a record header ({size - pos} trailing bytes)", index)
    length, hcrc = _HDR.unpack(header)
    if masked_crc(header[:8]) != hcrc:
        return None, Problem(pos, "length checksum failed in record header", index)
    if pos + OVERHEAD + length > size:
        return None, Problem(pos, f"record is cut short: it needs {OVERHEAD + length} bytes, "
                                  f"the file has {size - pos} left", index)
    return length, None


# --- compression -----------------------------------------------------------

def _first_header_ok(head: bytes) -> bool:
    return len(head) >= HEADER and parse_header(head[:HEADER]) is not None


def _decompress_head(data: bytes, wbits: int) -> bytes | None:
    try:
        d = zlib.decompressobj(wbits)
        return d.decompress(data, HEADER)
    except zlib.error:
        return None


def inflates_to_a_record(head: bytes, compression: str) -> bool:
    """Whether the first bytes of a GZIP/ZLIB file inflate to a sound first record header."""
    wbits = 16 + zlib.MAX_WBITS if compression == GZIP else zlib.MAX_WBITS
    out = _decompress_head(head, wbits)
    return out is not None and _first_header_ok(out)


def sniff(head: bytes) -> str | None:
    """The compression under which ``head`` (the file's first bytes) starts a shard.

    The plain header is checked first: an uncompressed shard may begin with
    the gzip magic by chance. Returns None when it is not a shard at all
    (an empty file is judged by its name elsewhere).
    """
    if _first_header_ok(head):
        return NONE
    if head[:2] == b"\x1f\x8b":
        out = _decompress_head(head, 16 + zlib.MAX_WBITS)
        if out is not None and (_first_header_ok(out) or out == b""):
            return GZIP
    elif len(head) >= 2 and (head[0] & 0x0F) == 8 and (head[0] << 8 | head[1]) % 31 == 0:
        out = _decompress_head(head, zlib.MAX_WBITS)
        if out is not None and (_first_header_ok(out) or out == b""):
            return ZLIB
    return None


class StreamWriter:
    """Writes framed records to a binary file, compressing as the shard's kind asks."""

    def __init__(self, f: BinaryIO, compression: str = NONE, level: int = 6) -> None:
        self._f = f
        self.compression = compression
        self.raw_bytes = 0
        if compression == GZIP:
            self._z: zlib._Compress | None = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        elif compression == ZLIB:
            self._z = zlib.compressobj(level, zlib.DEFLATED, zlib.MAX_WBITS)
        else:
            self._z = None

    def write_framed(self, framed: bytes | memoryview) -> None:
        """Write already framed bytes (a record copied byte for byte)."""
        self.raw_bytes += len(framed)
        self._f.write(self._z.compress(framed) if self._z else framed)

    def write(self, data: bytes) -> None:
        self.write_framed(frame(data))

    def close(self) -> None:
        if self._z is not None:
            self._f.write(self._z.flush())
            self._z = None


def iter_records(path: str | os.PathLike[str]) -> Iterator[bytes]:
    """Every record of a shard in order, checksums verified (for tools and tests)."""
    with open(path, "rb") as f:
        head = f.read(64)
        f.seek(0)
        comp = sniff(head) if head else NONE
        if comp is None:
            raise DataLoss(f"{os.fspath(path)} is not a TFRecord file")
        if comp != NONE:
            import io
            from tfrfs.format.salvage import inflate
            buf = io.BytesIO()
            problem = inflate(f, buf, comp)
            if problem:
                raise DataLoss(problem.reason)
            data = buf.getvalue()
        else:
            data = f.read()
    pos = 0
    while pos < len(data):
        header = data[pos:pos + HEADER]
        if len(header) < HEADER or parse_header(header) is None:
            raise DataLoss(f"bad record header at offset {pos}")
        length = _U64.unpack(header[:8])[0]
        body = data[pos + HEADER: pos + HEADER + length]
        tail = data[pos + HEADER + length: pos + OVERHEAD + length]
        if len(body) < length or not check_data(tail, body):
            raise DataLoss(f"bad record data at offset {pos}")
        yield bytes(body)
        pos += OVERHEAD + length
