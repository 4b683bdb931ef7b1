"""The expected mount tree of a SOURCE, computed from TensorFlow's view of the data.

Run as a subprocess under TensorFlow::

    .venv/bin/python tests/interop/tf_oracle.py [--sample N] SOURCE [SOURCE ...]

For every shard, the records are read the way TensorFlow reads them (``tf.data.TFRecordDataset``
with the right ``compression_type``, collecting records until ``DataLossError``) and parsed with
TensorFlow's ``tf.train.Example`` / ``tf.train.SequenceExample``. TensorFlow stops at the first
damaged record, while the mount keeps serving what it can (SPEC 6), so the framing is also
walked here by an independent reader (struct + crc32c + zlib) that salvages as the damage
contract says: past a bad header, a length that runs past the end, zeroed or garbage bytes it
resyncs at the next offset where a header checksum, a length that fits and the data checksum all
hold, numbering on; a GZIP/ZLIB stream is inflated as far as it goes (byte by byte at the
failure). It is cross-checked against TensorFlow: the records TensorFlow returns must be exactly
the first records that reader finds before the first damage (all of them for an uncompressed
shard; a prefix of them for a compressed one, as TensorFlow drops what it had inflated with the
damage). Which files are shards follows SPEC 1 and the contract: a sound first header (plain,
else after inflation), or a file named like a shard whose first header fails (a damaged shard),
or a file named as SOURCE in which salvage finds a sound record.

The expected tree follows SPEC sections 1-5 and is rendered here, independently of tfrfs's own
rendering code: values, JSON, magic bytes and raw-pixel detection are all written below. Only the
key -> path naming (SPEC 3.1, including the shortening and clash rules) comes from
``tfrfs.format.names`` (which has its own property tests); every name that SPEC 3.1 fixes outright
(no clash, no shortening) is also computed here and any difference is reported in
``name_problems``; shortened names are checked for the SPEC form (prefix + ``~`` + 8 hex
digits of SHA-256 + suffix, at most 255 bytes).

Output (JSON on stdout)::

  {"sources": {SOURCE: {
     "tree":   {relpath: entry},           # every path the mount must show (sampled records only)
     "shards": {relpath: {"compression", "tf_count", "tf_error", "count", "kind", "names",
                          "problems", "sampled", "mtime", "size",
                          "records_sha256", "records_ok",   # each record's bytes, data crc (<= 2000)
                          "tf_sha256",                      # each record TensorFlow returned
                          "sound_count", "sound_framed_sha256",  # what a repair keeps
                          "stream_size", "stream_sha256"}},      # the (inflated) stream walked
     "plain":  [relpath, ...],
     "name_problems": [...], "oracle_problems": [...]}}}

A problem is ``{"type", "index", "offset", ...}`` in stream order: ``data_crc`` and ``parse``
(a record), ``gap`` (+ ``resync_offset``, ``skipped``), ``cut`` (no resync to the end:
+ ``skipped``), ``trailing`` (fewer than 12 bytes left), ``stream`` (a damaged or cut short
compressed stream: ``index`` null, ``offset`` the inflated length, + ``compressed_offset``).

An entry is ``{"t": "dir"}``, ``{"t": "file", "sha256", "size"}``,
``{"t": "png", "mode", "width", "height", "pixels_sha256", "raw_suffix", "raw_size"}`` (compare
decoded pixels, not PNG bytes; ``raw_suffix``: the value's suffix under ``--no-decode-raw``) or
``{"t": "damaged", "names": [name], "files": [...]}`` (a record whose data checksum fails: listed
as ``name``, a folder when its unverified bytes parse as the shard's kind, else ``NNNNNN.bin``;
listing it, reading it, and reading ``files`` in it fail with EIO). Entries may carry ``"x"``:
the xattrs the mount must show on that path.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import struct
import sys
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import crc32c  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from google.protobuf.message import DecodeError  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    from tfrfs.format import names as tfrfs_names  # key -> path only (SPEC 3.1)
except Exception as exc:  # pragma: no cover - before the module exists
    tfrfs_names = None
    _NAMES_IMPORT_ERROR = repr(exc)
else:
    _NAMES_IMPORT_ERROR = None

Example = tf.train.Example
SequenceExample = tf.train.SequenceExample


# --- framing (independent reader) ------------------------------------------------------------
#
# The salvage walk of the damage contract (SPEC 6), written here from the contract alone:
# struct + crc32c + zlib, nothing from tfrfs.

def masked_crc(b) -> int:
    c = crc32c.crc32c(b)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def header_ok(h: bytes) -> bool:
    return len(h) >= 12 and masked_crc(h[:8]) == struct.unpack_from("<I", h, 8)[0]


SHARD_EXTS = r"(?:tfrecords?|tfrec|records?)"
INDEX_SUFFIXES = (".tfrfs-idx", ".idx", ".tfindex", ".index")
# tfrfs's own entries in a SOURCE folder, never shown (SPEC 1, 1.2, 6, 7)
OWN_DIRS = (".tfrfs-staging", ".tfrfs-damaged")
OWN_FILES = (".tfrfs-manifest",)


def named_like_shard(name: str) -> bool:
    """SPEC 1: the name, less a final .gz/.gzip/.zlib, ends in a shard extension, or has one
    followed by '-' and digits, or ends in -DIGITS-of-DIGITS; index files never are."""
    if name.endswith(INDEX_SUFFIXES):
        return False
    stem = re.sub(r"\.(?:gz|gzip|zlib)$", "", name)
    return bool(re.search(r"\." + SHARD_EXTS + r"$", stem)
                or re.search(r"\." + SHARD_EXTS + r"-\d+(?:-of-\d+)?$", stem)
                or re.search(r"-\d+-of-\d+$", stem))


def inflate(data: bytes, comp: str, limit: int | None = None) -> tuple[bytes, dict | None]:
    """The longest prefix of the stream that inflates, and the stream problem (or None).

    GZIP members that follow one another are read on as one stream. Input is fed in chunks; a
    chunk that fails is fed again byte by byte from the state before it, so everything zlib
    outputs before the failing byte counts. The problem: ``{"why": "damaged"|"cut"|"trailing",
    "compressed_offset"}`` (the failing byte, the file size, or where trailing bytes begin).
    ``limit``: stop once that many bytes are out (no problem is reported then).
    """
    wbits = 16 + zlib.MAX_WBITS if comp == "GZIP" else zlib.MAX_WBITS
    out = bytearray()
    n, start, chunk = len(data), 0, 1 << 16
    while True:
        d = zlib.decompressobj(wbits)
        pos = start
        while not d.eof:
            if limit is not None and len(out) >= limit:
                return bytes(out), None
            if pos >= n:
                return bytes(out), {"why": "cut", "compressed_offset": n, "msg": f"{comp} stream cut short"}
            piece = data[pos:pos + chunk]
            saved = d.copy()
            try:
                out += d.decompress(piece)
            except zlib.error:
                d = saved
                for i in range(pos, pos + len(piece)):
                    try:
                        out += d.decompress(data[i:i + 1])
                    except zlib.error as exc:
                        return bytes(out), {"why": "damaged", "compressed_offset": i,
                                            "msg": f"{comp} stream damaged: {exc}"}
                raise AssertionError("zlib failed on a chunk but not byte by byte")
            pos += len(piece)
        end = pos - len(d.unused_data)          # where this member ended in the file
        if end >= n:
            return bytes(out), None
        if comp == "GZIP" and data[end:end + 2] == b"\x1f\x8b":
            start = end                          # another member: read on as one stream
            continue
        return bytes(out), {"why": "trailing", "compressed_offset": end,
                            "msg": f"{n - end} bytes after the end of the {comp} stream"}


def resync(stream: bytes, start: int) -> int | None:
    """The smallest p >= start where a header checks, its length fits and its data crc holds."""
    n = len(stream)
    mv = memoryview(stream)
    unpack = struct.unpack_from
    for p in range(start, n - 15):
        length, hcrc = unpack("<QI", stream, p)
        end = p + 12 + length
        if end + 4 > n:
            continue
        if masked_crc(mv[p:p + 8]) != hcrc:
            continue
        if masked_crc(mv[p + 12:end]) == unpack("<I", stream, end)[0]:
            return p
    return None


def walk(stream: bytes) -> tuple[list, list]:
    """The contract's framing walk of a plain stream.

    Records ``[(offset, length, data, data_ok)]``, numbered across gaps; problems in file order:
    ``data_crc`` (index, offset), ``gap`` (index, offset, resync_offset, skipped, why),
    ``cut`` (no resync to the end: index, offset, skipped, why), ``trailing`` (fewer than 12
    bytes left: index, offset).
    """
    recs: list = []
    problems: list = []
    n, pos = len(stream), 0
    while pos < n:
        if n - pos < 12:
            problems.append({"type": "trailing", "index": len(recs), "offset": pos})
            break
        (length,) = struct.unpack_from("<Q", stream, pos)
        hok = header_ok(stream[pos:pos + 12])
        if hok and pos + 16 + length <= n:
            data = bytes(stream[pos + 12:pos + 12 + length])
            ok = masked_crc(data) == struct.unpack_from("<I", stream, pos + 12 + length)[0]
            if not ok:
                problems.append({"type": "data_crc", "index": len(recs), "offset": pos})
            recs.append((pos, length, data, ok))
            pos += 16 + length
            continue
        why = "past_end" if hok else "header_crc"
        r = resync(stream, pos + 1)
        if r is None:
            problems.append({"type": "cut", "index": len(recs), "offset": pos, "skipped": n - pos, "why": why})
            break
        problems.append({"type": "gap", "index": len(recs), "offset": pos, "resync_offset": r,
                         "skipped": r - pos, "why": why})
        pos = r
    return recs, problems


def first_header_sound(head: bytes) -> str | None:
    """SPEC 1: the compression under which the first record header checks, or None."""
    if header_ok(head[:12]):
        return "NONE"  # the plain header is checked first
    for comp in ("GZIP", "ZLIB"):
        out, _ = inflate(head, comp, limit=12)
        if header_ok(out[:12]):
            return comp
    return None


def damaged_compression(head: bytes, name: str) -> str:
    """The contract: the compression of a shard whose first header fails: as its name says
    (.gz/.gzip, .zlib), else GZIP (magic 1f 8b first) or ZLIB when inflating its first 4096
    bytes as such a stream gives at least one byte, or fails on none of them; else NONE."""
    if name.endswith((".gz", ".gzip")):
        return "GZIP"
    if name.endswith(".zlib"):
        return "ZLIB"
    for comp in ("GZIP", "ZLIB"):
        if comp == "GZIP" and head[:2] != b"\x1f\x8b":
            continue
        out, problem = inflate(head[:4096], comp)
        if out or problem is None or problem["why"] != "damaged":
            return comp
    return "NONE"


def salvage(data: bytes, comp: str) -> tuple[bytes, list, list]:
    """(the stream walked, records, problems) of a shard's bytes under its compression."""
    if comp == "NONE":
        recs, problems = walk(data)
        return data, recs, problems
    stream, sp = inflate(data, comp)
    recs, problems = walk(stream)
    if sp is not None:
        # a record cut short by the end of what inflated is the same damage as the stream's; a
        # header that fails before that end, with nothing sound after it, says where records stop
        problems = [p for p in problems
                    if not (p["type"] == "trailing" or (p["type"] == "cut" and p["why"] == "past_end"))]
        problems.insert(0, {"type": "stream", "index": None, "offset": len(stream),
                            "compressed_offset": sp["compressed_offset"], "why": sp["why"], "msg": sp["msg"]})
    return stream, recs, problems


