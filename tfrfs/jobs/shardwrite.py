"""One new shard written by a job, streamed: its framed records (copied byte for byte, compressed
as asked), its index file (``NAME.tfrfs-idx``, SPEC 1.2) and its part of the schema, all found on
the way, so nothing is read again. Used by ``tfrfs reshard`` and ``tfrfs.ray.write``.
"""

from __future__ import annotations

import zlib
from array import array
from typing import Any, Iterable

import crc32c

from tfrfs.index import idxfile
from tfrfs.storage import durable
from tfrfs.index import shardschema
from tfrfs.format import tfrecord
from tfrfs.format.record_kinds import KIND_SAMPLE, choose_kind
from tfrfs.jobs.publish import Dest, file_crc

_FLUSH = 4 << 20   # framed bytes gathered before a write



class ShardWriter:
    """Writes shard ``name`` into ``dest``: ``record`` each record's length (and its data, for the
    tally) and ``emit`` the framed bytes, in order; ``finish`` makes it durable and writes its index
    file. ``kind``: the records' kind; ``tally``: whether they are tallied (SPEC 5)."""

    def __init__(self, dest: Dest, name: str, compression: str, kind: str, tally: bool = True) -> None:
        self.dest = dest
        self.name = name
        self.compression = compression
        self.kind = kind
        self.scanner = shardschema.Scanner(kind) if tally else None
        self.f, self.fd = dest.create(name)
        self.offsets = array("Q", [0])
        self.stream = 0           # bytes of the uncompressed stream so far
        self.size = 0             # bytes of the file so far
        self.crc = 0              # CRC-32C of the file's bytes so far
        self.data_bytes = 0       # the records' data, without framing
        self.bad: list[int] = []  # records that do not parse as ``kind``
        if compression == tfrecord.GZIP:
            self._z: Any = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        elif compression == tfrecord.ZLIB:
            self._z = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS)
        else:
            self._z = None

    @property
    def count(self) -> int:
        return len(self.offsets) - 1

    def record(self, length: int, data: bytes | memoryview | None) -> None:
        """A record of ``length`` bytes of data goes next (its framed bytes are emitted by the
        caller, before or after); ``data`` for its tally (None: not tallied)."""
        self.stream += length + tfrecord.OVERHEAD
        self.offsets.append(self.stream)
        self.data_bytes += length
        if self.scanner is not None:
            if data is None:
                self.scanner = None   # a record not seen: the shard's tally is not known
                return
            skipped = self.scanner.tally.skipped
            self.scanner.add_large(data)
            if self.scanner.tally.skipped != skipped:
                self.bad.append(self.count - 1)

    def take_block(self, block: bytes | memoryview, headers: array, end: int) -> None:
        """``record`` for each record of ``block``, the stream's next bytes, whose headers (in the
        new stream) are at ``headers`` and the last of which ends at ``end``: their offsets taken
        and their tally counted in bulk (``shardschema.tally_block``), not a Python step each."""
        base = self.stream
        first = self.count
        self.offsets.extend(headers[1:])
        self.offsets.append(end)
        self.stream = end
        self.data_bytes += end - base - tfrecord.OVERHEAD * len(headers)
        if self.scanner is not None:   # (the new offsets from this block's first: its headers and end)
            bounds = self.offsets[first:]
            self.bad += [first + k for k in shardschema.tally_block(self.scanner, block, base, bounds)]

    def emit(self, framed: bytes | bytearray | memoryview) -> None:
        """Framed bytes of the stream, in order (copied when they must outlive the caller's buffer)."""
        if not len(framed):
            return
        if self._z is not None:
            framed = self._z.compress(framed)
            if not framed:
                return
        self._write(framed)

    def emit_from(self, framed: memoryview, fd: int | None, offset: int) -> None:
        """``emit(framed)``, where ``framed`` was read from file ``fd`` at ``offset``: copied from
        there within the kernel when the shard is local and uncompressed, and the two files'
        file systems allow it (else written)."""
        n = len(framed)
        if fd is None or self.fd is None or self._z is not None or not n or \
                not durable.copy_range(fd, self.fd, offset, offset + n, None, lambda pos: OSError(
                    f"{self.name}: the copy stopped after {pos - offset} of {n} bytes")):
            self.emit(framed)
            return
        self.crc = crc32c.crc32c(framed, self.crc)
        self.size += n

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        self.crc = crc32c.crc32c(data, self.crc)
        self.size += len(data)
        self.f.write(data)

    def abort(self) -> None:
        try:
            self.f.close()
        except Exception:  # noqa: BLE001 - the job fails anyway; its file is written again
            pass

    def finish(self) -> dict:
        """Flush, fsync, close; write the index file. The figures the driver checks and publishes."""
        if self._z is not None:
            self._write(self._z.flush())
            self._z = None
        size, identity, mtime_ns = self.dest.finished(self.name, self.f, self.fd)
        if size != self.size:
            raise OSError(f"{self.name}: {self.size} bytes written, the file holds {size}")
        # Read back where that is cheap (a local file, from the page cache just written).
        if self.dest.local_path(self.name) is not None and \
                file_crc(self.dest.storage(), self.dest.path(self.name)) != self.crc:
            raise OSError(f"{self.name}: the file does not read back as written")
        tally = self.scanner.flush() if self.scanner is not None else None
        meta = {"shard": self.name, "size": size, "identity": identity, "compression": self.compression,
                "kind": self.kind, "stream_size": self.stream, "problems": [], "bad": self.bad, "gaps": [],
                **({"schema": tally.to_json()} if tally is not None else {})}
        index = idxfile.dump(meta, self.offsets)
        index_name = self.name + idxfile.SUFFIX
        isize, iident, imtime = self.dest.write_bytes(index_name, index, sync=False)
        return {"name": self.name, "count": self.count, "size": size, "identity": identity, "mtime_ns": mtime_ns,
                "crc32c": self.crc, "compression": self.compression, "kind": self.kind, "stream_size": self.stream,
                "data_bytes": self.data_bytes, "bad": self.bad,
                "tally": tally.to_json() if tally is not None else None,
                "index": {"file": index_name, "size": isize, "crc32c": crc32c.crc32c(index), "mtime_ns": imtime},
                "files": [[self.name, size, identity], [index_name, isize, iident]]}


def write_records(dest: Dest, name: str, compression: str, records: Iterable[bytes],
                  kind: str | None = None) -> dict | None:
    """Write ``records`` (serialized, in order) as shard ``name`` in DEST, with its index file:
    its figures (``ShardWriter.finish``). ``kind``: the records' kind (by default chosen from the
    first ones, as a shard's is); without it, no records write no shard (None)."""
    it = iter(records)
    first: list[bytes] = []
    for data in it:
        first.append(data)
        if len(first) >= KIND_SAMPLE:
            break
    if not first and kind is None:
        return None
    w = ShardWriter(dest, name, compression, kind or choose_kind(r for r in first if r))
    out = bytearray()
    try:
        def put(data: bytes) -> None:
            nonlocal out
            w.record(len(data), data)
            out += tfrecord.frame(data)
            if len(out) >= _FLUSH:
                w.emit(out)
                out = bytearray()
        for data in first:
            put(data)
        for data in it:
            put(data)
        w.emit(out)
        return w.finish()
    except BaseException:
        w.abort()
        raise
