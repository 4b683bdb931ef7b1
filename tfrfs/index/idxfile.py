"""The index file: one shard's record offsets and what indexing learned, in one small file.

The same bytes are the local cache entry (``CACHE/index/KEY.idx``) and the index shipped beside a
shard (``NAME.tfrfs-idx``, SPEC 1.1/1.2): ``TFRFSIDX``, a little-endian u32 length, a JSON header,
then the offsets (every record's header offset plus the end of the last record) as u32 when the
stream is under 4 GiB, else u64: 4 bytes a record for almost every shard. The header holds the
shard's size, identity and compression, the record count and kind, the problems found and a
CRC-32C of the offsets, so a file that does not belong to the shard, or is damaged, is refused.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from array import array
from typing import Any, Union

import crc32c

from tfrfs.format import bulk

MAGIC = b"TFRFSIDX"
VERSION = 4   # 4: damaged shards' gaps ("gaps") and problems' resync and compressed offsets
SUFFIX = ".tfrfs-idx"
_U32_LIMIT = 1 << 32


# A shard's record offsets: an array as built, or a read-only view of a mapped index file.
Offsets = Union[array, memoryview]


class IndexFileError(ValueError):
    """Not an index file of this version, or damaged."""


def typecode(offsets: Offsets) -> str:
    """``"I"`` or ``"Q"``: how the offsets are stored (an array's typecode, a view's format)."""
    return offsets.typecode if isinstance(offsets, array) else offsets.format


_NUMPY: list[Any] = []


def _numpy() -> Any:
    """numpy, or None: offsets by the million are converted at C speed when it is installed (Ray
    and TensorFlow bring it), else a Python step per offset. Imported when first needed (it
    costs a tenth of a second, which a mount need not pay)."""
    if not _NUMPY:
        try:
            import numpy
            _NUMPY.append(numpy)
        except ImportError:   # pragma: no cover
            _NUMPY.append(None)
    return _NUMPY[0]


def as_u64(offsets: Offsets) -> bytes:
    """``offsets`` (u32 or u64) as packed little-endian u64."""
    if typecode(offsets) == "Q":
        return offsets.tobytes()
    fast = bulk.offsets_as(offsets, 4, 8)
    if fast is not None:
        return fast
    _np = _numpy() if len(offsets) > 4096 else None
    if _np is not None:
        return _np.asarray(offsets, dtype=_np.uint32).astype(_np.uint64).tobytes()
    return array("Q", offsets).tobytes()


def shifted(u64: bytes, delta: int) -> array:
    """Packed u64 offsets, each plus ``delta`` (which keeps them non-negative), as an array."""
    out = array("Q")
    fast = bulk.offsets_as(u64, 8, 8, delta)
    _np = _numpy() if fast is None and len(u64) > 32768 else None
    if fast is not None:
        out.frombytes(fast)
    elif _np is not None:
        got = _np.frombuffer(u64, dtype=_np.uint64)
        out.frombytes((got + _np.uint64(delta) if delta >= 0 else got - _np.uint64(-delta)).tobytes())
    else:
        out.frombytes(u64)
        out = array("Q", [o + delta for o in out])
    return out


def _narrow(offsets: Offsets) -> bytes:
    """u64 offsets (all under 4 GiB) as packed u32."""
    fast = bulk.offsets_as(offsets, 8, 4)
    if fast is not None:
        return fast
    _np = _numpy() if len(offsets) > 4096 else None
    if _np is not None:
        return _np.asarray(offsets, dtype=_np.uint64).astype(_np.uint32).tobytes()
    return array("I", offsets).tobytes()


def dump(meta: dict[str, Any], offsets: Offsets) -> bytes:
    """The file's bytes; ``meta`` gets ``version``, ``count``, ``width`` and ``crc`` added."""
    if array("I").itemsize != 4 or array("Q").itemsize != 8 or struct.pack("=I", 1) != struct.pack("<I", 1):
        raise RuntimeError("index files are written on little-endian hosts with 4- and 8-byte arrays only")
    wide = len(offsets) > 0 and offsets[-1] >= _U32_LIMIT
    code = "Q" if wide else "I"
    if typecode(offsets) == code:
        body = offsets.tobytes()
    else:
        body = _narrow(offsets) if code == "I" else as_u64(offsets)
    head = dict(meta, version=VERSION, count=max(0, len(offsets) - 1), width=8 if wide else 4,
                crc=crc32c.crc32c(body))
    blob = json.dumps(head, sort_keys=True).encode()
    # Spaces after the JSON (still the same JSON) put the offsets at a multiple of 8 bytes, so a
    # mapped file is read in place (``map_file``) rather than copied.
    blob += b" " * (-(len(MAGIC) + 4 + len(blob)) % 8)
    return MAGIC + struct.pack("<I", len(blob)) + blob + body


