"""Write the TensorFlow interop fixtures with REAL TensorFlow.

Run as a subprocess (importing TensorFlow is slow and heavy)::

    .venv/bin/python tests/tf_fixtures.py OUTDIR

Every shard is written by ``tf.io.TFRecordWriter`` (``tf.io.TFRecordOptions`` for GZIP and
ZLIB) from ``tf.train.Example`` / ``SequenceExample`` / ``Feature`` messages built with
TensorFlow's own classes. Damaged shards are made by corrupting TF-written shards.

Layout made under OUTDIR :

``clean/``     a directory that verifies clean: every feature kind and value form of SPEC 3-4,
               hostile keys, images and sounds, raw pixel arrays, SequenceExamples, GZIP and
               ZLIB shards, an empty shard, a shard of empty records, raw shards, a plain shard
               that starts with the gzip magic, plain non-shard files, sub-directories.
``damaged/``   one shard per kind of damage of SPEC 6 and the damage contract (a bad data crc, a
               bad length crc, a length past the end, zeros and garbage with records after
               them, a cut, trailing bytes, a damaged first header, GZIP/ZLIB streams damaged
               mid-stream, cut short or with a bad trailer), a late unparseable record (SPEC 2),
               and a file not named like a shard whose first header fails.
``fixtures.json``  what was made: for each damaged file the damage, where it is and what
               salvage must find there.

Values are deterministic (seeded); the bytes of a shard may still vary between runs, since
protobuf does not fix the order of map entries when serializing.

Only the standard library, numpy, Pillow and TensorFlow are used here: nothing from tfrfs.
"""

from __future__ import annotations

import io
import json
import os
import struct
import sys
import wave
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from PIL import Image  # noqa: E402

RNG = np.random.default_rng(20240521)

INT64_MIN = -(2 ** 63)
INT64_MAX = 2 ** 63 - 1


# --- feature helpers (TensorFlow's own message classes) ---------------------------------------

def f_int(*v: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=list(v)))


def f_float(*v: float) -> tf.train.Feature:
    return tf.train.Feature(float_list=tf.train.FloatList(value=list(v)))


def f_bytes(*v: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(v)))


def f_none() -> tf.train.Feature:
    return tf.train.Feature()


def example(feats: dict) -> tf.train.Example:
    return tf.train.Example(features=tf.train.Features(feature=feats))


def seq_example(context: dict | None, lists: dict | None) -> tf.train.SequenceExample:
    se = tf.train.SequenceExample()
    if context is not None:
        for k, v in context.items():
            se.context.feature[k].CopyFrom(v)
    if lists is not None:
        se.feature_lists.SetInParent()
        for k, steps in lists.items():
            fl = se.feature_lists.feature_list[k]  # creates the (possibly empty) list
            for s in steps:
                fl.feature.add().CopyFrom(s)
    return se


def ser(m) -> bytes:
    return m.SerializeToString() if not isinstance(m, (bytes, bytearray)) else bytes(m)


def write_shard(path: str, records: list, compression: str = "") -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    opts = tf.io.TFRecordOptions(compression_type=compression) if compression else None
    with tf.io.TFRecordWriter(path, options=opts) as w:
        for r in records:
            w.write(ser(r))


def rand_bytes(n: int, *, with_nul: bool = True) -> bytes:
    b = bytearray(RNG.integers(0, 256, n, dtype=np.uint8).tobytes())
    if with_nul and n:
        b[min(3, n - 1)] = 0
        b[0] = 0x80  # never valid UTF-8 at the start, never a magic number
    return bytes(b)


# --- media made by real encoders -------------------------------------------------------------

def pil_bytes(mode: str, fmt: str, size=(8, 6), **kw) -> bytes:
    arr_modes = {"1": 1, "L": 1, "LA": 2, "P": 1, "RGB": 3, "RGBA": 4, "CMYK": 4}
    w, h = size
    if mode == "I;16":
        img = Image.frombytes("I;16", size, RNG.integers(0, 65536, w * h, dtype=np.uint16).tobytes())
    else:
        n = arr_modes[mode]
        img = Image.frombytes(mode if mode != "1" else "L", size,
                              RNG.integers(0, 256, w * h * n, dtype=np.uint8).tobytes())
        if mode == "1":
            img = img.convert("1")
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def wav_bytes() -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(RNG.integers(-3000, 3000, 400, dtype=np.int16).tobytes())
    return buf.getvalue()


def flac_bytes() -> bytes:
    # fLaC + a STREAMINFO metadata block header and body: enough for the magic table.
    return b"fLaC" + b"\x80\x00\x00\x22" + rand_bytes(34) + rand_bytes(64)


def mp3_bytes() -> bytes:
    return b"ID3\x04\x00\x00\x00\x00\x00\x0a" + rand_bytes(10) + b"\xff\xfb\x90\x00" + rand_bytes(200)


def ogg_bytes() -> bytes:
    return b"OggS\x00\x02" + b"\x00" * 8 + rand_bytes(100)


def tiff_be_bytes() -> bytes:
    return b"MM\x00*" + struct.pack(">I", 8) + rand_bytes(40)


# --- float32 edge values ---------------------------------------------------------------------

def f32_from_bits(bits: int) -> float:
    return float(np.frombuffer(struct.pack("<I", bits), dtype=np.float32)[0])


