"""A reference reader of TFRecord shards, damaged or not, written from the damaged-input contract
(SPEC 1 and 6): which files are shards, their compression, the inflated stream, the records and
the problems a mount, ``tfrfs verify`` and ``tfrfs repair`` must agree with.

It is independent of tfrfs on purpose: only ``struct``, ``zlib``, ``json`` and ``crc32c``. It is
meant to be obviously right rather than fast (the resync loop tries every byte offset, compressed
streams are inflated one input byte at a time), so it is for small shards only.

The tests that check what tfrfs *wrote* (a commit, ``repair``, ``reshard``, ``tfrfs.ray.write``,
their index files and manifest) read it back here too, never with tfrfs's own readers: a check
that calls the code it checks passes whatever that code does. For them: ``written_records`` (a
shard that must be sound), ``parse_example`` / ``parse_sequence_example`` (the protobuf wire
format of TensorFlow's ``example.proto`` and ``feature.proto``, decoded by hand) and
``read_index_file`` / ``read_manifest``.

Framing: a record at ``p`` is ``u64 len | u32 mcrc(len) | data | u32 mcrc(data)``, little-endian,
where ``mcrc`` is the masked CRC-32C.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from dataclasses import dataclass, field

import crc32c as _crc32c

HEADER = 12          # u64 length + u32 masked crc of the length
FRAME = 16           # header + u32 masked crc of the data

SHARD_EXTS = r"(?:tfrecords?|tfrec|records?)"
INDEX_SUFFIXES = (".tfrfs-idx", ".idx", ".tfindex", ".index")
GZIP_SUFFIXES = (".gz", ".gzip")
ZLIB_SUFFIXES = (".zlib",)

NONE, GZIP, ZLIB = "NONE", "GZIP", "ZLIB"


def masked_crc(data: bytes) -> int:
    c = _crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One record as TensorFlow writes it."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))


# --- names (SPEC 1) ------------------------------------------------------------------------------

def is_index_name(name: str) -> bool:
    return name.endswith(INDEX_SUFFIXES)


def strip_compression_suffix(name: str) -> str:
    for suffix in GZIP_SUFFIXES + ZLIB_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def named_like_shard(name: str) -> bool:
    """The name, less a final .gz/.gzip/.zlib, ends in a shard extension, or has one followed by
    ``-`` and digits, or ends in ``-DIGITS-of-DIGITS``. Index files never are."""
    if is_index_name(name):
        return False
    base = strip_compression_suffix(name)
    return bool(re.search(r"\." + SHARD_EXTS + r"$", base)
                or re.search(r"\." + SHARD_EXTS + r"-[0-9]+", base)
                or re.search(r"-[0-9]+-of-[0-9]+$", base))


# --- the framing walk of a plain stream ----------------------------------------------------------

@dataclass(frozen=True)
class Record:
    number: int          # 0, 1, 2, ... in file order, across gaps
    offset: int          # of its header, in the (inflated) stream
    data: bytes
    data_crc_ok: bool

    @property
    def framed_end(self) -> int:
        return self.offset + FRAME + len(self.data)


@dataclass(frozen=True)
class Problem:
    """``kind``: ``gap`` (resynced), ``cut`` (no resync: cut short or garbage to the end),
    ``trailing`` (fewer than 12 bytes left), ``data_crc``, ``stream`` (inflation failed or the
    compressed stream is cut short), ``stream_trailing`` (bytes after the end of the stream)."""

    kind: str
    offset: int
    index: int | None
    resync_offset: int | None = None
    skipped: int | None = None
    compressed_offset: int | None = None
    past_end: bool = False      # a ``cut`` whose header checks but whose length runs past the end

    def describe(self) -> str:
        extra = "".join(f", {k}={getattr(self, k)}" for k in ("resync_offset", "skipped", "compressed_offset")
                        if getattr(self, k) is not None)
        return f"{self.kind} at offset {self.offset}, index {self.index}{extra}"


def header_holds(stream: bytes, p: int) -> bool:
    if p < 0 or p + HEADER > len(stream):
        return False
    (crc,) = struct.unpack_from("<I", stream, p + 8)
    return masked_crc(stream[p:p + 8]) == crc


def length_at(stream: bytes, p: int) -> int:
    return struct.unpack_from("<Q", stream, p)[0]


def record_fits(stream: bytes, p: int) -> bool:
    """Header checksum holds and the whole record lies inside the stream."""
    return header_holds(stream, p) and p + FRAME + length_at(stream, p) <= len(stream)


def data_holds(stream: bytes, p: int) -> bool:
    n = length_at(stream, p)
    (crc,) = struct.unpack_from("<I", stream, p + HEADER + n)
    return masked_crc(stream[p + HEADER:p + HEADER + n]) == crc


def walk(stream: bytes) -> tuple[list[Record], list[Problem]]:
    """The contract's framing walk: records in order, then the framing problems in order, then one
    ``data_crc`` problem per record whose data checksum fails."""
    size = len(stream)
    pos = 0
    records: list[Record] = []
    problems: list[Problem] = []
    while pos < size:
        if size - pos < HEADER:
            problems.append(Problem("trailing", pos, len(records), skipped=size - pos))
            break
        if record_fits(stream, pos):
            n = length_at(stream, pos)
            records.append(Record(len(records), pos, stream[pos + HEADER:pos + HEADER + n], data_holds(stream, pos)))
            pos += FRAME + n
            continue
        resync = next((p for p in range(pos + 1, size - HEADER + 1)
                       if record_fits(stream, p) and data_holds(stream, p)), None)
        if resync is None:
            problems.append(Problem("cut", pos, len(records), skipped=size - pos,
                                    past_end=header_holds(stream, pos)))
            break
        problems.append(Problem("gap", pos, len(records), resync_offset=resync, skipped=resync - pos))
        pos = resync
    problems += [Problem("data_crc", r.offset, r.number) for r in records if not r.data_crc_ok]
    return records, problems


# --- compressed streams --------------------------------------------------------------------------

def inflate(data: bytes, compression: str) -> tuple[bytes, Problem | None]:
    """The longest prefix that inflates, fed one input byte at a time (everything zlib gives back
    before the byte that fails counts). GZIP members that follow one another are one stream.
    Returns the prefix and at most one problem: ``stream`` when inflation fails (at the byte that
    fails) or the input ends first (at the file size), ``stream_trailing`` when bytes follow the
    end of the stream that do not start a new GZIP member."""
    wbits = 31 if compression == GZIP else 15
    out = bytearray()
    pos, size = 0, len(data)
    while True:
        d = zlib.decompressobj(wbits)
        while not d.eof:
            if pos == size:
                return bytes(out), Problem("stream", len(out), None, compressed_offset=size)
            try:
                out += d.decompress(data[pos:pos + 1])
            except zlib.error:
                return bytes(out), Problem("stream", len(out), None, compressed_offset=pos)
            pos += 1
        if pos == size:
            return bytes(out), None
        if compression == GZIP and data[pos:pos + 2] == b"\x1f\x8b":
            continue                          # a new member: the stream goes on
        return bytes(out), Problem("stream_trailing", len(out), None, compressed_offset=pos)


def gzip_header_accepted(data: bytes) -> bool:
    """Starts with the gzip magic and zlib takes its fixed 10-byte header."""
    if data[:2] != b"\x1f\x8b":
        return False
    try:
        zlib.decompressobj(31).decompress(data[:10])
    except zlib.error:
        return False
    return True


def zlib_header_valid(data: bytes) -> bool:
    """RFC 1950: CM 8 (deflate), CINFO at most 7, and CMF*256 + FLG a multiple of 31."""
    if len(data) < 2:
        return False
    cmf, flg = data[0], data[1]
    return (cmf & 0x0F) == 8 and (cmf >> 4) <= 7 and ((cmf << 8) | flg) % 31 == 0


def damaged_compression(data: bytes, name: str) -> str:
    """As the name says (.gz/.gzip, .zlib); else GZIP (magic 1f 8b first) or ZLIB when the first
    4096 bytes start such a stream: inflating them gives at least one byte, or fails on none of
    them (the input ends first, or the stream ends); else NONE."""
    if name.endswith(GZIP_SUFFIXES):
        return GZIP
    if name.endswith(ZLIB_SUFFIXES):
        return ZLIB
    for comp in (GZIP, ZLIB):
        head = data[:4096]
        if comp == GZIP and head[:2] != b"\x1f\x8b":
            continue                          # GZIP by content starts with its magic
        out, problem = inflate(head, comp)
        rejected = problem is not None and problem.kind == "stream" and problem.compressed_offset != len(head)
        if out or not rejected:
            return comp
    return NONE


# --- a whole file --------------------------------------------------------------------------------

@dataclass
class FileView:
    name: str
    is_shard: bool
    compression: str | None = None
    stream: bytes = b""                           # the inflated stream (the file itself if NONE)
    records: list[Record] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    damaged_first_header: bool = False            # a shard because of its name, not its content

    @property
    def sound_records(self) -> list[Record]:
        return [r for r in self.records if r.data_crc_ok]

    @property
    def tf_count(self) -> int:
        """Records a TensorFlow-like reader gets: those before the first damage of any kind."""
        first_bad = min((p.offset for p in self.problems), default=None)
        n = 0
        for r in self.records:
            if first_bad is not None and r.offset >= first_bad:
                break
            n += 1
        return n


def shard_view(data: bytes, name: str, compression: str, *, damaged_first_header: bool = False) -> FileView:
    stream_problem: Problem | None = None
    if compression == NONE:
        stream = data
    else:
        stream, stream_problem = inflate(data, compression)
    records, problems = walk(stream)
    if stream_problem is not None:
        if stream_problem.kind == "stream":
            # A last record cut short by the end of what inflated is the stream's damage seen
            # again: not reported twice. A header whose checksum fails with no record after it is
            # (deflate may turn damage into wrong bytes until its end check: records stop there).
            problems = [p for p in problems if not (p.kind == "trailing" or (p.kind == "cut" and p.past_end))]
        problems.insert(0, stream_problem)
    return FileView(name, True, compression, stream, records, problems, damaged_first_header)


def first_header_sound(stream: bytes) -> bool:
    return header_holds(stream, 0)


def read_file(data: bytes, name: str, *, source: bool = False) -> FileView:
    """What a file is (SPEC 1 and the contract): ``source`` when it is named as SOURCE itself,
    rather than found in a folder."""
    named = named_like_shard(name)
    if is_index_name(name):
        return FileView(name, False)
    if not data:
        return FileView(name, named or source, NONE if (named or source) else None)
    if first_header_sound(data):
        return shard_view(data, name, NONE)
    for compression in (GZIP, ZLIB):
        prefix, _ = inflate(data, compression)
        if first_header_sound(prefix):
            return shard_view(data, name, compression)
    compression = damaged_compression(data, name)
    view = shard_view(data, name, compression, damaged_first_header=True)
    if named or (source and view.sound_records):
        return view
    return FileView(name, False)


def tf_like_count(data: bytes, name: str) -> int:
    """How many records a reader that stops at the first damage (as TensorFlow does) gets."""
    view = read_file(data, name, source=True)
    return view.tf_count if view.is_shard else 0


# --- what tfrfs wrote: sound shards, records as features, index files, the manifest ---------------

def compression_of(data: bytes, name: str) -> str:
    """A written shard's compression: as its name says (.gz/.gzip, .zlib), else GZIP by its magic,
    else ZLIB when it does not start with a sound record but with a zlib header, else NONE."""
    if name.endswith(GZIP_SUFFIXES):
        return GZIP
    if name.endswith(ZLIB_SUFFIXES):
        return ZLIB
    if data[:2] == b"\x1f\x8b":
        return GZIP
    if data and not header_holds(data, 0) and zlib_header_valid(data):
        return ZLIB
    return NONE


def inflate_whole(data: bytes, compression: str) -> bytes:
    """The whole stream of a compressed file that must be sound: every GZIP member (or the one
    ZLIB stream) ends, and nothing follows. Raises AssertionError otherwise."""
    wbits = 31 if compression == GZIP else 15
    out = bytearray()
    rest = data
    while True:
        d = zlib.decompressobj(wbits)
        try:
            out += d.decompress(rest)
        except zlib.error as exc:
            raise AssertionError(f"{compression} stream does not inflate: {exc}") from None
        if not d.eof:
            raise AssertionError(f"{compression} stream cut short")
        rest = d.unused_data
        if not rest:
            return bytes(out)
        if compression != GZIP or rest[:2] != b"\x1f\x8b":
            raise AssertionError(f"{len(rest)} bytes after the end of the {compression} stream")


def written_records(path, compression: str | None = None) -> list[bytes]:
    """The records of a shard tfrfs wrote, which must be whole: its stream inflates to the end and
    frames into records with every checksum holding, nothing left over. Raises AssertionError
    naming what is wrong."""
    with open(path, "rb") as f:
        data = f.read()
    name = str(path)
    comp = compression or compression_of(data, name)
    stream = data if comp == NONE else inflate_whole(data, comp)
    records, problems = walk(stream)
    if problems:
        raise AssertionError(f"{name} ({comp}): " + "; ".join(p.describe() for p in problems))
    return [r.data for r in records]


def record_offsets(path, compression: str | None = None) -> list[int]:
    """Every record's offset in a written shard's (inflated) stream, then the stream's end: what
    an index of it must hold."""
    with open(path, "rb") as f:
        data = f.read()
    comp = compression or compression_of(data, str(path))
    stream = data if comp == NONE else inflate_whole(data, comp)
    records, problems = walk(stream)
    assert not problems, f"{path}: " + "; ".join(p.describe() for p in problems)
    return [r.offset for r in records] + [len(stream)]


# The protobuf wire format (https://protobuf.dev/programming-guides/encoding/): a message is a run
# of fields, each a varint key (number << 3 | wire type) and a value: 0 a varint, 1 eight bytes,
# 2 a varint length and that many bytes, 5 four bytes. A singular message field seen twice is
# merged, which is what parsing the concatenation of its pieces does; a map entry's key seen twice
# keeps the last; a repeated scalar may be packed (one length-delimited run) or not.

def _varint(buf: bytes, p: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if p >= len(buf):
            raise ValueError("varint cut short")
        b = buf[p]
        p += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, p
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: bytes) -> list[tuple[int, int, object]]:
    """(number, wire type, value) of each field in order: an int for types 0, 1 and 5 (the raw
    little-endian bits), bytes for type 2."""
    out: list[tuple[int, int, object]] = []
    p = 0
    while p < len(buf):
        key, p = _varint(buf, p)
        number, wtype = key >> 3, key & 7
        if wtype == 0:
            value, p = _varint(buf, p)
        elif wtype == 1:
            if p + 8 > len(buf):
                raise ValueError("fixed64 cut short")
            (value,) = struct.unpack_from("<Q", buf, p)
            p += 8
        elif wtype == 5:
            if p + 4 > len(buf):
                raise ValueError("fixed32 cut short")
            (value,) = struct.unpack_from("<I", buf, p)
            p += 4
        elif wtype == 2:
            n, p = _varint(buf, p)
            if p + n > len(buf):
                raise ValueError("length-delimited field cut short")
            value = bytes(buf[p:p + n])
            p += n
        else:
            raise ValueError(f"wire type {wtype}")
        if number == 0:
            raise ValueError("field number 0")
        out.append((number, wtype, value))
    return out


def _message(buf: bytes, number: int) -> bytes:
    """The singular message field ``number``, its pieces merged (b"" when absent)."""
    return b"".join(v for n, t, v in _fields(buf) if n == number and t == 2)  # type: ignore[misc]


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _float32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


# A feature: (kind, values), kind "bytes_list", "float_list" or "int64_list", or (None, []) for a
# Feature with none of them set. Values are bytes, Python floats (float32 values exactly) or ints.
Feature = tuple


def parse_feature(buf: bytes) -> Feature:
    kind, values = None, []                   # oneof kind: the last one given wins
    for number, wtype, value in _fields(buf):
        if number not in (1, 2, 3) or wtype != 2:
            continue
        name = {1: "bytes_list", 2: "float_list", 3: "int64_list"}[number]
        if kind != name:
            kind, values = name, []
        for n, t, v in _fields(value):        # type: ignore[arg-type]
            if n != 1:
                continue
            if number == 1 and t == 2:
                values.append(v)
            elif number == 2 and t == 5:
                values.append(_float32(v))    # type: ignore[arg-type]
            elif number == 2 and t == 2:      # packed floats
                values += [_float32(x) for (x,) in struct.iter_unpack("<I", v)]  # type: ignore[arg-type]
            elif number == 3 and t == 0:
                values.append(_int64(v))      # type: ignore[arg-type]
            elif number == 3 and t == 2:      # packed varints
                q = 0
                while q < len(v):             # type: ignore[arg-type]
                    x, q = _varint(v, q)      # type: ignore[arg-type]
                    values.append(_int64(x))
            else:
                raise ValueError(f"{name} value of wire type {t}")
    return kind, values


def _map(buf: bytes, parse) -> dict:
    """A ``map<string, M>`` field (number 1 of ``buf``), its entries' values parsed by ``parse``."""
    out = {}
    for number, wtype, entry in _fields(buf):
        if number != 1 or wtype != 2:
            continue
        key = _message(entry, 1).decode()     # type: ignore[arg-type]
        out[key] = parse(_message(entry, 2))  # type: ignore[arg-type]
    return out


