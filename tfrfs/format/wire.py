"""Where each feature of an ``Example`` lies in the record's bytes, found without copying them.

A protobuf runtime copies a 2 MB image twice before anyone sees it: into the parsed
message, then out of it into a Python ``bytes``. A read-only mount instead shows such a
value as a span of the record it has already read and checked (see ``render.render_in_shard``).

Only the encoding that protobuf serializers write is followed: an ``Example`` whose one
field is ``features``, whose entries are each a key then a value, with no key twice.
Anything else gives ``None``, and the record is parsed by protobuf as before; so what a
record shows never depends on which way it was read. Each feature found here is still
parsed by protobuf from its own bytes, unless it is one bytes value that is shown as is.
"""

from __future__ import annotations

from typing import Iterator

Buffer = bytes | memoryview

_TAG_1 = 0x0A   # field 1, length-delimited: Example.features, Features.feature, entry key, BytesList.value
_TAG_2 = 0x12   # field 2, length-delimited: the entry's value (a Feature)


class _Unusual(Exception):
    """The bytes are not in the form this module follows (not necessarily invalid)."""


def _len_prefixed(data: Buffer, pos: int, end: int, tag: int) -> tuple[int, int]:
    """The span of the length-delimited field with one-byte ``tag`` at ``pos``."""
    if pos >= end or data[pos] != tag:
        raise _Unusual
    pos += 1
    length = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Unusual
        b = data[pos]
        pos += 1
        length |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    if pos + length > end:
        raise _Unusual
    return pos, pos + length


def feature_spans(data: Buffer) -> dict[str, tuple[int, int]] | None:
    """Each feature key of the ``Example`` encoded in ``data``, with the span of its ``Feature``
    message, in the order written; ``None`` when the encoding is not the usual one."""
    out: dict[str, tuple[int, int]] = {}
    end = len(data)
    if end == 0:
        return out
    try:
        pos, stop = _len_prefixed(data, 0, end, _TAG_1)
        if stop != end:
            return None   # a field after `features`: protobuf would merge or keep it
        while pos < stop:
            pos, entry_end = _len_prefixed(data, pos, stop, _TAG_1)
            key_start, key_end = _len_prefixed(data, pos, entry_end, _TAG_1)
            value_start, value_end = _len_prefixed(data, key_end, entry_end, _TAG_2)
            if value_end != entry_end:
                return None
            key = bytes(data[key_start:key_end]).decode("utf-8")
            if key in out:
                return None   # protobuf keeps the last; leave that to protobuf
            out[key] = (value_start, value_end)
            pos = entry_end
    except (_Unusual, UnicodeDecodeError):
        return None
    return out


def single_bytes_value(data: Buffer, start: int, end: int) -> tuple[int, int] | None:
    """The span of the value when ``data[start:end]`` is a ``Feature`` holding a bytes list of
    exactly one value, else ``None``."""
    try:
        list_start, list_end = _len_prefixed(data, start, end, _TAG_1)
        if list_end != end:
            return None
        value_start, value_end = _len_prefixed(data, list_start, list_end, _TAG_1)
    except _Unusual:
        return None
    return (value_start, value_end) if value_end == list_end else None


def varint(data: Buffer, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of the varint at ``pos``; ValueError when it runs past ``end``."""
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("a varint runs past its field")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def fields(data: Buffer, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(tag byte, start, end) of each length-delimited field of the message ``data[start:end]``;
    ValueError at a field of another wire type or one that runs past the message."""
    pos = start
    while pos < end:
        tag = data[pos]
        if tag & 0x07 != 2:
            raise ValueError("not a length-delimited field")
        length, pos = varint(data, pos + 1, end)
        if pos + length > end:
            raise ValueError("a field runs past its message")
        yield tag, pos, pos + length
        pos += length