FLOAT_EDGES = [
    0.0, -0.0,
    f32_from_bits(0x00000001),      # smallest subnormal (1e-45)
    f32_from_bits(0x007FFFFF),      # largest subnormal
    f32_from_bits(0x00800000),      # smallest normal
    f32_from_bits(0x7F7FFFFF),      # float32 max
    -f32_from_bits(0x7F7FFFFF),
    float("inf"), float("-inf"), float("nan"),
    0.1, 1 / 3, 2.5, -1.5, 1.0, 100.0, 1e16, 1e-5, 0.0001, 123456789.0, 16777217.0, 1e-30,
    3.14159265358979,
]


# --- the clean directory ---------------------------------------------------------------------

def hostile_keys_record() -> tf.train.Example:
    long_ascii = "k" * 310
    feats = {
        "Zoë": f_int(1),
        "日本": f_bytes("日本語".encode()),
        "emoji 🎉": f_float(1.5),
        "": f_int(0),
        "/": f_int(1),
        "a//b": f_int(2),
        "a/./b": f_int(3),
        "..": f_int(4),
        ".": f_int(5),
        ".hidden": f_bytes(b"h"),
        "dir/.inner": f_int(6),
        "%": f_int(7),
        "%2F": f_int(8),
        "x/": f_int(9),
        "/y": f_int(10),
        "tab\tkey": f_int(11),
        "new\nline": f_int(12),
        "\x7f": f_int(13),
        long_ascii: f_int(14),
        long_ascii + "/inner": f_int(15),          # a folder whose name must be shortened
        "deep/" + "é" * 200: f_bytes(b"two-byte characters, cut at a boundary"),
        "nested/a/b/c": f_int(16),
        "nested/a/x": f_float(0.5),
        "nested/top": f_bytes(b"t"),
        "space key": f_int(17),
        'quote"key': f_int(18),
        "back\\slash": f_int(19),
        "colon:key;star*?": f_int(20),
        "backup~": f_int(21),
        "UPPER/lower": f_int(22),
        "ünï/cødé": f_bytes("ünïcødé".encode()),
    }
    return example(feats)


def clash_keys_record() -> tf.train.Example:
    base = "L" * 300
    feats = {
        "a": f_int(1),
        "a.json/x": f_int(2),          # folder a.json clashes with file a.json
        "d": f_bytes(b"hello"),
        "d.txt/y": f_int(3),           # folder d.txt clashes with file d.txt
        "e": f_bytes(b"\x00", b"\x01"),  # folder e.list
        "e.list/0": f_int(4),          # folder e.list again
        "b.txt": f_int(5),             # b.txt.json: no clash
        base + "1": f_int(6),          # two long keys sharing a 300-byte prefix
        base + "2": f_int(7),
    }
    return example(feats)


def kinds_records() -> list:
    r0 = example({
        "int_one": f_int(3),
        "int_many": f_int(0, -1, 1, INT64_MIN, INT64_MAX, 42),
        "int_empty": f_int(),
        "float_one": f_float(0.25),
        "float_empty": f_float(),
        "bytes_empty": f_bytes(),
        "nokind": f_none(),
        "label": f_bytes(b"cat"),
    })
    r1 = example({"edges": f_float(*FLOAT_EDGES), "edge_one_nan": f_float(float("nan")),
                  "neg_zero": f_float(-0.0), "max": f_float(f32_from_bits(0x7F7FFFFF))})
    r2 = example({})                   # an Example with no features at all
    r3 = tf.train.Example()            # features unset: serializes to 0 bytes
    r4 = example({"only_nokind": f_none(), "zero": f_int(0)})
    return [r0, r1, r2, r3, r4]


def text_records() -> list:
    jpeg = pil_bytes("RGB", "JPEG")
    r0 = example({
        "ascii": f_bytes(b"hello world"),
        "utf8": f_bytes("Zoë 日本 🎉".encode()),
        "multiline": f_bytes(b"line1\nline2\n"),
        "empty_text": f_bytes(b""),
        "with_nul": f_bytes(b"abc\x00def"),
        "latin1": f_bytes("café".encode("latin-1")),
        "surrogate": f_bytes(b"\xed\xa0\x80abc"),
        "overlong": f_bytes(b"\xc0\xafabc"),
        "texts": f_bytes(b"cat", "Zoë".encode(), b"", b'with "quote" and \\ and \n newline',
                         "\x7f".encode(), b"tab\t", "日本".encode()),
        "two_texts": f_bytes(b"a", b"b"),
        "no_values": f_bytes(),
        "bins": f_bytes(b"\x00\x01", b"\xff", jpeg),
        "bins10": f_bytes(*[rand_bytes(5 + i) for i in range(10)]),     # width of the largest index: 1
        "bins12": f_bytes(*([rand_bytes(3 + i) for i in range(11)] + [b"text at the end"])),
        "mp3text": f_bytes(b"ID3 looks like text"),                     # magic row comes before text
        "wavtext": f_bytes(b"RIFFabcdWAVE hello"),
        "magic_texts": f_bytes(b"ID3 a", b"OggS b"),                    # all text -> .json
        "bmp_wrong_size": f_bytes(b"BM" + struct.pack("<I", 999) + rand_bytes(20)),
        "riff_other": f_bytes(b"RIFF" + struct.pack("<I", 100) + b"AVI " + rand_bytes(20)),
        "gif_like": f_bytes(b"GIF88a" + rand_bytes(10)),
        "png_short": f_bytes(b"\x89PNG\r\n\x1a" + rand_bytes(3)),
        "jpeg_two_bytes": f_bytes(b"\xff\xd8"),
    })
    r1 = example({"ascii": f_bytes(b"second record"), "n": f_int(2)})
    return [r0, r1]


