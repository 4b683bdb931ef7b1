"""How a feature value is shown (SPEC 3.2, 3.3, 4), decided without rendering it: the suffix of
its file (``.jpg``/``.png``/... by magic bytes, ``.txt`` for text, ``.bin``, ``.json`` for numbers
and lists of text, ``.list``/``.steps`` folders) and which values are raw pixel arrays.

The renderer (``codec``) and the schema scan (``index.shardschema``) both ask here, so what a
mount shows and what ``schema.json`` says it shows cannot drift apart. Values may be ``bytes`` or,
for the scan's large values, a ``memoryview`` of a shard's bytes: a large value is looked at a
chunk at a time, never copied whole.
"""

from __future__ import annotations

import codecs
import struct
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence, Union

Data = Union[bytes, memoryview]

JSON = ".json"              # how numbers, ``null`` and lists of text are shown
CHUNK = 8 << 20             # bytes of a large value looked at at once
CHANNELS = (1, 3, 4)
_U32 = struct.Struct("<I")


class Valued(Protocol):
    """A feature value as ``codec.Value`` holds it: its kind and its values."""

    @property
    def kind(self) -> str: ...

    @property
    def values(self) -> tuple: ...


# --------------------------------------------------------------------------------------------
# Media sniffing and text


@dataclass(frozen=True)
class _Magic:
    suffix: str
    parts: tuple[tuple[int, bytes], ...]  # (offset, bytes) that must all match
    length_at: int | None = None  # offset of a little-endian u32 that must equal the length


# SPEC 3.2's magic bytes table. The first two bytes of every entry are distinct from those of
# entries of other formats, so a lookup by them finds the candidates without scanning the table.
_MAGIC_TABLE = (
    _Magic(".jpg", ((0, b"\xff\xd8\xff"),)),
    _Magic(".png", ((0, b"\x89PNG\r\n\x1a\n"),)),
    _Magic(".gif", ((0, b"GIF87a"),)),
    _Magic(".gif", ((0, b"GIF89a"),)),
    _Magic(".bmp", ((0, b"BM"),), length_at=2),
    _Magic(".webp", ((0, b"RIFF"), (8, b"WEBP"))),
    _Magic(".tif", ((0, b"II*\x00"),)),
    _Magic(".tif", ((0, b"MM\x00*"),)),
    _Magic(".wav", ((0, b"RIFF"), (8, b"WAVE"))),
    _Magic(".flac", ((0, b"fLaC"),)),
    _Magic(".mp3", ((0, b"ID3"),)),
    _Magic(".ogg", ((0, b"OggS"),)),
)
_MAGIC_BY_HEAD: dict[bytes, tuple[_Magic, ...]] = {}
for _m in _MAGIC_TABLE:
    _head = _m.parts[0][1][:2]
    _MAGIC_BY_HEAD[_head] = _MAGIC_BY_HEAD.get(_head, ()) + (_m,)
del _m, _head


def _matches(magic: _Magic, data: Data) -> bool:
    for offset, want in magic.parts:
        if data[offset:offset + len(want)] != want:
            return False
    if magic.length_at is not None:
        at = magic.length_at
        return len(data) >= at + 4 and _U32.unpack_from(data, at)[0] == len(data)
    return True


def sniff_media(data: Data) -> str | None:
    """The suffix of the image or sound ``data`` is by its magic bytes (SPEC 3.2), or None."""
    for magic in _MAGIC_BY_HEAD.get(bytes(data[:2]), ()):
        if _matches(magic, data):
            return magic.suffix
    return None