def classify(path: str, is_source: bool) -> tuple[str, bool] | None:
    """SPEC 1 and the contract: (compression, damaged_at_first_header) of a shard, None for a
    plain file."""
    name = os.path.basename(path)
    if name.endswith(INDEX_SUFFIXES):
        return None          # index files never are shards, whatever they hold (SPEC 1)
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if not head:
        return ("NONE", False) if (is_source or named_like_shard(name)) else None
    comp = first_header_sound(head)
    if comp is not None:
        return comp, False
    comp = damaged_compression(head, name)
    if named_like_shard(name):
        return comp, True
    if is_source:
        _, recs, _ = salvage(open(path, "rb").read(), comp)
        if any(r[3] for r in recs):
            return comp, True
    return None


def tf_read(path: str, comp: str) -> tuple[list[bytes], str | None]:
    """The records TensorFlow returns, until it raises DataLossError."""
    out: list[bytes] = []
    ds = tf.data.TFRecordDataset(path, compression_type="" if comp == "NONE" else comp)
    try:
        for r in ds:
            out.append(r.numpy())
    except tf.errors.DataLossError as exc:
        return out, exc.message.splitlines()[0][:300] if exc.message else "DataLossError"
    return out, None


# --- value rendering (SPEC 3.2, 3.3) ---------------------------------------------------------