def media_records() -> list:
    bmp = pil_bytes("RGB", "BMP")
    assert struct.unpack_from("<I", bmp, 2)[0] == len(bmp)
    r0 = example({
        "jpeg_L": f_bytes(pil_bytes("L", "JPEG")),
        "jpeg_RGB": f_bytes(pil_bytes("RGB", "JPEG")),
        "jpeg_CMYK": f_bytes(pil_bytes("CMYK", "JPEG")),
        "png_1": f_bytes(pil_bytes("1", "PNG")),
        "png_L": f_bytes(pil_bytes("L", "PNG")),
        "png_LA": f_bytes(pil_bytes("LA", "PNG")),
        "png_P": f_bytes(pil_bytes("P", "PNG")),
        "png_RGB": f_bytes(pil_bytes("RGB", "PNG")),
        "png_RGBA": f_bytes(pil_bytes("RGBA", "PNG")),
        "png_I16": f_bytes(pil_bytes("I;16", "PNG")),
        "gif87": f_bytes(b"GIF87a" + rand_bytes(30)),
        "gif": f_bytes(pil_bytes("P", "GIF")),
        "bmp": f_bytes(bmp),
        "webp": f_bytes(pil_bytes("RGB", "WEBP")),
        "tiff": f_bytes(pil_bytes("RGB", "TIFF")),
        "tiff_be": f_bytes(tiff_be_bytes()),
        "wav": f_bytes(wav_bytes()),
        "flac": f_bytes(flac_bytes()),
        "mp3": f_bytes(mp3_bytes()),
        "ogg": f_bytes(ogg_bytes()),
    })
    # The Object Detection API layout: encoded image plus its size; not a raw pixel array.
    png = pil_bytes("RGB", "PNG")
    r1 = example({
        "image/encoded": f_bytes(png),
        "image/format": f_bytes(b"png"),
        "image/height": f_int(6),
        "image/width": f_int(8),
        "image/channels": f_int(3),
        "image/object/bbox/xmin": f_float(0.1, 0.5),
        "image/object/class/text": f_bytes(b"raccoon", b"dog"),
    })
    return [r0, r1]


def pixels(n: int, *, printable: bool = False, first: bytes = b"") -> bytes:
    if printable:
        b = RNG.integers(0x21, 0x7F, n, dtype=np.uint8).tobytes()
    else:
        b = bytearray(RNG.integers(0, 256, n, dtype=np.uint8).tobytes())
        b[0] = 0  # a NUL: never text
        b = bytes(b)
    return (first + b[len(first):])[:n]


def pixel_records() -> list:
    return [
        example({"image_raw": f_bytes(pixels(4 * 5)), "height": f_int(4), "width": f_int(5), "depth": f_int(1)}),
        example({"image_raw": f_bytes(pixels(3 * 4 * 3)), "height": f_int(3), "width": f_int(4), "depth": f_int(3)}),
        example({"image_raw": f_bytes(pixels(2 * 3 * 4)), "height": f_int(2), "width": f_int(3), "channels": f_int(4)}),
        # prefix case: image/encoded looks at image/height and image/width; no depth -> 3 fits
        example({"image/encoded": f_bytes(pixels(2 * 3 * 3)), "image/height": f_int(2), "image/width": f_int(3)}),
        # wrong size: stays .bin
        example({"image_raw": f_bytes(pixels(4 * 4 * 3 + 1)), "height": f_int(4), "width": f_int(4), "depth": f_int(3)}),
        # depth says 3 but the length fits 1 channel: not the declared shape, stays .bin
        example({"image_raw": f_bytes(pixels(4 * 4)), "height": f_int(4), "width": f_int(4), "depth": f_int(3)}),
        # height is not a one-value int64 feature
        example({"image_raw": f_bytes(pixels(2 * 2)), "height": f_int(2, 2), "width": f_int(2)}),
        # no depth, the length fits 4 channels only
        example({"image_raw": f_bytes(pixels(5 * 2 * 4)), "height": f_int(5), "width": f_int(2)}),
        # depth 2 (two bytes per pixel, like int16 captcha data): not 1, 3 or 4 -> .bin
        example({"image_raw": f_bytes(pixels(3 * 3 * 2)), "height": f_int(3), "width": f_int(3), "depth": f_int(2)}),
        # two prefixes in one record
        example({"seg/mask": f_bytes(pixels(2 * 2)), "seg/height": f_int(2), "seg/width": f_int(2),
                 "image_raw": f_bytes(pixels(3 * 2 * 3)), "height": f_int(3), "width": f_int(2)}),
        # height and width as floats: not int64 -> .bin
        example({"image_raw": f_bytes(pixels(2 * 2)), "height": f_float(2.0), "width": f_float(2.0)}),
        # raw pixels that start with the JPEG magic: the raw-pixel row comes first -> .png
        example({"image_raw": f_bytes(pixels(4 * 4 * 3, first=b"\xff\xd8\xff")), "height": f_int(4), "width": f_int(4)}),
        # raw pixels that are all printable ASCII: still pixels first
        example({"image_raw": f_bytes(pixels(3 * 3, printable=True)), "height": f_int(3), "width": f_int(3)}),
        # key without '/' uses the top-level height/width, not image/height
        example({"pix": f_bytes(pixels(2 * 2 * 3)), "height": f_int(2), "width": f_int(2),
                 "image/height": f_int(9), "image/width": f_int(9)}),
    ]