def parse_features(buf: bytes) -> dict[str, Feature]:
    return _map(buf, parse_feature)


def parse_example(data: bytes) -> dict[str, Feature]:
    """An ``Example``'s features: {key: (kind, values)}."""
    return parse_features(_message(data, 1))


def parse_sequence_example(data: bytes) -> tuple[dict[str, Feature], dict[str, list[Feature]]]:
    """A ``SequenceExample``: (context features, {key: [step features]})."""
    def feature_list(buf: bytes) -> list[Feature]:
        return [parse_feature(v) for n, t, v in _fields(buf) if n == 1 and t == 2]  # type: ignore[arg-type]
    return parse_features(_message(data, 1)), _map(_message(data, 2), feature_list)


def values(data: bytes, key: str) -> list:
    """The values of feature ``key`` of an ``Example`` (KeyError when it has none)."""
    return parse_example(data)[key][1]


INDEX_MAGIC = b"TFRFSIDX"


def read_index_file(data: bytes) -> tuple[dict, list[int]]:
    """(header, offsets) of a shipped index file (``NAME.tfrfs-idx``): the magic ``TFRFSIDX``, a
    little-endian u32 length, that many bytes of JSON (padded with spaces), then ``count + 1``
    offsets of ``width`` bytes each, little-endian, whose CRC-32C the header holds."""
    assert data[:8] == INDEX_MAGIC, "not a tfrfs index file"
    (hlen,) = struct.unpack_from("<I", data, 8)
    head = json.loads(data[12:12 + hlen])
    body = data[12 + hlen:]
    width, count = head["width"], head["count"]
    assert width in (4, 8) and len(body) == (count + 1) * width, (width, count, len(body))
    assert _crc32c.crc32c(body) == head["crc"], "the offsets' checksum fails"
    offsets = [int.from_bytes(body[i:i + width], "little") for i in range(0, len(body), width)]
    return head, offsets