def jdump(obj) -> bytes:
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")


def f32_value(x: float) -> float:
    """The float whose Python repr is the shortest decimal reading back to the same float32."""
    return float(np.format_float_scientific(np.float32(x), unique=True))


def is_text(v: bytes) -> bool:
    if b"\x00" in v:
        return False
    try:
        v.decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        return False
    return True


def magic_suffix(v: bytes) -> str | None:
    if v[:3] == b"\xff\xd8\xff":
        return ".jpg"
    if v[:8] == b"\x89PNG\r\n\x1a\n":
        return ".png"
    if v[:6] in (b"GIF87a", b"GIF89a"):
        return ".gif"
    if v[:2] == b"BM" and len(v) >= 6 and struct.unpack_from("<I", v, 2)[0] == len(v):
        return ".bmp"
    if v[:4] == b"RIFF" and v[8:12] == b"WEBP":
        return ".webp"
    if v[:4] in (b"II*\x00", b"MM\x00*"):
        return ".tif"
    if v[:4] == b"RIFF" and v[8:12] == b"WAVE":
        return ".wav"
    if v[:4] == b"fLaC":
        return ".flac"
    if v[:3] == b"ID3":
        return ".mp3"
    if v[:4] == b"OggS":
        return ".ogg"
    return None


def one_int(feats, key: str) -> int | None:
    if key not in feats:
        return None
    f = feats[key]
    if f.WhichOneof("kind") != "int64_list" or len(f.int64_list.value) != 1:
        return None
    return int(f.int64_list.value[0])