def seq_records() -> list:
    jpeg = pil_bytes("L", "JPEG")
    r0 = seq_example(
        {"id": f_bytes(b"clip0"), "len": f_int(3), "nokind": f_none()},
        {
            "ints": [f_int(1, 2), f_int(3), f_int()],
            "floats": [f_float(0.5), f_float(f32_from_bits(1), float("nan"), float("-inf")), f_float(0.1)],
            "texts": [f_bytes(b"a", b"b"), f_bytes("Zoë".encode()), f_bytes()],
            "int_empties": [f_int(), f_int()],
            "mixed": [f_int(1), f_float(2.0), f_bytes(b"x")],
            "bins": [f_bytes(jpeg), f_bytes(b"\x00"), f_bytes(b"\x00", b"\x01"), f_bytes(b"text"), f_bytes(b"t1", b"t2")],
            "zero": [],
            "nested/key": [f_int(7)],
            "nokind": [f_none(), f_none()],
            "long": [f_int(i) if i % 3 else f_bytes(rand_bytes(4)) for i in range(12)],
            "ten": [f_bytes(rand_bytes(3)) for _ in range(10)],
            ".dot": [f_float(1.0)],
        },
    )
    r1 = seq_example(None, {"ints": [f_int(5)]})               # empty context
    r2 = tf.train.SequenceExample()                            # nothing at all
    r3 = b""                                                   # an empty record
    r4 = seq_example({"image_raw": f_bytes(pixels(2 * 2 * 3)), "height": f_int(2), "width": f_int(2)},
                     {"frames": [f_bytes(jpeg), f_bytes(jpeg)]})
    r5 = seq_example({"only": f_int(1)}, {})                    # feature_lists present but empty
    return [r0, r1, r2, r3, r4, r5]


def big_jpeg(seed: int) -> bytes:
    """A JPEG of noise, well over the 64 KiB from which the mount reads images in place."""
    rng = np.random.default_rng(seed)
    img = Image.frombytes("RGB", (320, 320), rng.integers(0, 256, 320 * 320 * 3, dtype=np.uint8).tobytes())
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=95)
    data = buf.getvalue()
    assert len(data) > 80 << 10, len(data)
    return data


def _entries(ex: tf.train.Example) -> bytes:
    """The encoded map entries of an Example's features (what follows the two outer headers)."""
    features = ex.features.SerializeToString()
    assert ex.SerializeToString().endswith(features)
    return features


def _len_field(tag: int, payload: bytes) -> bytes:
    n, head = len(payload), bytearray([tag])
    while True:
        head.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(head) + payload


def large_records() -> list:
    """Records with images of more than 64 KiB, which a read-only mount serves from the shard,
    and records whose encoding is not the usual one, which it must show as TensorFlow reads them."""
    a, b, c = big_jpeg(1), big_jpeg(2), big_jpeg(3)
    png = io.BytesIO()
    Image.frombytes("RGB", (200, 200), RNG.integers(0, 256, 200 * 200 * 3, dtype=np.uint8).tobytes()).save(png, "PNG")
    od = example({"image/encoded": f_bytes(a), "image/format": f_bytes(b"jpeg"), "image/height": f_int(256),
                  "image/width": f_int(256), "image/object/bbox/xmin": f_float(0.1, 0.25),
                  "image/object/class/text": f_bytes(b"cat", b"dog"), "image/object/class/label": f_int(1, 2)})
    mixed = example({
        "png": f_bytes(png.getvalue()),
        "blob": f_bytes(rand_bytes(100_000)),                     # large, not media: .bin
        "essay": f_bytes(("Zoë writes. " * 7000).encode()),      # large text: .txt
        "frames": f_bytes(b, c),                                 # two large images: frames.list/
        "image_raw": f_bytes(pixels(160 * 160 * 3, first=b"\xff\xd8\xff")),   # raw pixels first
        "height": f_int(160), "width": f_int(160),
    })
    one = example({"image/encoded": f_bytes(a), "n": f_int(1)})
    other = example({"image/encoded": f_bytes(b), "n": f_int(2)})
    # Not the usual encoding: TensorFlow's protobuf decides what they hold.
    dup_key = _len_field(0x0A, _entries(one) + _entries(other))          # a key twice: the last wins
    features_twice = one.SerializeToString() + other.SerializeToString()  # merged
    unknown_field = one.SerializeToString() + bytes([0x28, 0x07])        # field 5 = 7: ignored
    two_kinds = _len_field(0x0A, _len_field(0x0A, _len_field(0x0A, b"image/encoded") + _len_field(
        0x12, f_bytes(c).SerializeToString() + f_int(5).SerializeToString())))   # the last kind wins
    return [od, mixed, dup_key, features_twice, unknown_field, two_kinds]


def small_examples(n: int, tag: str) -> list:
    return [example({"n": f_int(i), "tag": f_bytes(f"{tag}-{i}".encode()), "x": f_float(i / 8)}) for i in range(n)]


def gzmagic_record() -> tf.train.Example:
    """An Example whose serialized length is 0x8b1f: the plain shard starts with 1f 8b."""
    target = 0x8B1F
    pad = target - 40
    while True:
        ex = example({"pad": f_bytes(b"p" * pad), "n": f_int(1)})
        size = ex.ByteSize()
        if size == target:
            return ex
        pad += target - size


def raw_records() -> list:
    first = b"\xff" * 4 + rand_bytes(60)     # 0xff: field 31 with wire type 7 -> never parses
    return [first, b"line one\n", b"", "Zoë\n".encode(), bytes(range(256)), b"plain text line"]


def kind16_records() -> list:
    """Empty records do not count toward the first 16: index 17 is the 16th non-empty one."""
    recs: list = []
    for i in range(17):
        recs.append(b"" if i in (3, 5) else example({"n": f_int(i)}))
    recs.append(b"\xff\xfe not an example")                      # index 17
    recs.append(example({"n": f_int(18)}))
    return recs


