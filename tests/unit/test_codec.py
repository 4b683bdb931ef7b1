"""Unit and property tests of tfrfs.format.codec (SPEC 3.2, 3.3, 4, 7)."""

from __future__ import annotations

import io
import json
import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from tfrfs.format import codec
from tfrfs import errors
from tfrfs.format import jsontext
from tfrfs.format import proto
from tfrfs.format.codec import DirView, FileView, Shape, Value

JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 20
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 20
F32_MAX = struct.unpack("<f", struct.pack("<I", 0x7F7FFFFF))[0]
F32_TINY = struct.unpack("<f", struct.pack("<I", 1))[0]  # smallest subnormal


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def same_value(a: Value, b: Value) -> bool:
    """Equality, with floats compared bit for bit and any NaN equal to any NaN."""
    if a.kind != b.kind or len(a.values) != len(b.values):
        return False
    if a.kind != "float_list":
        return a.values == b.values
    return all((math.isnan(x) and math.isnan(y)) or bits(x) == bits(y) for x, y in zip(a.values, b.values))


def roundtrip(value: Value, kind: str | None) -> Value:
    view = codec.render(value)
    if isinstance(view, DirView):
        assert view.suffix == ".list"
        return codec.parse_list([(v.suffix, v.data) for _, v in view.items])
    return codec.parse(view.suffix, view.data, kind)


def png_of(mode: str, size: tuple[int, int], data: bytes, **info) -> bytes:
    image = Image.frombytes(mode, size, data)
    buf = io.BytesIO()
    image.save(buf, format="PNG", **info)
    return buf.getvalue()


# --- SPEC 3.2 rows -----------------------------------------------------------------------------


@pytest.mark.parametrize("value, suffix, data", [
    (Value("int64_list", (3,)), ".json", b"[3]\n"),
    (Value("int64_list", ()), ".json", b"[]\n"),
    (Value("int64_list", (-(2 ** 63), 2 ** 63 - 1)), ".json", b"[-9223372036854775808, 9223372036854775807]\n"),
    (Value("float_list", (1.0, f32(0.1), f32(1e-30), F32_MAX)), ".json", b"[1.0, 0.1, 1e-30, 3.4028235e+38]\n"),
    (Value("float_list", ()), ".json", b"[]\n"),
    (Value("float_list", (math.nan, math.inf, -math.inf, -0.0)), ".json", b"[NaN, Infinity, -Infinity, -0.0]\n"),
    (Value("bytes_list", (JPEG,)), ".jpg", JPEG),
    (Value("bytes_list", ("Zoë".encode(),)), ".txt", "Zoë".encode()),
    (Value("bytes_list", (b"",)), ".txt", b""),
    (Value("bytes_list", (b"a\x00b",)), ".bin", b"a\x00b"),
    (Value("bytes_list", (b"\xff\xfe",)), ".bin", b"\xff\xfe"),
    (Value("bytes_list", ()), ".json", b"[]\n"),
    (Value("bytes_list", (b"cat", "Zoë".encode())), ".json", '["cat", "Zoë"]\n'.encode()),
    (Value("bytes_list", (b'q"\n\\',)), ".txt", b'q"\n\\'),
    (Value("bytes_list", (b'q"\n', b"\x7f")), ".json", b'["q\\"\\n", "\x7f"]\n'),
    (Value("none", ()), ".json", b"null\n"),
])
def test_render_rows(value: Value, suffix: str, data: bytes) -> None:
    view = codec.render(value)
    assert view == FileView(suffix, data)


def test_render_list_folder_when_not_all_text() -> None:
    values = tuple([b"t"] * 10 + [JPEG, b"\x00"])
    view = codec.render(Value("bytes_list", values))
    assert isinstance(view, DirView) and view.suffix == ".list"
    names = [name for name, _ in view.items]
    assert names == [f"{i:02d}" for i in range(12)]
    assert view.items[0][1] == FileView(".txt", b"t")
    assert view.items[10][1] == FileView(".jpg", JPEG)
    assert view.items[11][1] == FileView(".bin", b"\x00")
    assert codec.parse_list([(v.suffix, v.data) for _, v in view.items]) == Value("bytes_list", values)


def test_list_folder_names_width_of_largest_index() -> None:
    view = codec.render(Value("bytes_list", (b"\x00", b"\x01")))
    assert [n for n, _ in view.items] == ["0", "1"]  # type: ignore[union-attr]


