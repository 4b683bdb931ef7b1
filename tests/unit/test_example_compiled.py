"""An Example's feature files in C (tfrfs/format/_example.c) against the Python path (codec.render).

Where the extension was built, ``render`` shows an Example in the usual encoding through it, and
falls back to protobuf and ``codec`` for anything else; with ``TFRFS_PURE=1``, or where it was not
built, every record takes the Python path. Both must give the same folder, name for name and byte
for byte: on records made here in every form the encoding allows, on Hypothesis's records, and on
every record of ../shared/realdata. The extension's plain values (``tfrfs.open(...).example``)
are checked on the same records against protobuf's parse and ``codec.plain_values``. Skipped
where the extension was not built, unless TFRFS_REQUIRE_COMPILED is set (scripts/test sets it)."""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REALDATA
from support.compiled import compiled_or_skip
from tfrfs.errors import DataLoss
from tfrfs.format import codec, proto, tfrecord
from tfrfs.view import render as render_module
from tfrfs.view.nodes import DataFile, Dir
from tfrfs.view.render import Options, render

files = compiled_or_skip(codec.compiled_files(), "tfrfs.format._example")
values = codec.compiled_values()

RAW = Options("example", True, 7)
NO_RAW = Options("example", False, 7)


def _tree(node: object) -> object:
    """Everything a folder shows, in its order."""
    if isinstance(node, Dir):
        return ("dir", dict(node.xattrs), node.loc, node.mtime_ns, node.aliases,
                [(name, _tree(child)) for name, child in node.children.items()])
    assert isinstance(node, DataFile)
    return ("file", bytes(node.data), dict(node.xattrs), node.loc, node.mtime_ns, node.damaged)


def _python(data: bytes, options: Options, damaged: str | None = None) -> Any:
    saved = render_module._FILES
    render_module._FILES = None
    try:
        return render(data, options, damaged=damaged)
    finally:
        render_module._FILES = saved


def _exactly(plain: Any) -> Any:
    """Plain values compared type for type, a float by its bits (NaN equals NaN)."""
    if isinstance(plain, dict):
        return {key: _exactly(v) for key, v in plain.items()}
    if isinstance(plain, list):
        return [(type(v).__name__, struct.pack("<d", v) if isinstance(v, float) else v) for v in plain]
    return plain


def same_values(data: bytes) -> None:
    """Asserts the compiled plain values of ``data`` are protobuf's, or that it left them to it."""
    assert values is not None
    got = values(data)
    try:
        want = codec.plain_values(proto.Example.FromString(data))
    except Exception:   # (protobuf refuses it: the compiled path must have left it)
        assert got is None
        return
    if got is not None:
        assert _exactly(got) == _exactly(want)


def same(data: bytes, options: Options = RAW, damaged: str | None = None) -> bool:
    """Asserts both paths show ``data`` alike (files, and plain values); True when the compiled
    one showed it."""
    same_values(data)
    want = _python(data, options, damaged)
    got = render(data, options, damaged=damaged)
    assert _tree(got.root) == _tree(want.root)
    assert (got.cost, got.failure, got.damaged, got.shown, got.pin) == \
        (want.cost, want.failure, want.damaged, want.shown, want.pin)
    return files(data, options.decode_raw) is not None


def _example(features: dict[str, Any]) -> bytes:
    msg = proto.Example()
    for key, (kind, values) in features.items():
        f = msg.features.feature[key]
        if kind == "none":
            continue
        lst = getattr(f, kind)
        lst.SetInParent()
        lst.value.extend(values)
    return msg.SerializeToString(deterministic=True)


# --- the wire, by hand ------------------------------------------------------------------------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _ld(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + _varint(len(body)) + body


def _entry(key: bytes, feature: bytes) -> bytes:
    return _ld(0x0A, _ld(0x0A, key) + _ld(0x12, feature))


def _record(*entries: bytes) -> bytes:
    return _ld(0x0A, b"".join(entries))