MANIFEST = ".tfrfs-manifest"


def read_manifest(root) -> dict:
    """The JSON body of the manifest at a dataset's root (SPEC 1.2)."""
    with open(f"{root}/{MANIFEST}", "rb") as f:
        return json.loads(f.read())


def manifest_records(root) -> dict[str, list[bytes]]:
    """{path: records} of every shard the manifest at ``root`` names, in its order, each shard
    read as one that must be whole and checked against its entry: size, compression, record count
    and, where the entry names a shipped index, that file's size and CRC-32C and the offsets in it
    (every record's, then the stream's end), its header's count and shard size."""
    body = read_manifest(root)
    out: dict[str, list[bytes]] = {}
    for entry in body["shards"]:
        path = f"{root}/{entry['path']}"
        with open(path, "rb") as f:
            size = len(f.read())
        assert entry["size"] == size, (entry, size)
        assert entry["compression"] in (NONE, GZIP, ZLIB), entry
        records = written_records(path, entry["compression"])
        assert entry["count"] == len(records), (entry, len(records))
        if entry.get("index"):
            # "file" names the index beside the shard (a name in the shard's folder).
            with open(path.rsplit("/", 1)[0] + "/" + entry["index"]["file"], "rb") as f:
                data = f.read()
            assert entry["index"]["size"] == len(data) and entry["index"]["crc32c"] == _crc32c.crc32c(data), entry
            head, offsets = read_index_file(data)
            assert head["count"] == len(records) and head["size"] == size, (entry, head)
            assert offsets == record_offsets(path, entry["compression"]), entry["path"]
        out[entry["path"]] = records
    return out