def make_clean(root: str) -> dict:
    info: dict = {}
    write_shard(f"{root}/kinds.tfrecord", kinds_records())
    write_shard(f"{root}/keys.tfrecord", [hostile_keys_record(), clash_keys_record()])
    write_shard(f"{root}/text.tfrecord", text_records())
    write_shard(f"{root}/media.tfrecord", media_records())
    write_shard(f"{root}/pixels.tfrecord", pixel_records())
    write_shard(f"{root}/seq.tfrecord", seq_records())
    write_shard(f"{root}/many.tfrecord", small_examples(150, "many"))
    write_shard(f"{root}/gz_shard.tfrecord.gz", small_examples(7, "gz") + [hostile_keys_record()], "GZIP")
    write_shard(f"{root}/zlib_shard.zz", small_examples(5, "zlib"), "ZLIB")
    write_shard(f"{root}/seq_gzip.tfrecord.gz", seq_records()[:2], "GZIP")
    write_shard(f"{root}/large.tfrecord", large_records())
    write_shard(f"{root}/large_gz.tfrecord.gz", large_records()[:2], "GZIP")
    write_shard(f"{root}/x.tfrecord", [])                                     # 0 bytes
    write_shard(f"{root}/empty_records.tfrecord", [b"", b"", b""])
    write_shard(f"{root}/raw.tfrecord", raw_records())
    write_shard(f"{root}/kind16.tfrecord", kind16_records())
    write_shard(f"{root}/gzmagic.tfrecord", [gzmagic_record(), example({"n": f_int(2)})])
    write_shard(f"{root}/glob_a.tfrecord", small_examples(3, "ga"))
    write_shard(f"{root}/glob_b.tfrecord", small_examples(2, "gb"))
    write_shard(f"{root}/sub/part-00000-of-00002", small_examples(4, "p0"))
    write_shard(f"{root}/sub/part-00001-of-00002", small_examples(3, "p1"))
    write_shard(f"{root}/sub/deeper/d.tfrecords", [seq_records()[0]])
    write_shard(f"{root}/sub/deeper/empty-00000-of-00001", [])                # 0 bytes, named like a shard
    os.makedirs(f"{root}/emptydir", exist_ok=True)
    with open(f"{root}/README.txt", "w") as f:
        f.write("Fixtures for tfrfs interop tests.\nWritten by TensorFlow.\n")
    with open(f"{root}/dataset_info.json", "w") as f:
        json.dump({"name": "fixture", "splits": [{"name": "train", "shardLengths": ["3"]}]}, f)
    open(f"{root}/empty.txt", "wb").close()                                   # 0 bytes, not a shard name
    with open(f"{root}/notes.tfrecord.txt", "wb") as f:                       # not named like a shard (SPEC 1)
        f.write(b"this is not a TFRecord file, despite the .tfrecord in its name\n")
    open(f"{root}/sub/empty.records-00001", "wb").close()                     # 0 bytes, named like a shard
    open(f"{root}/sub/empty.tfrec.bak", "wb").close()                         # 0 bytes, not named like one
    with open(f"{root}/sub/part-00000-of-00002", "rb") as f:                  # index files never are shards,
        sound = f.read()                                                      # whatever they hold (SPEC 1)
    with open(f"{root}/sub/orphan.idx", "wb") as f:
        f.write(sound)
    with open(f"{root}/sub/label_map.pbtxt", "w") as f:
        f.write('item { id: 1 name: "raccoon" }\n')
    with open(f"{root}/.hidden_note", "w") as f:                              # any other regular file
        f.write("hidden but a regular file\n")
    with open(f"{root}/gzmagic.tfrecord", "rb") as f:
        assert f.read(2) == b"\x1f\x8b", "gzmagic shard must start with the gzip magic"
    assert os.path.getsize(f"{root}/x.tfrecord") == 0
    return info


# --- the damaged directory -------------------------------------------------------------------

def record_offsets(data: bytes) -> list[tuple[int, int]]:
    """(header offset, data length) of every record of an intact plain shard."""
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        out.append((pos, n))
        pos += 16 + n
    return out


def _masked_crc(b: bytes) -> int:
    """TFRecord's masked CRC32C (only to forge a header whose length checksum holds)."""
    import crc32c
    c = crc32c.crc32c(b)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _inflate_failure(data: bytes, wbits: int) -> int | None:
    """The offset of the byte at which zlib fails (None: no failure): fed in chunks, the failing
    chunk again byte by byte."""
    d = zlib.decompressobj(wbits)
    for pos in range(0, len(data), 1 << 16):
        saved = d.copy()
        try:
            d.decompress(data[pos:pos + (1 << 16)])
        except zlib.error:
            d = saved
            for i in range(pos, min(pos + (1 << 16), len(data))):
                try:
                    d.decompress(data[i:i + 1])
                except zlib.error:
                    return i
        if d.eof:
            return None
    return None


