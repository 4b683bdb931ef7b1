"""Large values written through a writable mount, staged without copies in memory (SPEC 7).

Content written to a feature file collects in a temporary file (``handles.OpenFile``). To put a
large one into its record, the record is built with a small stand-in in the value's place
(``StandIn``: the content's first bytes, a random mark, its last bytes), so that every rule that
judges content by its name, its kind and its last bytes (the text rule) judges it as it would the
content itself. The record is serialized so, and cut at the stand-in (``StandIn.splice``): the
length fields around it are rewritten for the real value's length, and what is staged is the
bytes before, the value copied from the temporary file by the kernel, and the bytes after
(``Spliced``) — the very bytes ``SerializeToString(deterministic=True)`` would give with the value
in place, without the value ever being read into the daemon.

A record must stay within protobuf's message limit (``LIMIT``): TensorFlow cannot parse a larger
one. Content larger than that is refused before anything is read (``errors.TooLarge``).
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import secrets
from dataclasses import dataclass
from typing import BinaryIO, Iterator

from tfrfs.storage import durable
from tfrfs.format import wire

LIMIT = 2**31 - 1            # protobuf's limit on a serialized message (and on every field in it)
MIN_SIZE = 1 << 20           # content from this size on is staged through a stand-in
_HEAD = 16                   # the content's first bytes kept in the stand-in: every magic number of SPEC 3.2
_TAIL = 2                    # its last bytes kept: the text rule looks at the last two
_COPY_CHUNK = 8 << 20


@dataclass(frozen=True)
class StandIn:
    """What goes into the record in place of the content of a temporary file (``fd``, ``size``
    bytes from its start): ``head + mark + tail``. A rule may keep a shorter start of it (the text
    rule drops a final newline); the value staged is then as much shorter."""

    fd: int
    size: int
    head: bytes
    mark: bytes
    tail: bytes

    @property
    def data(self) -> bytes:
        return self.head + self.mark + self.tail

    def splice(self, serialized: bytes) -> "Spliced":
        """``serialized`` (a message holding the stand-in as one bytes value) with the content in
        its place, as head and tail bytes around the span of the file."""
        at = serialized.find(self.mark)
        if at < 0 or serialized.find(self.mark, at + 1) >= 0:
            raise ValueError("the stand-in is not found exactly once in the serialized record")
        start = at - len(self.head)
        fields = _enclosing(serialized, start)
        kept = fields[-1][2] if fields else -1
        if not len(self.head) + len(self.mark) <= kept <= len(self.data) or \
                serialized[start:start + kept] != self.data[:kept]:
            raise ValueError("the stand-in is not a whole value of the serialized record")
        length = self.size - (len(self.data) - kept)
        # Innermost first: each field grows by what its value grew, and by what the length fields
        # inside it grew (a longer varint).
        grow = length - kept
        lengths = []
        for length_at, body, old in reversed(fields):
            lengths.append(_varint(old + grow))
            grow += len(lengths[-1]) - (body - length_at)
        parts = []
        pos = 0
        for (length_at, body, _), new in zip(fields, reversed(lengths)):
            parts.append(serialized[pos:length_at])
            parts.append(new)
            pos = body
        parts.append(serialized[pos:start])
        return Spliced(b"".join(parts), self.fd, length, serialized[start + kept:])


def stand_in(fd: int, size: int) -> StandIn:
    """The stand-in for the first ``size`` bytes of file ``fd`` (at least ``_HEAD + _TAIL``)."""
    head = os.pread(fd, _HEAD, 0)
    tail = os.pread(fd, _TAIL, size - _TAIL)
    if len(head) != _HEAD or len(tail) != _TAIL:
        raise OSError(errno.EIO, "the written content changed size while it was staged")
    # A NUL byte: the stand-in is never text, so no rule takes it for a shorter text value.
    return StandIn(fd, size, head, b"\0" + secrets.token_bytes(15), tail)


@dataclass(frozen=True)
class Spliced:
    """Serialized bytes whose middle is the first ``length`` bytes of file ``fd``: staged by
    ``durable.write_file`` and hashed without being read into memory whole."""

    head: bytes
    fd: int
    length: int
    tail: bytes

    def __len__(self) -> int:
        return len(self.head) + self.length + len(self.tail)

    def prefixed(self, data: bytes) -> "Spliced":
        return Spliced(data + self.head, self.fd, self.length, self.tail)

    def write_to(self, f: BinaryIO, path: durable.PathLike) -> None:
        """Write the bytes to ``f`` (a file opened for writing, at its end): the value is copied
        from file to file in the kernel where it can be."""
        durable.write(f, self.head, path)
        if not self._copy_in_kernel(f, path):
            for chunk in self.chunks():
                durable.write(f, chunk, path)
        durable.write(f, self.tail, path)

    def _copy_in_kernel(self, f: BinaryIO, path: durable.PathLike) -> bool:
        """Copy the value to ``f`` by copy_file_range; False if this file system cannot."""
        try:
            out = f.fileno()
        except (AttributeError, io.UnsupportedOperation):
            return False
        f.flush()
        return durable.copy_range(self.fd, out, 0, self.length, path,
                                  lambda pos: OSError(errno.EIO, "the written content ended early while it was staged"),
                                  chunk=_COPY_CHUNK)

    def chunks(self) -> Iterator[memoryview]:
        """The value's bytes, a piece at a time, read into one reused buffer (each piece is valid
        until the next is read)."""
        buf = bytearray(min(_COPY_CHUNK, self.length) or 1)
        view = memoryview(buf)
        pos = 0
        while pos < self.length:
            n = os.preadv(self.fd, [view[:min(len(buf), self.length - pos)]], pos)
            if n == 0:
                raise OSError(errno.EIO, "the written content ended early while it was staged")
            yield view[:n]
            pos += n

    def blake2b(self, digest_size: int) -> bytes:
        """BLAKE2b of the bytes (as ``hashlib.blake2b(bytes(self), digest_size=...)``)."""
        h = hashlib.blake2b(self.head, digest_size=digest_size)
        for chunk in self.chunks():
            h.update(chunk)
        h.update(self.tail)
        return h.digest()


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _enclosing(buf: bytes, start: int) -> list[tuple[int, int, int]]:
    """The length-delimited fields of message ``buf`` that hold offset ``start``, outermost first,
    the last being the field whose value starts there: (where its length is, where its value
    starts, its length). Each holding field is walked as a message: every one around a value is
    one (a record, its features, a feature, a list). Empty if the wire does not lead there."""
    found: list[tuple[int, int, int]] = []
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = wire.varint(buf, pos, len(buf))
        wire_type = key & 7
        if wire_type == 0:
            _, pos = wire.varint(buf, pos, len(buf))
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == 2:
            length_at = pos
            length, body = wire.varint(buf, pos, len(buf))
            if body <= start < body + length:
                found.append((length_at, body, length))
                if body == start:
                    return found
                pos, end = body, body + length   # look inside it
                continue
            pos = body + length
        elif wire_type not in (3, 4):   # groups carry no length: their fields are walked as they come
            return []
    return []