def pixel_shape(key: str, value: bytes, feats) -> tuple[int, int, int] | None:
    """SPEC 3.3: (height, width, channels) when the value is a raw pixel array."""
    prefix = key[: key.rfind("/") + 1]
    h, w = one_int(feats, prefix + "height"), one_int(feats, prefix + "width")
    if h is None or w is None or h <= 0 or w <= 0:
        return None
    declared = [c for c in (one_int(feats, prefix + "depth"), one_int(feats, prefix + "channels")) if c is not None]
    options = set(declared) if declared else {1, 3, 4}
    fits = [c for c in sorted(options) if c in (1, 3, 4) and h * w * c == len(value)]
    if len(fits) != 1:
        return None
    return h, w, fits[0]


class R:
    """A rendered value: a file (content or png spec) or a folder (children by name)."""

    def __init__(self, suffix: str, content: bytes | None = None, png: dict | None = None,
                 children: dict | None = None, kind: str | None = None) -> None:
        self.suffix, self.content, self.png, self.children, self.kind = suffix, content, png, children, kind


def single_bytes(v: bytes, shape=None) -> R:
    if shape is not None:
        h, w, c = shape
        # raw_suffix: how the value shows with --no-decode-raw (the other rows of the table)
        return R(".png", png={"mode": {1: "L", 3: "RGB", 4: "RGBA"}[c], "width": w, "height": h,
                              "pixels_sha256": hashlib.sha256(v).hexdigest(),
                              "raw_suffix": single_bytes(v).suffix, "raw_size": len(v)})
    m = magic_suffix(v)
    if m:
        return R(m, v)
    if is_text(v):
        return R(".txt", v)
    return R(".bin", v)