@pytest.mark.parametrize("data, suffix", [
    (b"\xff\xd8\xff", ".jpg"),
    (b"\x89PNG\r\n\x1a\n", ".png"),
    (b"GIF87a...", ".gif"),
    (b"GIF89a...", ".gif"),
    (b"BM" + struct.pack("<I", 10) + b"\x00" * 4, ".bmp"),
    (b"RIFF\x00\x00\x00\x00WEBPVP8 ", ".webp"),
    (b"II*\x00rest", ".tif"),
    (b"MM\x00*rest", ".tif"),
    (b"RIFF\x10\x00\x00\x00WAVEfmt ", ".wav"),
    (b"fLaC\x00", ".flac"),
    (b"ID3\x04", ".mp3"),
    (b"OggS\x00", ".ogg"),
    (b"BM" + struct.pack("<I", 11) + b"\x00" * 4, None),  # BMP length field must equal the size
    (b"BM", None),
    (b"RIFF\x00\x00\x00\x00AVI ", None),
    (b"GIF88a", None),
    (b"\xff\xd8", None),
    (b"", None),
])
def test_sniff_media(data: bytes, suffix: str | None) -> None:
    assert codec.sniff_media(data) == suffix
    if suffix is not None:  # media bytes are shown unchanged, whatever else they look like
        assert codec.render(Value("bytes_list", (data,))) == FileView(suffix, data)


def test_media_beats_text() -> None:
    assert codec.render(Value("bytes_list", (b"GIF89a",))).suffix == ".gif"


def test_is_text() -> None:
    assert codec.is_text(b"") and codec.is_text("Zoë\n".encode())
    assert not codec.is_text(b"a\x00") and not codec.is_text(b"\xc3") and not codec.is_text(b"\xed\xa0\x80")


# --- floats and JSON ---------------------------------------------------------------------------


@pytest.mark.parametrize("x, text", [
    (0.0, "0.0"), (-0.0, "-0.0"), (1.0, "1.0"), (-2.5, "-2.5"), (f32(0.1), "0.1"),
    (f32(1e-30), "1e-30"), (F32_MAX, "3.4028235e+38"), (-F32_MAX, "-3.4028235e+38"),
    (F32_TINY, "1e-45"), (f32(1.17549435e-38), "1.1754944e-38"), (16777216.0, "16777216.0"),
    (f32(1e16), "1e+16"), (f32(123456792.0), "123456790.0"), (f32(0.3), "0.3"),
    (f32(1 / 3), "0.33333334"), (2.0 ** -126, "1.1754944e-38"), (2.0 ** 100, "1.2676506e+30"),
    (math.nan, "NaN"), (math.inf, "Infinity"), (-math.inf, "-Infinity"),
])
def test_format_float32(x: float, text: str) -> None:
    assert jsontext.format_float32(x) == text
    if not math.isnan(x):
        assert bits(f32(float(text.replace("Infinity", "inf")))) == bits(x)


@given(st.integers(0, 2 ** 32 - 1))
def test_format_float32_shortest_and_exact(b: int) -> None:
    x = struct.unpack("<f", struct.pack("<I", b))[0]
    text = jsontext.format_float32(x)
    if math.isnan(x):
        assert text == "NaN"
        return
    if math.isinf(x):
        assert text in ("Infinity", "-Infinity")
        return
    assert bits(f32(float(text))) == b  # reads back exactly, sign of zero included
    assert ("." in text or "e" in text) and repr(float(text)) == text


def test_format_float32_matches_numpy_shortest() -> None:
    np = pytest.importorskip("numpy")
    import random
    rnd = random.Random(7)
    patterns = [rnd.getrandbits(32) for _ in range(3000)]
    patterns += [e << 23 for e in range(1, 255)] + [(e << 23) - 1 for e in range(1, 255)]
    for b in patterns:
        x = struct.unpack("<f", struct.pack("<I", b))[0]
        if math.isfinite(x):
            ref = np.format_float_scientific(np.float32(x), unique=True)
            assert float(jsontext.format_float32(x)) == float(ref), b