def _damage_stream_mid(p: str, wbits: int, seed: int) -> tuple[int, int]:
    """Overwrite 8 bytes from the middle of a compressed shard on with garbage such that
    inflation fails soon after it (garbage inside Huffman-coded data mostly decodes as other
    symbols, so many places are tried): (where the garbage is, the byte at which zlib fails)."""
    data = open(p, "rb").read()
    rng = np.random.default_rng(seed)
    d = zlib.decompressobj(wbits)
    d.decompress(data[: len(data) // 2])
    for at in range(len(data) // 2, len(data) * 3 // 4):
        junk = rng.integers(0, 256, 8, dtype=np.uint8).tobytes()
        try:
            d.copy().decompress(junk + data[at + 8: at + 8 + 4096])
        except zlib.error:
            bad = data[:at] + junk + data[at + 8:]
            fail = _inflate_failure(bad, wbits)
            assert fail is not None and at <= fail < at + 8 + 4096, (at, fail)
            if fail < len(data) - 8:          # not the stream's check value at its end
                open(p, "wb").write(bad)
                return at, fail
        d.decompress(data[at:at + 1])
    raise AssertionError(f"{p}: no garbage made inflation fail mid-stream")


def make_damaged(root: str) -> dict:
    """One shard per kind of damage. Each entry of the returned dict says what salvage must find
    (SPEC 6 and the damage contract), computed here from how the damage was made:
    ``records`` (how many records the shard shows; None when only the oracle can tell) and
    ``problems``: each ``{"type", "index", "offset", ...}`` with ``resync_offset`` and
    ``skipped`` for a gap, ``skipped`` for damage that runs to the end, and for a damaged
    compressed stream ``compressed_min``/``compressed_max`` (the range the failing byte is in);
    ``junk_ok``: garbage may inflate to other bytes before zlib fails, and records there fail
    their checks, or the walk ends at a header there that fails (more problems, the oracle's to find).
    ``sound`` lists the original record numbers (as TensorFlow wrote them) that salvage keeps."""
    info: dict = {}
    os.makedirs(root, exist_ok=True)

    def payload_examples(n: int, tag: str) -> list:
        return [example({"n": f_int(i), "payload": f_bytes(f"payload-{tag}-{i}-abcdefgh".encode())}) for i in range(n)]

    def gap(index: int, off: int, resync: int) -> dict:
        return {"type": "gap", "index": index, "offset": off, "resync_offset": resync, "skipped": resync - off}

    # 1. a flipped byte inside record 2's data: data crc fails, records 3 and 4 still served
    p = f"{root}/datacrc.tfrecord"
    write_shard(p, payload_examples(5, "d"))
    data = bytearray(open(p, "rb").read())
    offs = record_offsets(bytes(data))
    off, n = offs[2]
    body = bytes(data[off + 12: off + 12 + n])
    i = body.index(b"payload-d-2-abcdefgh") + len(b"payload-d-2-")
    data[off + 12 + i] ^= 0x01                # 'a' -> '`': the damaged data still parses
    open(p, "wb").write(data)
    info["datacrc.tfrecord"] = {"damage": "data_crc", "records": 5, "sound": [0, 1, 3, 4],
                                "problems": [{"type": "data_crc", "index": 2, "offset": off}]}

    # 2. a flipped byte of record 3's length checksum: records 0..2, then record 4 (as 000003)
    p = f"{root}/lencrc.tfrecord"
    write_shard(p, payload_examples(5, "l"))
    data = bytearray(open(p, "rb").read())
    offs = record_offsets(bytes(data))
    data[offs[3][0] + 9] ^= 0x40
    open(p, "wb").write(data)
    info["lencrc.tfrecord"] = {"damage": "length_crc", "records": 4, "sound": [0, 1, 2, 4],
                               "problems": [gap(3, offs[3][0], offs[4][0])]}

    # 3. cut short in the middle of record 3's data: nothing to resync to
    p = f"{root}/truncated.tfrecord"
    write_shard(p, payload_examples(4, "t"))
    data = open(p, "rb").read()
    off, n = record_offsets(data)[3]
    cut = data[: off + 12 + n // 2]
    open(p, "wb").write(cut)
    info["truncated.tfrecord"] = {"damage": "truncated", "records": 3, "sound": [0, 1, 2],
                                  "problems": [{"type": "cut", "index": 3, "offset": off, "skipped": len(cut) - off}]}

    # 4. a few trailing bytes (TensorFlow silently ignores fewer than 12)
    p = f"{root}/trailing.tfrecord"
    write_shard(p, payload_examples(3, "g"))
    data = open(p, "rb").read()
    open(p, "wb").write(data + b"\x00\x01\x02\x03\x04")
    info["trailing.tfrecord"] = {"damage": "trailing", "records": 3, "sound": [0, 1, 2],
                                 "problems": [{"type": "trailing", "index": 3, "offset": len(data)}]}

    # 5. an unparseable record after the first 16 non-empty ones: the shard stays example kind,
    #    the record is shown as 000017.bin and reported
    p = f"{root}/badparse.tfrecord"
    recs: list = [b"" if i == 3 else example({"n": f_int(i)}) for i in range(17)]
    recs.append(b"\xff\xfe not an example")
    recs.append(example({"n": f_int(18)}))
    write_shard(p, recs)
    data = open(p, "rb").read()
    info["badparse.tfrecord"] = {"damage": "parse", "records": 19, "sound": list(range(19)),
                                 "problems": [{"type": "parse", "index": 17, "offset": record_offsets(data)[17][0]}]}

    # 6. a raw shard with a data crc failure in record 1
    p = f"{root}/raw_datacrc.tfrecord"
    write_shard(p, [b"\xff\xff\xff raw", b"some raw text bytes", b"\xfe\xfe later"])
    data = bytearray(open(p, "rb").read())
    off, n = record_offsets(bytes(data))[1]
    data[off + 12 + 3] ^= 0x01
    open(p, "wb").write(data)
    info["raw_datacrc.tfrecord"] = {"damage": "data_crc", "records": 3, "sound": [0, 2],
                                    "problems": [{"type": "data_crc", "index": 1, "offset": off}]}

    # 7. a flipped byte inside the large JPEG of record 3: EIO for its files, the others served.
    # Read in order, record 3 is read ahead while record 2 is served, and found damaged there.
    p = f"{root}/large_datacrc.tfrecord"
    write_shard(p, [example({"image/encoded": f_bytes(big_jpeg(10 + i)), "n": f_int(i)}) for i in range(5)])
    data = bytearray(open(p, "rb").read())
    off, n = record_offsets(bytes(data))[3]
    data[off + 12 + n // 2] ^= 0x01
    open(p, "wb").write(data)
    info["large_datacrc.tfrecord"] = {"damage": "data_crc", "records": 5, "sound": [0, 1, 2, 4],
                                      "problems": [{"type": "data_crc", "index": 3, "offset": off}]}

    # 8. a GZIP shard cut short: the records wholly inside what inflates are shown; one problem
    #    at the end of the inflated prefix, compressed offset = the file's size
    p = f"{root}/gz_cut.tfrecord.gz"
    write_shard(p, small_examples(400, "gzc"), "GZIP")
    data = open(p, "rb").read()
    cut = data[: len(data) // 2]
    open(p, "wb").write(cut)
    info["gz_cut.tfrecord.gz"] = {"damage": "compressed_truncated", "records": None, "sound": None,
                                  "problems": [{"type": "stream", "index": None,
                                                "compressed_min": len(cut), "compressed_max": len(cut)}]}

    # 9. a bad length checksum mid-shard with several intact records after it: salvaged, renumbered
    p = f"{root}/lencrc_mid.tfrecord"
    write_shard(p, payload_examples(10, "m"))
    data = bytearray(open(p, "rb").read())
    offs = record_offsets(bytes(data))
    data[offs[4][0] + 8] ^= 0x10
    open(p, "wb").write(data)
    info["lencrc_mid.tfrecord"] = {"damage": "length_crc", "records": 9, "sound": [0, 1, 2, 3, 5, 6, 7, 8, 9],
                                   "problems": [gap(4, offs[4][0], offs[5][0])]}

    # 10. record 2's length field made to run past the end of the file, its length checksum made
    #     to hold: the header checks, the length does not fit; records 3 and 4 follow
    p = f"{root}/pastend.tfrecord"
    write_shard(p, payload_examples(5, "p"))
    data = bytearray(open(p, "rb").read())
    offs = record_offsets(bytes(data))
    off = offs[2][0]
    length = len(data) - off - 16 + 1000
    data[off:off + 12] = struct.pack("<Q", length) + struct.pack("<I", _masked_crc(struct.pack("<Q", length)))
    open(p, "wb").write(data)
    info["pastend.tfrecord"] = {"damage": "length_past_end", "records": 4, "sound": [0, 1, 3, 4],
                                "problems": [gap(2, off, offs[3][0])]}

    # 11. a zeroed range from the middle of record 2's data to the middle of record 3's: record 2
    #     is listed with a failing data checksum, record 3 is lost, records 4 and 5 follow
    p = f"{root}/zeroed.tfrecord"
    write_shard(p, payload_examples(6, "z"))
    data = bytearray(open(p, "rb").read())
    offs = record_offsets(bytes(data))
    lo = offs[2][0] + 12 + offs[2][1] // 2
    hi = offs[3][0] + 12 + offs[3][1] // 2
    data[lo:hi] = bytes(hi - lo)
    open(p, "wb").write(data)
    info["zeroed.tfrecord"] = {"damage": "zeroed", "records": 5, "sound": [0, 1, 4, 5],
                               "problems": [{"type": "data_crc", "index": 2, "offset": offs[2][0]},
                                            gap(3, offs[3][0], offs[4][0])]}

    # 12. 300 bytes of random garbage inserted between records 2 and 3
    p = f"{root}/garbage.tfrecord"
    write_shard(p, payload_examples(6, "r"))
    data = open(p, "rb").read()
    offs = record_offsets(data)
    junk = np.random.default_rng(1616).integers(0, 256, 300, dtype=np.uint8).tobytes()
    open(p, "wb").write(data[:offs[3][0]] + junk + data[offs[3][0]:])
    info["garbage.tfrecord"] = {"damage": "garbage", "records": 6, "sound": [0, 1, 2, 3, 4, 5],
                                "problems": [gap(3, offs[3][0], offs[3][0] + len(junk))]}

    # 13. the first header damaged, in a file named like a shard: a damaged shard folder whose
    #     record 000000 is the second record written
    p = f"{root}/firsthdr.tfrecord"
    write_shard(p, payload_examples(4, "f"))
    data = bytearray(open(p, "rb").read())
    offs = record_offsets(bytes(data))
    data[3] ^= 0x20                           # a length byte: the length checksum fails
    open(p, "wb").write(data)
    info["firsthdr.tfrecord"] = {"damage": "first_header", "records": 3, "sound": [1, 2, 3],
                                 "problems": [gap(0, 0, offs[1][0])]}

    # 14. the same bytes in a file NOT named like a shard: a plain file (in a folder); as SOURCE
    #     alone, a damaged shard (salvage finds sound records)
    with open(f"{root}/firsthdr.bin", "wb") as f:
        f.write(data)
    info["firsthdr.bin"] = {"damage": "first_header_not_shard_name", "plain": True, "records": 3,
                            "sound": [1, 2, 3], "problems": [gap(0, 0, offs[1][0])]}

    # 15. a GZIP shard with 8 bytes of garbage mid-stream: TensorFlow reads a prefix; every record
    #     wholly inside what inflates is served
    # (the file is larger than TensorFlow's read buffer, so TensorFlow returns records before it
    # meets the damage; the text compresses, so the garbage lands in Huffman-coded data)
    p = f"{root}/gz_garbage.tfrecord.gz"
    words = [w.encode() for w in "the quick brown fox jumps over a lazy dog while seven tired cats "
             "watch from an old wooden fence near the river bank at dawn".split()]
    write_shard(p, [example({"n": f_int(i), "text": f_bytes(b" ".join(RNG.choice(words, 1200)))})
                    for i in range(300)], "GZIP")
    at, fail = _damage_stream_mid(p, 16 + zlib.MAX_WBITS, 8)
    info["gz_garbage.tfrecord.gz"] = {"damage": "compressed_garbage", "records": None, "sound": None,
                                      "junk_ok": True, "written": 300, "garbage_offset": at,
                                      "problems": [{"type": "stream", "index": None,
                                                    "compressed_min": fail, "compressed_max": fail}]}

    # 16. a GZIP shard whose trailer CRC is flipped: every record inflates, the stream check fails
    p = f"{root}/gz_trailer.tfrecord.gz"
    write_shard(p, small_examples(30, "gzt"), "GZIP")
    data = bytearray(open(p, "rb").read())
    data[-8] ^= 0xFF                          # the first byte of the CRC32 of the gzip trailer
    open(p, "wb").write(data)
    info["gz_trailer.tfrecord.gz"] = {"damage": "compressed_trailer", "records": 30, "sound": list(range(30)),
                                      "problems": [{"type": "stream", "index": None,
                                                    "compressed_min": len(data) - 8,
                                                    "compressed_max": len(data) - 5}]}

    # 17. a ZLIB shard damaged mid-stream
    p = f"{root}/zlib_mid.tfrecord.zlib"
    write_shard(p, small_examples(300, "zm"), "ZLIB")
    at, fail = _damage_stream_mid(p, zlib.MAX_WBITS, 17)
    info["zlib_mid.tfrecord.zlib"] = {"damage": "compressed_garbage", "records": None, "sound": None,
                                      "junk_ok": True, "written": 300, "garbage_offset": at,
                                      "problems": [{"type": "stream", "index": None,
                                                    "compressed_min": fail, "compressed_max": fail}]}

    # 18. a GZIP shard whose stream inflates whole but whose records are damaged inside it: a data
    #     crc failure and a bad length crc (the bytes of a TF-written shard, damaged, then
    #     compressed): offsets are those of the inflated stream, records resume after the gap
    p = f"{root}/gz_inner.tfrecord.gz"
    write_shard(p + ".plain", payload_examples(8, "gi"))
    with open(p + ".plain", "rb") as f:
        data = bytearray(f.read())
    os.unlink(p + ".plain")
    offs = record_offsets(bytes(data))
    data[offs[1][0] + 12 + 5] ^= 0x01
    data[offs[4][0] + 10] ^= 0x02
    c = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    with open(p, "wb") as f:
        f.write(c.compress(bytes(data)) + c.flush())
    info["gz_inner.tfrecord.gz"] = {"damage": "inside_compressed", "records": 7, "sound": [0, 2, 3, 5, 6, 7],
                                    "problems": [{"type": "data_crc", "index": 1, "offset": offs[1][0]},
                                                 gap(4, offs[4][0], offs[5][0])]}

    # 19. a GZIP stream cut short inside garbage that follows the records (the bytes of a TF-written
    #     shard plus 200 random bytes, compressed, the last 28 bytes cut off): the walk of what
    #     inflates ends at the garbage with no record after it: two problems, the stream's damage
    #     and the header that fails where the records stop (the damage contract: only a record cut
    #     short by the end of what inflated is the stream's damage seen again)
    p = f"{root}/gz_tailjunk.tfrecord.gz"
    write_shard(p + ".plain", payload_examples(5, "tj"))
    with open(p + ".plain", "rb") as f:
        data = f.read()
    os.unlink(p + ".plain")
    junk = np.random.default_rng(1617).integers(0, 256, 200, dtype=np.uint8).tobytes()
    c = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    whole = c.compress(data + junk) + c.flush()
    with open(p, "wb") as f:
        f.write(whole[:-28])
    info["gz_tailjunk.tfrecord.gz"] = {"damage": "compressed_truncated_in_garbage", "records": 5,
                                       "sound": [0, 1, 2, 3, 4],
                                       "problems": [{"type": "cut", "index": 5, "offset": len(data),
                                                     "why": "header_crc"},
                                                    {"type": "stream", "index": None,
                                                     "compressed_min": len(whole) - 28,
                                                     "compressed_max": len(whole) - 28}]}

    # 20. named like a shard, holds text: a damaged shard of zero records
    p = f"{root}/notes.tfrecord"
    text = b"this is not a TFRecord file, despite its name\n"
    with open(p, "wb") as f:
        f.write(text)
    info["notes.tfrecord"] = {"damage": "not_tfrecord", "records": 0, "sound": [],
                              "problems": [{"type": "cut", "index": 0, "offset": 0, "skipped": len(text)}]}
    p = f"{root}/notes.tfrecord-00007"       # named like a shard too (SPEC 1: extension, '-', digits)
    with open(p, "wb") as f:
        f.write(text)
    info["notes.tfrecord-00007"] = {"damage": "not_tfrecord", "records": 0, "sound": [],
                                    "problems": [{"type": "cut", "index": 0, "offset": 0, "skipped": len(text)}]}
    return info


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: tf_fixtures.py OUTDIR", file=sys.stderr)
        return 2
    out = os.path.abspath(argv[1])
    os.makedirs(out, exist_ok=True)
    info = {"clean": make_clean(os.path.join(out, "clean")),
            "damaged": make_damaged(os.path.join(out, "damaged"))}
    with open(os.path.join(out, "fixtures.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