def test_the_usual_record_is_shown_in_c() -> None:
    data = _example({"image/encoded": ("bytes_list", [b"\xff\xd8\xff\xe0" + b"x" * 50]),
                     "image/format": ("bytes_list", [b"jpeg"]),
                     "image/height": ("int64_list", [2]), "image/width": ("int64_list", [3]),
                     "image/object/bbox/xmin": ("float_list", [0.1, 0.5]),
                     "image/object/class/text": ("bytes_list", [b"cat", b"dog \"x\"\n"]),
                     "image/object/class/label": ("int64_list", [1, -(1 << 63), (1 << 63) - 1]),
                     "empty": ("bytes_list", []), "nothing": ("none", []), "bin": ("bytes_list", [b"\x00\x01"])})
    assert same(data)
    got = {key: (kind, suffix, body) for key, kind, suffix, body in files(data, True)}
    assert got["image/encoded"][1] == ".jpg"
    assert got["image/format"] == ("bytes_list", ".txt", b"jpeg")
    assert got["image/object/bbox/xmin"] == ("float_list", ".json", b"[0.1, 0.5]\n")
    assert got["image/object/class/text"] == ("bytes_list", ".json", b'["cat", "dog \\"x\\"\\n"]\n')
    assert got["image/object/class/label"][2] == b"[1, -9223372036854775808, 9223372036854775807]\n"
    assert got["empty"] == ("bytes_list", ".json", b"[]\n")
    assert got["nothing"] == ("none", ".json", b"null\n")
    assert got["bin"][1] == ".bin"


def test_lists_not_packed_and_packed_in_pieces_read_as_protobuf_reads_them() -> None:
    floats = _ld(0x12, b"\x0d" + struct.pack("<f", 1.5) + _ld(0x0A, struct.pack("<2f", 0.25, -2.0))
                 + b"\x0d" + struct.pack("<f", math.inf))
    ints = _ld(0x1A, b"\x08" + _varint(-5) + _ld(0x0A, _varint(7) + _varint(1 << 40)) + b"\x08\x80\x00")
    data = _record(_entry(b"f", floats), _entry(b"i", ints), _entry(b"e", b""))
    assert same(data)
    got = {key: body for key, _, _, body in files(data, True)}
    assert got == {"f": b"[1.5, 0.25, -2.0, Infinity]\n", "i": b"[-5, 7, 1099511627776, 0]\n", "e": b"null\n"}
    assert values is not None and values(data) == {"f": [1.5, 0.25, -2.0, math.inf], "i": [-5, 7, 1 << 40, 0],
                                                   "e": None}


@pytest.mark.parametrize("data", [
    _record(_entry(b"a", _ld(0x1A, _ld(0x0A, b"\x01"))), _entry(b"a", _ld(0x1A, _ld(0x0A, b"\x02")))),  # a key twice
    _record(_entry(b"a", _ld(0x1A, b""))) + _record(),                        # features twice
    _record(_entry(b"a", _ld(0x1A, b""))) + b"\x10\x01",                      # a field after them
    _record(_ld(0x0A, _ld(0x12, _ld(0x1A, b"")) + _ld(0x0A, b"a"))),          # value before key
    _record(_ld(0x0A, _ld(0x0A, b"a"))),                                      # no value
    _record(_entry(b"\xff\xfe", _ld(0x1A, b""))),                             # a key not UTF-8
    _record(_entry(b"a", _ld(0x1A, b"") + _ld(0x12, b""))),                   # two lists
    _record(_entry(b"a", _ld(0x1A, b"") + b"\x20\x01")),                      # an unknown field
    _record(_entry(b"a", _ld(0x12, _ld(0x0A, b"\x00\x00\x80")))),             # floats not of 4 bytes
    _record(_entry(b"a", _ld(0x1A, _ld(0x0A, b"\xff" * 10 + b"\x01")))),      # a varint past 64 bits
    _record(_entry(b"a", _ld(0x1A, _ld(0x0A, b"\xff\xff")))),                 # a varint cut short
    _record(_entry(b"a", _ld(0x0A, _ld(0x0A, b"x") + _ld(0x0A, b"\x00")))),   # a .list folder
    _record(_entry(b"a", _ld(0x0A, b"\x12\x01x"))),                           # an unknown field in a list
    _record(_entry(b"a", _ld(0x1A, b""))) [:-1],                              # cut short
    b"\x0a\x05\x0a\x03",                                                      # lengths past the end
])
def test_anything_unusual_is_left_to_protobuf(data: bytes) -> None:
    assert files(data, True) is None
    assert values is not None
    if data != _record(_entry(b"a", _ld(0x0A, _ld(0x0A, b"x") + _ld(0x0A, b"\x00")))):   # (a .list: usual)
        assert values(data) is None
    same(data)