def test_dumps_json_is_canonical() -> None:
    obj = {"kind": "float_list", "n": 3, "ok": True, "x": None, "v": [1.5, f32(0.1)], "s": "Zoë\n"}
    assert jsontext.dumps_json(obj) == (json.dumps(obj, ensure_ascii=False).replace("0.10000000149011612", "0.1")
                                     + "\n").encode()
    assert jsontext.dumps_json([]) == b"[]\n"
    assert jsontext.dumps_json([1, [2, 3], {}]) == b"[1, [2, 3], {}]\n"
    assert jsontext.dumps_json([math.nan, -math.inf]) == b"[NaN, -Infinity]\n"
    with pytest.raises(TypeError):
        jsontext.dumps_json(b"x")


# --- raw pixel arrays (SPEC 3.3) ---------------------------------------------------------------


def ints(*v: int) -> Value:
    return Value("int64_list", v)


def blob(n: int) -> Value:
    return Value("bytes_list", (bytes(range(256)) * (n // 256) + bytes(n % 256),))


@pytest.mark.parametrize("record, expected", [
    ({"image_raw": blob(12), "height": ints(2), "width": ints(2)}, {"image_raw": Shape(2, 2, 3)}),
    ({"image_raw": blob(4), "height": ints(2), "width": ints(2)}, {"image_raw": Shape(2, 2, 1)}),
    ({"image_raw": blob(16), "height": ints(2), "width": ints(2)}, {"image_raw": Shape(2, 2, 4)}),
    # prefix rule: the key up to its last '/'
    ({"image/encoded": blob(6), "image/height": ints(1), "image/width": ints(2)},
     {"image/encoded": Shape(1, 2, 3)}),
    ({"image/encoded": blob(6), "height": ints(1), "width": ints(2)}, {}),
    ({"a/b/raw": blob(6), "a/b/height": ints(1), "a/b/width": ints(2), "a/height": ints(6)},
     {"a/b/raw": Shape(1, 2, 3)}),
    # declared channels decide
    ({"raw": blob(12), "height": ints(2), "width": ints(2), "depth": ints(3)}, {"raw": Shape(2, 2, 3)}),
    ({"raw": blob(12), "height": ints(2), "width": ints(2), "channels": ints(1)}, {}),
    ({"raw": blob(12), "height": ints(3), "width": ints(4), "channels": ints(1)}, {"raw": Shape(3, 4, 1)}),
    ({"raw": blob(24), "height": ints(2), "width": ints(2), "channels": ints(6)}, {}),
    ({"raw": blob(8), "height": ints(2), "width": ints(2), "channels": ints(2)}, {}),
    # an empty image fits every channel count (and PNG has no empty image): not decoded
    ({"raw": blob(0), "height": ints(0), "width": ints(5)}, {}),
    ({"raw": blob(0), "height": ints(0), "width": ints(5), "channels": ints(3)}, {}),
    ({"raw": blob(10), "height": ints(2), "width": ints(2)}, {}),  # wrong size: stays .bin
    ({"raw": blob(12), "height": ints(2, 2), "width": ints(2)}, {}),  # height must be one value
    ({"raw": blob(12), "height": Value("float_list", (2.0,)), "width": ints(2)}, {}),
    ({"raw": blob(12), "height": ints(-2), "width": ints(-2)}, {}),
    ({"raw": Value("bytes_list", (b"x" * 12, b"y" * 12)), "height": ints(2), "width": ints(2)}, {}),
])
def test_raw_shapes(record: dict, expected: dict) -> None:
    assert codec.raw_shapes(record) == expected


def test_raw_shapes_depth_and_channels_both_present() -> None:
    # they disagree: only a fitting one counts
    record = {"raw": blob(12), "height": ints(1), "width": ints(4), "depth": ints(3),
              "channels": ints(1)}
    assert codec.raw_shapes(record) == {"raw": Shape(1, 4, 3)}  # 4*1 != 12: only depth fits
    record = {"raw": blob(12), "height": ints(2), "width": ints(2), "depth": ints(3), "channels": ints(3)}
    assert codec.raw_shapes(record) == {"raw": Shape(2, 2, 3)}  # the same shape twice is one shape


@pytest.mark.parametrize("channels, mode", [(1, "L"), (3, "RGB"), (4, "RGBA")])
def test_raw_png_round_trip(channels: int, mode: str) -> None:
    shape = Shape(3, 5, channels)
    pixels = bytes((i * 37) % 256 for i in range(3 * 5 * channels))
    view = codec.render(Value("bytes_list", (pixels,)), shape)
    assert isinstance(view, FileView) and view.suffix == ".png" and view.raw_shape == shape
    assert view.data == codec.render(Value("bytes_list", (pixels,)), shape).data  # deterministic
    with Image.open(io.BytesIO(view.data)) as image:
        assert image.mode == mode and image.size == (5, 3)
    assert codec.parse_raw_png(view.data) == (pixels, shape)


def test_render_raw_wrong_size_is_an_error() -> None:
    with pytest.raises(ValueError):
        codec.render(Value("bytes_list", (b"abc",)), Shape(2, 2, 1))
    with pytest.raises(ValueError):
        codec.render(Value("int64_list", (1,)), Shape(1, 1, 1))


def test_parse_raw_png_conversions() -> None:
    assert codec.parse_raw_png(png_of("1", (8, 1), b"\xaa")) == (b"\xff\x00" * 4, Shape(1, 8, 1))
    la = png_of("LA", (2, 1), b"\x10\x20\x30\x40")
    assert codec.parse_raw_png(la) == (b"\x10\x10\x10\x20\x30\x30\x30\x40", Shape(1, 2, 4))
    pal = Image.new("P", (2, 1))
    pal.putpalette([1, 2, 3, 4, 5, 6] + [0] * 762)
    pal.putdata([0, 1])
    buf = io.BytesIO()
    pal.save(buf, format="PNG")
    assert codec.parse_raw_png(buf.getvalue()) == (b"\x01\x02\x03\x04\x05\x06", Shape(1, 2, 3))
    buf = io.BytesIO()
    pal.save(buf, format="PNG", transparency=1)
    assert codec.parse_raw_png(buf.getvalue()) == (b"\x01\x02\x03\xff\x04\x05\x06\x00", Shape(1, 2, 4))


def test_parse_raw_png_refusals() -> None:
    with pytest.raises(errors.Invalid, match="PNG"):
        codec.parse_raw_png(JPEG)
    sixteen = png_of("I;16", (2, 2), b"\x00\x01" * 4)
    with pytest.raises(errors.Invalid, match="16-bit"):
        codec.parse_raw_png(sixteen)
    with pytest.raises(errors.Invalid, match="cannot decode"):
        codec.parse_raw_png(PNG)


# --- feature lists (SPEC 4) --------------------------------------------------------------------


def test_render_feature_list_forms() -> None:
    assert codec.render_feature_list([]) == FileView(".json", b"[]\n")
    assert codec.render_feature_list([ints(1, 2), ints()]) == FileView(".json", b"[[1, 2], []]\n")
    fl = [Value("float_list", (0.5,)), Value("float_list", (f32(0.1), 2.0))]
    assert codec.render_feature_list(fl) == FileView(".json", b"[[0.5], [0.1, 2.0]]\n")
    tl = [Value("bytes_list", (b"a", "é".encode())), Value("bytes_list", ())]
    assert codec.render_feature_list(tl) == FileView(".json", '[["a", "é"], []]\n'.encode())
    mixed = [ints(1)] * 10 + [Value("bytes_list", (JPEG,)), Value("bytes_list", (b"\x00", b"x")),
                              Value("none", ())]
    view = codec.render_feature_list(mixed)
    assert isinstance(view, DirView) and view.suffix == ".steps"
    assert [n for n, _ in view.items] == [f"{i:02d}" for i in range(13)]
    assert view.items[0][1] == FileView(".json", b"[1]\n")
    assert view.items[10][1] == FileView(".jpg", JPEG)
    assert isinstance(view.items[11][1], DirView) and view.items[11][1].suffix == ".list"
    assert view.items[12][1] == FileView(".json", b"null\n")


def test_parse_feature_list() -> None:
    assert codec.parse_feature_list(b"[[1, 2], []]\n", None) == (ints(1, 2), ints())
    assert codec.parse_feature_list(b"[[1, 2], []]\n", "float_list") == (
        Value("float_list", (1.0, 2.0)), Value("float_list", ()))
    assert codec.parse_feature_list(b'[["a"]]', None) == (Value("bytes_list", (b"a",)),)
    assert codec.parse_feature_list(b"[]", "int64_list") == ()
    with pytest.raises(errors.Invalid, match="step 1"):
        codec.parse_feature_list(b"[[1], 2]", None)
    with pytest.raises(errors.Invalid):
        codec.parse_feature_list(b"3", None)


# --- parse (SPEC 7) ----------------------------------------------------------------------------


@pytest.mark.parametrize("suffix, data, kind, expected", [
    (".json", b"[1, 2]", "float_list", Value("float_list", (1.0, 2.0))),
    (".json", b"[]", "float_list", Value("float_list", ())),
    (".json", b"[]", "int64_list", Value("int64_list", ())),
    (".json", b"[]\n", None, Value("bytes_list", ())),  # SPEC 7: [] for a new key is bytes_list
    (".json", b"7", "int64_list", ints(7)),  # a bare scalar is a one-value list
    (".json", b'"x"', "bytes_list", Value("bytes_list", (b"x",))),
    (".json", b"[1, 2]", None, ints(1, 2)),
    (".json", b"[1, 2.0]", None, Value("float_list", (1.0, 2.0))),
    (".json", b"[1e3]", None, Value("float_list", (1000.0,))),
    (".json", b"[NaN]", None, Value("float_list", (math.nan,))),
    (".json", b"[-Infinity, 3.4028235e+38, 1e-46]", "float_list",
     Value("float_list", (-math.inf, F32_MAX, 0.0))),
    (".json", '["cat", "Zoë"]'.encode(), None, Value("bytes_list", (b"cat", "Zoë".encode()))),
    (".json", b"null", None, Value("none", ())),
    (".json", b"null\n", "none", Value("none", ())),
    (".json", b"[3]", "none", ints(3)),  # a Feature with no kind can be filled in
    (".json", b"\xef\xbb\xbf[1]", None, ints(1)),  # a byte order mark is ignored
    (".json", b"[9223372036854775807, -9223372036854775808]", "int64_list",
     ints(2 ** 63 - 1, -(2 ** 63))),
    (".txt", b"hello", None, Value("bytes_list", (b"hello",))),
    (".txt", b"[1]", "bytes_list", Value("bytes_list", (b"[1]",))),
    (".jpg", JPEG, "bytes_list", Value("bytes_list", (JPEG,))),
    (".bin", b"", "none", Value("bytes_list", (b"",))),
])
def test_parse_ok(suffix: str, data: bytes, kind: str | None, expected: Value) -> None:
    assert same_value(codec.parse(suffix, data, kind), expected)


@pytest.mark.parametrize("suffix, data, kind, message", [
    (".json", b"[1, 2", "int64_list", "not valid JSON"),
    (".json", b"", "int64_list", "empty"),
    (".json", b"\xff", None, "UTF-8"),
    (".json", b"[9223372036854775808]", "int64_list", "int64 range"),
    (".json", b"[-9223372036854775809]", None, "int64 range"),
    (".json", b"[1.5]", "int64_list", "not an integer"),
    (".json", b"[3.5e38]", "float_list", "too large for float32"),
    (".json", b"[1, 1e39]", None, "position 1.*too large for float32"),
    (".json", b"[1e999]", "float_list", "too large for float32"),
    (".json", b"[" + b"9" * 50 + b"]", "float_list", "too large for float32"),
    (".json", b"[true]", "int64_list", "boolean"),
    (".json", b"false", None, "boolean"),
    (".json", b"[1, true]", "float_list", "boolean true at position 1"),
    (".json", b'["1"]', "int64_list", "not an integer"),
    (".json", b'["a"]', "float_list", "not a number"),
    (".json", b"[1]", "bytes_list", "not a string"),
    (".json", b'[1, "a"]', None, "mixes strings and numbers"),
    (".json", b"[null]", None, "null"),
    (".json", b"[[1]]", "int64_list", "array"),
    (".json", b'{"a": 1}', None, "object"),
    (".json", b"null", "int64_list", "null"),
    (".json", b'["\\ud800"]', "bytes_list", "surrogate"),
    (".txt", b"1.5", "float_list", "float_list.*json"),
    (".txt", b"3", "int64_list", "int64_list.*json"),
    (".exe", b"x", None, "suffix"),
])
def test_parse_errors(suffix: str, data: bytes, kind: str | None, message: str) -> None:
    with pytest.raises(errors.Invalid, match=message):
        codec.parse(suffix, data, kind)


def test_parse_list_rejects_unknown_suffix() -> None:
    with pytest.raises(errors.Invalid):
        codec.parse_list([(".exe", b"x")])
    assert codec.parse_list([]) == Value("bytes_list", ())


# --- proto <-> Value and the identity properties -----------------------------------------------

float32s = st.integers(0, 2 ** 32 - 1).map(lambda b: struct.unpack("<f", struct.pack("<I", b))[0])
byte_values = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=20).map(lambda s: s.encode("utf-8")),
    st.sampled_from([JPEG, PNG, b"GIF89a", b"OggS..", b"\x00", b"[1]", b"null", b"", b" "]),
)
values = st.one_of(
    st.builds(Value, st.just("int64_list"), st.lists(st.integers(-(2 ** 63), 2 ** 63 - 1), max_size=8).map(tuple)),
    st.builds(Value, st.just("float_list"), st.lists(float32s, max_size=8).map(tuple)),
    st.builds(Value, st.just("bytes_list"), st.lists(byte_values, max_size=6).map(tuple)),
    st.just(Value("none", ())),
)


@given(values)
def test_suffix_of_is_what_render_shows(value: Value) -> None:
    assert codec.suffix_of(value) == codec.render(value).suffix


@given(values)
@settings(max_examples=400)
def test_feature_file_feature_identity(value: Value) -> None:
    # The dataset's kind is kept ...
    assert same_value(roundtrip(value, value.kind), value)
    # ... and a key new to the dataset infers it, except the SPEC's "[] is bytes_list".
    inferred = roundtrip(value, None)
    if value.kind in ("int64_list", "float_list") and not value.values:
        assert inferred == Value("bytes_list", ())
    else:
        assert same_value(inferred, value)


@given(values)
def test_proto_round_trip(value: Value) -> None:
    feature = proto.Feature()
    codec.value_to_proto(value, feature)
    again = proto.Feature.FromString(feature.SerializeToString())
    assert same_value(codec.value_from_proto(again), value)


@given(st.lists(values, max_size=5))
def test_feature_list_identity(steps: list[Value]) -> None:
    view = codec.render_feature_list(steps)
    if isinstance(view, FileView):
        kind = steps[0].kind if steps else None
        back = codec.parse_feature_list(view.data, kind)
    else:
        back = tuple(roundtrip(step, step.kind) for step in steps)
    assert len(back) == len(steps) and all(same_value(a, b) for a, b in zip(back, steps))


def test_value_from_proto_kinds() -> None:
    f = proto.Feature()
    assert codec.value_from_proto(f) == Value("none", ())
    f.float_list.value.append(0.1)
    assert codec.value_from_proto(f) == Value("float_list", (f32(0.1),))
    codec.value_to_proto(Value("int64_list", ()), f)
    assert f.WhichOneof("kind") == "int64_list" and codec.value_from_proto(f) == ints()
    codec.value_to_proto(Value("none", ()), f)
    assert f.WhichOneof("kind") is None


def test_value_rejects_unknown_kind() -> None:
    with pytest.raises(ValueError):
        Value("string_list", ())


@pytest.mark.tf
def test_protos_read_by_tensorflow() -> None:
    tf = pytest.importorskip("tensorflow")
    cases = [
        Value("int64_list", (0, -1, 2 ** 63 - 1, -(2 ** 63))),
        Value("float_list", (f32(0.1), -0.0, F32_MAX, F32_TINY, math.inf, -math.inf)),
        Value("bytes_list", (b"", JPEG, "Zoë".encode())),
        Value("int64_list", ()),
        Value("none", ()),
    ]
    example = proto.Example()
    for i, value in enumerate(cases):
        codec.value_to_proto(value, example.features.feature[f"k{i}"])
    theirs = tf.train.Example.FromString(example.SerializeToString())
    for i, value in enumerate(cases):
        feature = theirs.features.feature[f"k{i}"]
        kind = feature.WhichOneof("kind")
        assert (kind or "none") == value.kind
        got = tuple(getattr(feature, kind).value) if kind else ()
        assert same_value(Value(value.kind, got), value)


@pytest.mark.parametrize("written, keep, stored", [
    (b"dog\n", False, b"dog"),           # echo dog > KEY.txt
    (b"\n", False, b""),                 # echo > KEY.txt
    (b"dog", False, b"dog"),             # printf dog > KEY.txt: always as written
    (b"dog\n\n", False, b"dog\n\n"),     # more than one newline: as written
    (b"dog\r\n", False, b"dog\r"),       # only the newline itself goes
    (b"dog\n", True, b"dog\n"),          # the value replaced (or the key) ends in one: kept
    (b"", False, b""),
])
def test_text_as_written(written: bytes, keep: bool, stored: bytes) -> None:
    assert codec.text_as_written(written, keep) == stored