def width_of(n: int) -> int:
    return len(str(max(n - 1, 0)))


def render_feature(key: str | None, feat, feats=None) -> R:
    """SPEC 3.2 (``feats`` given: raw pixel detection of 3.3 applies)."""
    kind = feat.WhichOneof("kind")
    if kind is None:
        return R(".json", jdump(None), kind="none")
    if kind == "int64_list":
        return R(".json", jdump([int(x) for x in feat.int64_list.value]), kind=kind)
    if kind == "float_list":
        return R(".json", jdump([f32_value(x) for x in feat.float_list.value]), kind=kind)
    vals = [bytes(v) for v in feat.bytes_list.value]
    if len(vals) == 1:
        shape = pixel_shape(key, vals[0], feats) if (feats is not None and key is not None) else None
        r = single_bytes(vals[0], shape)
        r.kind = kind
        return r
    if all(is_text(v) for v in vals):
        return R(".json", jdump([v.decode("utf-8") for v in vals]), kind=kind)
    wd = width_of(len(vals))
    children = {}
    for i, v in enumerate(vals):
        c = single_bytes(v)
        children[str(i).zfill(wd) + c.suffix] = c
    return R(".list", children=children, kind=kind)


def render_feature_list(steps) -> R:
    """SPEC 4: one feature list of a SequenceExample."""
    if not steps:
        return R(".json", jdump([]))
    kinds = {s.WhichOneof("kind") for s in steps}
    if kinds == {"int64_list"}:
        return R(".json", jdump([[int(x) for x in s.int64_list.value] for s in steps]))
    if kinds == {"float_list"}:
        return R(".json", jdump([[f32_value(x) for x in s.float_list.value] for s in steps]))
    if kinds == {"bytes_list"} and all(is_text(bytes(v)) for s in steps for v in s.bytes_list.value):
        return R(".json", jdump([[bytes(v).decode("utf-8") for v in s.bytes_list.value] for s in steps]))
    wd = width_of(len(steps))
    children = {}
    for i, s in enumerate(steps):
        c = render_feature(None, s)
        children[str(i).zfill(wd) + c.suffix] = c
    return R(".steps", children=children)


# --- key -> path (SPEC 3.1) ------------------------------------------------------------------

def own_component(part: str) -> str:
    out = []
    for i, ch in enumerate(part):
        if ch in "%/" or ord(ch) < 0x20 or ch == "\x7f" or (i == 0 and ch == "."):
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8")))
        else:
            out.append(ch)
    return "".join(out)


def own_components(key: str) -> tuple[str, ...]:
    if key == "":
        return ("%",)
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return (own_component(key),)
    return tuple(own_component(p) for p in parts)


def own_layout(entries: list[tuple[str, str]]) -> dict[str, tuple[str, ...] | None]:
    """Names SPEC 3.1 fixes outright; None for keys caught in a clash or a shortening."""
    paths = {k: own_components(k)[:-1] + (own_components(k)[-1] + s,) for k, s in entries}
    leaf = {}
    for k, p in paths.items():
        leaf.setdefault(p, []).append(k)
    dirs = {}
    for k, p in paths.items():
        for i in range(1, len(p)):
            dirs.setdefault(p[:i], set()).add(k)
    out: dict[str, tuple[str, ...] | None] = {}
    for k, p in paths.items():
        bad = any(len(c.encode()) > 255 for c in p) or len(leaf[p]) > 1 or p in dirs
        bad = bad or any(p[:i] in leaf for i in range(1, len(p)))
        out[k] = None if bad else p
    # a folder standing for a long key part is shortened for every key under it
    return out