def test_a_raw_pixel_array_is_left_to_the_png_path_and_its_neighbours_are_not() -> None:
    pixels = bytes(range(2 * 3 * 3))
    raw = _example({"image/encoded": ("bytes_list", [pixels]), "image/height": ("int64_list", [2]),
                    "image/width": ("int64_list", [3])})
    assert files(raw, True) is None and not same(raw)
    assert same(raw, NO_RAW)
    declared = _example({"x/image": ("bytes_list", [pixels]), "x/height": ("int64_list", [2]),
                         "x/width": ("int64_list", [3]), "x/depth": ("int64_list", [4])})
    assert same(declared)   # its depth says 4: 18 bytes are not 2 x 3 x 4, so shown as it is
    ambiguous = _example({"p": ("bytes_list", [bytes(12)]), "height": ("int64_list", [1]),
                          "width": ("int64_list", [4])})
    assert not same(ambiguous)   # 1 x 4 x 3 and no other: raw


def test_damaged_records_keep_their_reason_on_every_file() -> None:
    data = _example({"a": ("int64_list", [1]), "b/c": ("bytes_list", [b"text"])})
    assert same(data, damaged="data checksum mismatch")


_KEYS = st.sampled_from(["image/encoded", "image/height", "image/width", "image/depth", "image/channels",
                         "height", "width", "label", "a/b/c", "a/b", "a", "é/ü", "x" * 300, "", "/", "a//b",
                         "image/object/bbox/xmin", "..", "text", "image/format"])
_MEDIA = st.sampled_from([b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF89a", b"BM\x06\x00\x00\x00", b"RIFF\0\0\0\0WEBP",
                          b"RIFF\0\0\0\0WAVE", b"II*\x00", b"MM\x00*", b"fLaC", b"ID3", b"OggS", b"BM"])
_BYTES = st.one_of(st.binary(max_size=40), st.text(max_size=20).map(lambda t: t.encode("utf-8", "surrogatepass")),
                   st.tuples(_MEDIA, st.binary(max_size=20)).map(lambda p: p[0] + p[1]),
                   st.sampled_from([b"\xed\xa0\x80", b"\xc0\x80", b"\xf4\x90\x80\x80", b"a\x00b", b"\x7f", b""]),
                   st.integers(0, 64).map(bytes))
_VALUES = st.one_of(
    st.tuples(st.just("int64_list"), st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=5)),
    st.tuples(st.just("int64_list"), st.lists(st.integers(-2, 12), min_size=1, max_size=1)),
    st.tuples(st.just("float_list"), st.lists(st.integers(0, (1 << 32) - 1).map(
        lambda b: struct.unpack("<f", struct.pack("<I", b))[0]), max_size=5)),
    st.tuples(st.just("float_list"), st.lists(st.floats(width=32), max_size=5)),
    st.tuples(st.just("bytes_list"), st.lists(_BYTES, max_size=4)),
    st.tuples(st.just("none"), st.just([])))


@settings(max_examples=600, deadline=None)
@given(st.dictionaries(_KEYS, _VALUES, max_size=8), st.booleans())
def test_the_same_folder_as_the_python_path(features: dict[str, Any], decode_raw: bool) -> None:
    same(_example(features), RAW if decode_raw else NO_RAW)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_KEYS, _VALUES, max_size=5), st.data())
def test_the_same_answer_or_none_on_damaged_bytes(features: dict[str, Any], data: st.DataObject) -> None:
    """Bytes flipped or cut anywhere: the compiled path shows them as protobuf reads them, or
    leaves them to it."""
    record = bytearray(_example(features))
    if record:
        at = data.draw(st.integers(0, len(record) - 1))
        if data.draw(st.booleans()):
            record[at] = data.draw(st.integers(0, 255))
        else:
            del record[at:]
    same(bytes(record))


def _realdata_records(limit: int = 400) -> Iterator[tuple[str, bytes]]:
    for path in sorted(p for p in REALDATA.rglob("*") if p.is_file() and p.stat().st_size > 16):
        try:
            with open(path, "rb") as f:
                if tfrecord.sniff(f.read(64)) is None:
                    continue
            for n, record in enumerate(tfrecord.iter_records(path)):
                if n >= limit:
                    break
                yield f"{path.relative_to(REALDATA)}#{n}", record
        except DataLoss:
            continue   # a damaged file: the records before the damage were taken


@pytest.mark.skipif(not REALDATA.is_dir(), reason=f"{REALDATA} is absent (real TFRecord files)")
def test_every_record_of_realdata_shows_the_same() -> None:
    shown_in_c = total = 0
    for where, record in _realdata_records():
        try:
            shown_in_c += same(record)
        except AssertionError as exc:
            raise AssertionError(f"{where}: {exc}") from None
        total += 1
    assert total > 1000 and shown_in_c > total // 2, (shown_in_c, total)