def header(data: bytes | memoryview) -> tuple[dict[str, Any], int]:
    """(header, where the offsets start) of an index file, from its first bytes (which must hold
    the whole header). Raises IndexFileError."""
    view = memoryview(data)
    if bytes(view[:len(MAGIC)]) != MAGIC or len(view) < len(MAGIC) + 4:
        raise IndexFileError("not a tfrfs index file")
    (hlen,) = struct.unpack_from("<I", view, len(MAGIC))
    start = len(MAGIC) + 4
    if len(view) < start + hlen:
        raise IndexFileError("the header is cut short")
    try:
        meta = json.loads(bytes(view[start:start + hlen]))
    except ValueError as exc:
        raise IndexFileError(f"damaged header: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("version") != VERSION:
        raise IndexFileError(f"index file version {meta.get('version') if isinstance(meta, dict) else '?'}, "
                             f"not {VERSION}")
    return meta, start + hlen


def _body(view: memoryview) -> tuple[dict[str, Any], memoryview, str]:
    meta, start = header(view)
    body = view[start:]
    width = meta.get("width")
    count = meta.get("count")
    if width not in (4, 8) or not isinstance(count, int) or len(body) != (count + 1) * width:
        raise IndexFileError("the offsets do not match the header")
    if crc32c.crc32c(body) != meta.get("crc"):
        raise IndexFileError("the offsets' checksum fails")
    return meta, body, "Q" if width == 8 else "I"


def load(data: bytes | memoryview) -> tuple[dict[str, Any], array]:
    """(header, offsets) of an index file: an array of u32 or u64, as written. Raises IndexFileError."""
    meta, body, code = _body(memoryview(data))
    # Kept as stored: u32 for almost every shard (half the memory, and no conversion at load).
    offsets = array(code)
    offsets.frombytes(body)
    return meta, offsets


def read_header(path: str, first: int = 1 << 16) -> dict[str, Any]:
    """The header of the index file at ``path``, reading only its first bytes. Raises
    IndexFileError, OSError."""
    with open(path, "rb") as f:
        head = f.read(first)
        if len(head) >= len(MAGIC) + 4 and head.startswith(MAGIC):
            (hlen,) = struct.unpack_from("<I", head, len(MAGIC))
            if len(MAGIC) + 4 + hlen > len(head):
                head += f.read(len(MAGIC) + 4 + hlen - len(head))
    return header(head)[0]


def map_file(path: str) -> tuple[dict[str, Any], Offsets]:
    """(header, offsets) of the index file at ``path``, its checksum checked, the offsets a
    read-only view of the mapped file: they take page cache, not the process's own memory, and
    go when the last view of them does. (A file whose offsets are not 8-byte aligned, written
    before they were, is copied.) Raises IndexFileError, OSError."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise IndexFileError("an empty file")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    meta, body, code = _body(memoryview(mapped))
    if (len(mapped) - len(body)) % 8 == 0:
        return meta, body.cast("Q") if code == "Q" else body.cast("I")
    offsets = array(code)
    offsets.frombytes(body)
    return meta, offsets