def layout(entries: list[tuple[str, str]], problems: list, where: str) -> dict[str, tuple[str, ...]]:
    own = own_layout(entries)
    if tfrfs_names is None:
        problems.append(f"tfrfs.format.names not importable ({_NAMES_IMPORT_ERROR}): own naming used")
        return {k: (p if p is not None else own_components(k)[:-1] + (own_components(k)[-1] + s,))
                for (k, s), p in zip(entries, own.values())}
    got = {k: tuple(v) for k, v in tfrfs_names.layout(entries).items()}
    for k, s in entries:
        p = got.get(k)
        if p is None:
            problems.append(f"{where}: tfrfs.format.names.layout gave no path for key {k!r}")
            continue
        if own[k] is not None and own[k] != p:
            problems.append(f"{where}: key {k!r}{s}: SPEC 3.1 gives {own[k]!r}, tfrfs.format.names gives {p!r}")
        if not p[-1].endswith(s):
            problems.append(f"{where}: key {k!r}: name {p[-1]!r} lost its suffix {s!r}")
        for c in p:
            if len(c.encode()) > 255:
                problems.append(f"{where}: key {k!r}: component longer than 255 bytes")
            if "~" in c and own[k] is None:
                import re
                if not re.search(r"~[0-9a-f]{8}" + re.escape(s if c is p[-1] else "") + r"$", c):
                    problems.append(f"{where}: key {k!r}: shortened name {c!r} not of the form PREFIX~HHHHHHHH{s}")
    if len(set(got.values())) != len(got):
        problems.append(f"{where}: two keys share one path: {got!r}")
    return got


# --- record rendering ------------------------------------------------------------------------

class Builder:
    def __init__(self) -> None:
        self.tree: dict[str, dict] = {}
        self.name_problems: list[str] = []

    def add(self, path: str, entry: dict) -> None:
        if path in self.tree and self.tree[path] != entry:
            if not (entry["t"] == "dir" and self.tree[path]["t"] == "dir"):
                self.name_problems.append(f"two entries for {path!r}")
        if path in self.tree and entry["t"] == "dir":
            self.tree[path].setdefault("x", {}).update(entry.get("x", {}))
            return
        self.tree[path] = entry

    def put_rendered(self, path: str, r: R, x: dict | None) -> None:
        if r.children is not None:
            self.add(path, {"t": "dir", **({"x": x} if x else {})})
            for name, c in r.children.items():
                self.put_rendered(f"{path}/{name}", c, None)
        elif r.png is not None:
            self.add(path, {"t": "png", **r.png, **({"x": x} if x else {})})
        else:
            self.add(path, {"t": "file", "sha256": hashlib.sha256(r.content).hexdigest(),
                            "size": len(r.content), **({"x": x} if x else {})})

    def place(self, base: str, rendered: dict[str, R], with_kind: bool) -> None:
        entries = [(k, r.suffix) for k, r in rendered.items()]
        paths = layout(entries, self.name_problems, base)
        for k, r in rendered.items():
            comps = paths.get(k)
            if comps is None:
                continue
            parts = k.split("/")
            for i in range(1, len(comps)):
                x = {"user.tfrfs.key": "/".join(parts[:i])} if len(comps) == len(parts) else {}
                self.add(base + "/" + "/".join(comps[:i]), {"t": "dir", **({"x": x} if x else {})})
            x = {"user.tfrfs.key": k}
            if with_kind:
                x["user.tfrfs.kind"] = r.kind
            self.put_rendered(base + "/" + "/".join(comps), r, x)

    def example(self, base: str, ex) -> None:
        feats = ex.features.feature
        self.place(base, {k: render_feature(k, feats[k], feats) for k in feats}, True)

    def sequence(self, base: str, se) -> None:
        self.add(base + "/context", {"t": "dir"})
        self.add(base + "/feature_lists", {"t": "dir"})
        feats = se.context.feature
        self.place(base + "/context", {k: render_feature(k, feats[k], feats) for k in feats}, True)
        lists = se.feature_lists.feature_list
        self.place(base + "/feature_lists", {k: render_feature_list(list(lists[k].feature)) for k in lists}, False)