def is_text(data: Data) -> bool:
    """Valid UTF-8 with no NUL byte."""
    if isinstance(data, memoryview):
        if len(data) > CHUNK:
            return _is_text_by_chunks(data)
        data = bytes(data)
    if b"\x00" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _is_text_by_chunks(view: memoryview) -> bool:
    """``is_text`` of a large value, a chunk at a time."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        for p in range(0, len(view), CHUNK):
            chunk = bytes(view[p:p + CHUNK])
            if b"\x00" in chunk:
                return False
            decoder.decode(chunk)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def texts(values: Sequence[bytes]) -> list[str] | None:
    """The values decoded as text, or None when any of them is not text (the renderer's test for a
    ``.json`` list of strings, which also gives it the strings to write)."""
    out = []
    for v in values:
        if b"\x00" in v:
            return None
        try:
            out.append(v.decode("utf-8"))
        except UnicodeDecodeError:
            return None
    return out


# --------------------------------------------------------------------------------------------
# Suffixes (SPEC 3.2, 4)


def single_suffix(data: Data) -> str:
    """Suffix of a one-value bytes feature that is not a raw pixel array (SPEC 3.2 rows 4-6)."""
    return sniff_media(data) or (".txt" if is_text(data) else ".bin")


def bytes_suffix(values: Sequence[Data]) -> str:
    """Suffix of a bytes feature that is not a raw pixel array: one value by what it holds, values
    that are all text (or none) one ``.json`` array, else a ``.list`` folder."""
    if len(values) == 1:
        return single_suffix(values[0])
    return JSON if all(is_text(v) for v in values) else ".list"


def suffix_of(value: Valued) -> str:
    """The suffix ``codec.render(value)`` gives (no raw pixels), without rendering."""
    if value.kind != "bytes_list":
        return JSON
    return bytes_suffix(value.values)


def steps_suffix(steps: Sequence[Valued]) -> str:
    """The suffix ``codec.render_feature_list(steps)`` gives (SPEC 4): one ``.json`` array when
    the steps are all int64, all float or all text (or none), else a ``.steps`` folder."""
    if not steps:
        return JSON
    kind = steps[0].kind
    if all(s.kind == kind for s in steps):
        if kind in ("int64_list", "float_list"):
            return JSON
        if kind == "bytes_list" and all(is_text(v) for s in steps for v in s.values):
            return JSON
    return ".steps"


# --------------------------------------------------------------------------------------------
# Raw pixel arrays (SPEC 3.3)


@dataclass(frozen=True)
class Shape:
    """The shape of a raw pixel array (SPEC 3.3): uint8 samples, row-major, channels last."""

    height: int
    width: int
    channels: int


def _one_int(value: Valued | None) -> int | None:
    if value is None or value.kind != "int64_list" or len(value.values) != 1:
        return None
    return value.values[0]


def raw_shapes(record_values: Mapping[str, Valued]) -> dict[str, Shape]:
    """The Shape of every one-value bytes feature of a record that is a raw pixel array.

    A ``PREFIXdepth`` or ``PREFIXchannels`` feature counts only when it is one int64 value; when
    neither does, every channel count in 1, 3, 4 is tried. A value is decoded only when exactly
    one shape fits its length; height and width must be positive (PNG has no empty image).
    """
    shapes: dict[str, Shape] = {}
    for key, value in record_values.items():
        if value.kind == "bytes_list" and len(value.values) == 1:
            shape = raw_shape(key, len(value.values[0]), record_values.get)
            if shape is not None:
                shapes[key] = shape
    return shapes


def raw_shape(key: str, size: int, get: Callable[[str], Valued | None]) -> Shape | None:
    """The Shape of one-value bytes feature ``key`` of ``size`` bytes if it is a raw pixel array
    (see ``raw_shapes``); ``get`` gives the record's other features."""
    prefix = key[:key.rfind("/") + 1]
    height = _one_int(get(prefix + "height"))
    width = _one_int(get(prefix + "width"))
    if height is None or width is None or height <= 0 or width <= 0:
        return None
    declared = {c for c in (_one_int(get(prefix + "depth")), _one_int(get(prefix + "channels")))
                if c is not None}
    fitting = {c for c in (declared or CHANNELS) if c in CHANNELS and height * width * c == size}
    return Shape(height, width, fitting.pop()) if len(fitting) == 1 else None