def parses(cls, data: bytes):
    try:
        return cls.FromString(data)
    except (DecodeError, RuntimeError, ValueError):
        return None


def record_kind(good: list[bytes]) -> str:
    """SPEC 2, from the records whose checksums hold."""
    for d in good:
        se = parses(SequenceExample, d)
        if se is not None and se.HasField("feature_lists"):
            return "sequence"
    nonempty = [d for d in good if d][:16]
    if any(parses(Example, d) is None for d in nonempty):
        return "raw"
    return "example"


def damaged_files(kind: str, msg) -> list[str]:
    """The files a damaged record's unverified bytes would show (relative to its folder)."""
    sub = Builder()
    if kind == "sequence":
        sub.sequence("r", msg)
    else:
        sub.example("r", msg)
    return sorted(p[2:] for p, e in sub.tree.items() if e["t"] != "dir")


def oracle_shard(b: Builder, path: str, rel: str, comp: str, sample: int | None,
                 oracle_problems: list) -> dict:
    raw = open(path, "rb").read()
    stream, recs, problems = salvage(raw, comp)
    tf_recs, tf_err = tf_read(path, comp)
    # Cross-check: TensorFlow's records are exactly the first records the framing reader finds
    # before the first damage (all of them for an uncompressed stream; a compressed one may
    # lose the last records TensorFlow had inflated when it hit the damage).
    first_bad = min([p["index"] for p in problems if p["type"] in ("data_crc", "gap", "cut")] + [len(recs)])
    stream_problem = any(p["type"] == "stream" for p in problems)
    for i, d in enumerate(tf_recs):
        if i >= first_bad or recs[i][2] != d:
            oracle_problems.append(f"{rel}: TensorFlow record {i} is not record {i} of the framing reader "
                                   f"(damage from record {first_bad} on)")
            break
    if not stream_problem and len(tf_recs) != first_bad:
        oracle_problems.append(f"{rel}: TensorFlow read {len(tf_recs)} records ({tf_err}), the framing "
                               f"reader finds {first_bad} before the first damage")
    framing_damage = [p for p in problems if p["type"] in ("data_crc", "gap", "cut", "stream")]
    if framing_damage and tf_err is None:
        oracle_problems.append(f"{rel}: damaged shard ({framing_damage[0]}) read to the end by TensorFlow")
    if not problems and tf_err is not None:
        oracle_problems.append(f"{rel}: clean shard but TensorFlow failed: {tf_err}")

    count = len(recs)
    kind = record_kind([r[2] for r in recs if r[3]])
    width = max(6, len(str(count - 1)))
    selected = list(range(count))
    sampled = None
    if sample is not None and count > sample:
        rng = random.Random(rel)
        sel = set(range(20)) | set(range(count - 5, count)) | set(rng.sample(range(count), 25))
        selected = sorted(sel)
        sampled = selected
    names = []
    sel_set = set(selected)
    cls = SequenceExample if kind == "sequence" else Example
    b.add(rel, {"t": "dir"})
    for i, (off, length, data, ok) in enumerate(recs):
        num = str(i).zfill(width)
        rx = {"user.tfrfs.shard": rel, "user.tfrfs.index": str(i),
              "user.tfrfs.offset": str(off), "user.tfrfs.length": str(length)}
        if not ok:
            # the contract: a folder if its unverified bytes parse as the shard's kind, else .bin;
            # listing the folder, and reading it or any of its files, fails with EIO
            msg = None if kind == "raw" else parses(cls, data)
            if msg is None:
                names.append([num + ".bin"])
                if i in sel_set:
                    b.add(f"{rel}/{num}.bin", {"t": "damaged", "names": [num + ".bin"], "files": [], "x": {}})
            else:
                names.append([num])
                if i in sel_set:
                    b.add(f"{rel}/{num}", {"t": "damaged", "names": [num], "files": damaged_files(kind, msg), "x": rx})
            continue
        if kind == "raw":
            names.append([num + ".bin"])
            if i in sel_set:
                b.add(f"{rel}/{num}.bin", {"t": "file", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
            continue
        msg = parses(cls, data)
        if msg is None:
            problems.append({"type": "parse", "index": i, "offset": off})
            names.append([num + ".bin"])
            if i in sel_set:
                b.add(f"{rel}/{num}.bin", {"t": "file", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
            continue
        names.append([num])
        if i not in sel_set:
            continue
        b.add(f"{rel}/{num}", {"t": "dir", "x": rx})
        if kind == "sequence":
            b.sequence(f"{rel}/{num}", msg)
        else:
            b.example(f"{rel}/{num}", msg)
    problems.sort(key=lambda p: (p["offset"], p["index"] if p["index"] is not None else -1))
    sound = [r for r in recs if r[3]]
    small = count <= 2000
    return {"compression": comp, "tf_count": len(tf_recs), "tf_error": tf_err, "count": count,
            "kind": kind, "names": names, "problems": problems, "sampled": sampled,
            "records_sha256": [hashlib.sha256(r[2]).hexdigest() for r in recs] if small else None,
            "records_ok": [r[3] for r in recs] if small else None,
            "tf_sha256": [hashlib.sha256(d).hexdigest() for d in tf_recs] if len(tf_recs) <= 2000 else None,
            # what a repair keeps: every record whose header and data checksums hold, framed as it was
            "sound_framed_sha256": hashlib.sha256(b"".join(stream[r[0]:r[0] + 16 + r[1]] for r in sound)).hexdigest(),
            "sound_count": len(sound),
            "stream_size": len(stream), "stream_sha256": hashlib.sha256(stream).hexdigest(),
            "size": len(raw), "mtime": os.stat(path).st_mtime}


def oracle_source(source: str, sample: int | None) -> dict:
    b = Builder()
    shards: dict[str, dict] = {}
    plain: list[str] = []
    oracle_problems: list[str] = []
    if os.path.isdir(source):
        for dirpath, dirnames, filenames in os.walk(source):
            dirnames[:] = sorted(d for d in dirnames if d not in OWN_DIRS)
            rel_dir = os.path.relpath(dirpath, source)
            if rel_dir != ".":
                b.add(rel_dir, {"t": "dir"})
            for fn in sorted(filenames):
                if fn in OWN_FILES:
                    continue
                full = os.path.join(dirpath, fn)
                rel = fn if rel_dir == "." else f"{rel_dir}/{fn}"
                if not os.path.isfile(full) or os.path.islink(full):
                    continue
                c = classify(full, False)
                if c is None:
                    data = open(full, "rb").read()
                    plain.append(rel)
                    b.add(rel, {"t": "file", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
                else:
                    shards[rel] = oracle_shard(b, full, rel, c[0], sample, oracle_problems)
    else:
        c = classify(source, True)
        if c is None:
            raise SystemExit(f"{source} is not a shard")
        rel = os.path.basename(source)
        shards[rel] = oracle_shard(b, source, rel, c[0], sample, oracle_problems)
    return {"tree": b.tree, "shards": shards, "plain": plain,
            "name_problems": sorted(set(b.name_problems)), "oracle_problems": oracle_problems}


def main(argv: list[str]) -> int:
    args = argv[1:]
    sample = None
    if args[:1] == ["--sample"]:
        sample = int(args[1])
        args = args[2:]
    if not args:
        print("usage: tf_oracle.py [--sample N] SOURCE [SOURCE ...]", file=sys.stderr)
        return 2
    out = {"sources": {s: oracle_source(s, sample) for s in args}}
    sys.stdout.write(json.dumps(out, sort_keys=True))
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
