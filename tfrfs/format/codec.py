"""Feature values <-> files (SPEC 3.2, 3.3, 4, and the content rules of 7).

Reading: ``value_from_proto`` turns a ``Feature`` into a ``Value``; ``render`` shows it as the
first row of the SPEC 3.2 table that fits (which row: ``shown_as``, whose names such as
``raw_shapes`` and ``suffix_of`` codec also offers) and produces the exact bytes;
``render_feature_list`` does the same for a SequenceExample feature list (4).

Writing: ``parse``, ``parse_list``, ``parse_feature_list`` and ``parse_raw_png`` turn file content
back into values and raise ``errors.Invalid`` with a reason a user can act on when the content
does not fit.

The identity everything here is tested against: for every Value ``v``,
``parse(render(v).suffix, render(v).data, v.kind) == v`` (``parse_list`` for a ``.list`` folder).
For a key new to the dataset (``kind=None``) the kind is inferred from the content, and every value
comes back with its kind, except one case the SPEC fixes on purpose: ``[]`` for a new key means
``bytes_list``, so an empty ``int64_list`` or ``float_list`` copied into a NEW key comes back as an
empty ``bytes_list``.

This module sits on a FUSE hot path (every record a user opens is rendered), so the common
renders (integers, floats, encoded images) avoid regexes and per-value allocation where they can;
where the compiled part was built, an Example in the usual encoding is read and shown in C
(``compiled_files``, ``_example.c``), and this module stays the reference it is tested against.
"""

from __future__ import annotations

import json
import math
import numbers
import struct
from dataclasses import dataclass
from typing import Any, Callable, Sequence, Union

from json.encoder import encode_basestring  # the C escaper json.dumps uses, without ASCII escaping

from tfrfs.format.compiled import optional
from tfrfs.errors import Invalid
from tfrfs.format.jsontext import json_floats
# What a value is shown as is decided in shown_as, raw pixels <-> PNG in raw_png: the names a
# caller of codec used before they moved there stay part of codec's face.
from tfrfs.format.raw_png import encode_png, parse_raw_png  # noqa: F401
from tfrfs.format.shown_as import (Shape, is_text, raw_shape, raw_shapes, single_suffix,  # noqa: F401
                                   sniff_media, steps_suffix, suffix_of, texts)

KINDS = ("int64_list", "float_list", "bytes_list", "none")

MEDIA_SUFFIXES = (".jpg", ".png", ".gif", ".bmp", ".webp", ".tif", ".wav", ".flac", ".mp3", ".ogg")
SUFFIXES: frozenset[str] = frozenset((".json", ".txt", ".bin", *MEDIA_SUFFIXES))
DIR_SUFFIXES = (".list", ".steps")

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_F32 = struct.Struct("<f")


# --------------------------------------------------------------------------------------------
# Values and views


@dataclass(frozen=True)
class Value:
    """One Feature's value: its kind and its values (``()`` for kind ``none``).

    Floats are Python floats holding exact float32 values.
    """

    kind: str
    values: tuple

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown feature kind {self.kind!r}")


@dataclass(frozen=True)
class FileView:
    """A feature shown as one file."""

    suffix: str
    data: bytes
    raw_shape: Shape | None = None  # set when ``data`` is a PNG made from raw pixels


@dataclass(frozen=True)
class DirView:
    """A feature shown as a folder: ``KEY.list/`` (bytes values) or ``KEY.steps/`` (steps)."""

    suffix: str
    items: tuple[tuple[str, "FileView | DirView"], ...]  # (name without suffix, view), in order


View = Union[FileView, DirView]


# --------------------------------------------------------------------------------------------
# Proto <-> Value


def _f32_tuple(values: Any) -> tuple[float, ...]:
    n = len(values)
    if n == 0:
        return ()
    fmt = f"<{n}f"
    return struct.unpack(fmt, struct.pack(fmt, *values))


_FROM_PROTO: dict[str, Callable[[Any], tuple]] = {
    "int64_list": lambda f: tuple(f.int64_list.value),
    # The runtime already widens float32 to double; the struct round trip pins the rounding
    # to IEEE float32 whatever protobuf backend is installed.
    "float_list": lambda f: _f32_tuple(f.float_list.value),
    "bytes_list": lambda f: tuple(f.bytes_list.value),
}


def value_from_proto(feature: Any) -> Value:
    """The Value of a ``proto.Feature`` (a Feature with no kind set is kind ``none``)."""
    kind = feature.WhichOneof("kind")
    if kind is None:
        return Value("none", ())
    return Value(kind, _FROM_PROTO[kind](feature))


def value_to_proto(value: Value, feature: Any) -> None:
    """Fill ``feature`` (a ``proto.Feature``) with ``value``; kind ``none`` leaves the oneof unset."""
    feature.Clear()
    if value.kind == "none":
        return
    lst = getattr(feature, value.kind)
    # SetInParent marks the oneof even for zero values: "[]" of a kind is not a Feature with no kind.
    lst.SetInParent()
    lst.value.extend(value.values)


def plain_feature(feature: Any) -> list | None:
    """A ``proto.Feature`` as plain Python values (SPEC 9): a list of ``int``, ``float`` (the
    float32 value) or ``bytes``, one element or none kept as such; None for a Feature with no kind."""
    # (a training loop's step: straight to a list, no Value between)
    values = _FROM_PROTO.get(feature.WhichOneof("kind"))
    return None if values is None else list(values(feature))


def plain_values(message: Any) -> dict:
    """An ``Example`` as ``{key: list}``, a ``SequenceExample`` as ``{"context": {key: list},
    "feature_lists": {key: [list, ...]}}`` (SPEC 9): what ``tfrfs.open(...).example`` gives."""
    if message.DESCRIPTOR.name == "SequenceExample":
        return {"context": {k: plain_feature(f) for k, f in message.context.feature.items()},
                "feature_lists": {k: [plain_feature(f) for f in fl.feature]
                                  for k, fl in message.feature_lists.feature_list.items()}}
    return {k: plain_feature(f) for k, f in message.features.feature.items()}


def plain_to_value(values: Any, kind: str | None = None) -> Value:
    """The Value of a feature given as plain Python values, the inverse of ``plain_feature``
    (``tfrfs.ray.write``, SPEC 9): None is a Feature with no kind, a list holds ``int``,
    ``float`` or ``bytes``/``str`` (stored as UTF-8) values.

    ``kind`` is the value's kind when the caller knows it (e.g. from an Arrow column's type): the
    values must fit it (an int64 in range; a number that float32 can hold, rounded to it; bytes
    or text). None infers it as SPEC 7 does for a key new to the dataset: any float makes a
    float_list, integers an int64_list, strings or bytes a bytes_list, and so does ``[]``.
    Raises ``errors.Invalid`` when the values do not fit.
    """
    if values is None:
        return Value("none", ())
    if isinstance(values, (str, bytes, bytearray, memoryview)) or not isinstance(values, Sequence):
        raise Invalid(f"{_describe_plain(values)} is not a list of feature values; "
                      "write a list such as [1, 2], [0.5] or [b\"a\"] (None: a feature with no kind)")
    if kind is None or kind == "none":
        kind = _infer_kind(values, _plain_item)
    if kind not in _PLAIN:
        raise ValueError(f"unknown feature kind {kind!r}")
    return Value(kind, _PLAIN[kind](values))


def _describe_plain(x: Any) -> str:
    if isinstance(x, (bytes, bytearray, memoryview)):
        return f"the bytes {bytes(x[:30])!r}"
    if isinstance(x, (int, float, str)) or x is None:
        return _describe(x)
    return f"a {type(x).__name__}"


def _plain_item(x: Any, i: int, n: int) -> str:
    """The sort of one Python value for ``_infer_kind``: a bool is not a number here either."""
    if isinstance(x, bool):
        raise Invalid(f"the boolean {x}{_where(i, n)} cannot be a feature value; write 0 or 1")
    if isinstance(x, numbers.Integral):
        return "int"
    if isinstance(x, numbers.Real):
        return "float"
    if isinstance(x, (str, bytes, bytearray, memoryview)):
        return "text"
    raise Invalid(f"{_describe_plain(x)}{_where(i, n)} cannot be a feature value; "
                  "a feature holds numbers or strings, e.g. [1, 2] or [b\"a\"]")


def _plain_ints(items: Sequence[Any]) -> tuple:
    n = len(items)
    out = []
    for i, x in enumerate(items):
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise Invalid(f"{_describe_plain(x)}{_where(i, n)} is not an integer; this feature holds int64_list")
        v = int(x)
        if not _INT64_MIN <= v <= _INT64_MAX:
            raise Invalid(f"{_describe(v)}{_where(i, n)} is outside the int64 range")
        out.append(v)
    return tuple(out)


def _plain_floats(items: Sequence[Any]) -> tuple:
    n = len(items)
    for i, x in enumerate(items):
        if isinstance(x, bool) or not isinstance(x, numbers.Real):
            raise Invalid(f"{_describe_plain(x)}{_where(i, n)} is not a number; this feature holds float_list")
    as_floats = [float(x) for x in items]
    return _as_float32(as_floats, as_floats)


def _plain_bytes(items: Sequence[Any]) -> tuple:
    n = len(items)
    out = []
    for i, x in enumerate(items):
        if isinstance(x, str):
            try:
                out.append(x.encode("utf-8"))
            except UnicodeEncodeError:
                raise Invalid(f"string{_where(i, n)} holds a lone surrogate escape and is not UTF-8") from None
        elif isinstance(x, (bytes, bytearray, memoryview)):
            out.append(bytes(x))
        else:
            raise Invalid(f"{_describe_plain(x)}{_where(i, n)} is not bytes or a string; "
                          "this feature holds bytes_list")
    return tuple(out)


_PLAIN: dict[str, Callable[[Sequence[Any]], tuple]] = {
    "int64_list": _plain_ints,
    "float_list": _plain_floats,
    "bytes_list": _plain_bytes,
}


# --------------------------------------------------------------------------------------------
# Render (SPEC 3.2, 4)


def _json_ints(values: Sequence[int]) -> str:
    return "[" + ", ".join(map(str, values)) + "]"


def _json_texts(texts: Sequence[str]) -> str:
    return "[" + ", ".join(map(encode_basestring, texts)) + "]"


def index_names(n: int) -> list[str]:
    """Names of ``n`` items of a .list/ or .steps/ folder: indexes zero-padded to the largest (SPEC 3.2)."""
    width = len(str(n - 1)) if n else 1
    return [str(i).zfill(width) for i in range(n)]


def _render_bytes(values: tuple, shape: Shape | None) -> View:
    if len(values) == 1:
        data = values[0]
        if shape is not None:
            return FileView(".png", encode_png(data, shape), shape)
        return FileView(single_suffix(data), data)
    as_text = texts(values)
    if as_text is not None:  # all text, as shown_as.bytes_suffix has it; zero values too: "[]"
        return FileView(".json", (_json_texts(as_text) + "\n").encode("utf-8"))
    return DirView(".list", tuple((name, FileView(single_suffix(v), v))
                                  for name, v in zip(index_names(len(values)), values)))


_RENDER: dict[str, Callable[[tuple], View]] = {
    "int64_list": lambda values: FileView(".json", (_json_ints(values) + "\n").encode("ascii")),
    "float_list": lambda values: FileView(".json", (json_floats(values) + "\n").encode("ascii")),
    "bytes_list": lambda values: _render_bytes(values, None),
    "none": lambda values: FileView(".json", b"null\n"),
}


def render(value: Value, shape: Shape | None = None) -> View:
    """How a feature value is shown (SPEC 3.2; the first row that fits decides).

    ``shape`` (from ``raw_shapes``) makes a one-value bytes feature a PNG of its pixels.
    """
    if shape is not None:
        if value.kind != "bytes_list" or len(value.values) != 1:
            raise ValueError("only a one-value bytes_list feature can be a raw pixel array")
        return _render_bytes(value.values, shape)
    return _RENDER[value.kind](value.values)


def render_feature_list(steps: Sequence[Value]) -> View:
    """How a SequenceExample feature list is shown (SPEC 4).

    All steps int64, all float, or all text: one ``.json`` array of per-step arrays (``[]`` for
    zero steps); otherwise a ``.steps`` folder with one entry per step, rendered like a feature.
    """
    if steps_suffix(steps) == ".json":
        if not steps:
            return FileView(".json", b"[]\n")
        kind = steps[0].kind
        if kind == "int64_list":
            body = ", ".join(_json_ints(s.values) for s in steps)
            return FileView(".json", f"[{body}]\n".encode("ascii"))
        if kind == "float_list":
            body = ", ".join(json_floats(s.values) for s in steps)
            return FileView(".json", f"[{body}]\n".encode("ascii"))
        body = ", ".join(_json_texts(texts(s.values) or ()) for s in steps)
        return FileView(".json", f"[{body}]\n".encode("utf-8"))
    return DirView(".steps", tuple((name, render(step))
                                   for name, step in zip(index_names(len(steps)), steps)))


def compiled_files() -> Callable[[bytes, bool], list[tuple[str, str, str, bytes]] | None] | None:
    """``files(data, decode_raw)`` of ``_example.c``: each feature of the Example ``data`` as
    (key, kind, suffix, bytes), the one file ``render`` shows it as, or None where this module
    must decide (an unusual encoding, a ``.list`` folder, a raw pixel array); None where it was
    not built, or with ``TFRFS_PURE=1``."""
    compiled = optional("tfrfs.format._example")
    return None if compiled is None else compiled.files


def compiled_values() -> Callable[[bytes], dict | None] | None:
    """``values(data)`` of ``_example.c``: the Example ``data`` as ``plain_values`` gives it, or
    None where protobuf must decide (an unusual encoding); None where it was not built, or with
    ``TFRFS_PURE=1``."""
    compiled = optional("tfrfs.format._example")
    return None if compiled is None else compiled.values


# --------------------------------------------------------------------------------------------
# Parse (SPEC 7)


@dataclass(frozen=True)
class _FloatText:
    """A JSON number written with '.', an exponent, or NaN/Infinity: the mark of a float."""

    text: str


_NON_FINITE = frozenset(("NaN", "Infinity", "-Infinity"))


def _load_json(data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Invalid(f"a .json file must be UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if text.startswith("\ufeff"):  # some editors save a byte order mark; it carries nothing
        text = text[1:]
    if not text.strip():
        raise Invalid("the .json file is empty; write a JSON array such as [1, 2] or []")
    try:
        # parse_float/parse_constant keep how a number was written: that decides the kind.
        return json.loads(text, parse_float=_FloatText, parse_constant=_FloatText)
    except RecursionError:
        raise Invalid("the JSON is nested too deeply") from None
    except ValueError as exc:
        raise Invalid(f"not valid JSON: {exc}") from None


def _describe(x: Any) -> str:
    if x is True or x is False:
        return "the boolean " + ("true" if x else "false")
    if x is None:
        return "null"
    if isinstance(x, _FloatText):
        return x.text
    if isinstance(x, int):
        text = str(x) if abs(x) < 10 ** 30 else f"{str(x)[:20]}..."
        return text
    if isinstance(x, str):
        return json.dumps(x if len(x) <= 30 else x[:30] + "...", ensure_ascii=False)
    if isinstance(x, list):
        return "an array"
    if isinstance(x, dict):
        return "an object"
    return repr(x)


def _where(i: int, n: int) -> str:
    return "" if n == 1 else f" at position {i}"


def _ints(items: Sequence[Any]) -> tuple:
    n = len(items)
    for i, x in enumerate(items):
        if type(x) is not int:  # bool is a subclass of int: excluded by the exact type test
            raise Invalid(f"{_describe(x)}{_where(i, n)} is not an integer; "
                          "this feature holds int64_list, e.g. [1, 2]")
        if not _INT64_MIN <= x <= _INT64_MAX:
            raise Invalid(f"{_describe(x)}{_where(i, n)} is outside the int64 range")
    return tuple(items)


def _floats(items: Sequence[Any]) -> tuple:
    n = len(items)
    out = []
    for i, x in enumerate(items):
        if isinstance(x, _FloatText):
            v = float(x.text)
            if math.isinf(v) and x.text not in _NON_FINITE:
                raise Invalid(f"{x.text}{_where(i, n)} is too large for float32")
        elif type(x) is int:
            try:
                v = float(x)
            except OverflowError:
                raise Invalid(f"{_describe(x)}{_where(i, n)} is too large for float32") from None
        else:
            raise Invalid(f"{_describe(x)}{_where(i, n)} is not a number; "
                          "this feature holds float_list, e.g. [0.5, 1.0]")
        out.append(v)
    return _as_float32(out, items)


def _as_float32(values: list[float], shown: Sequence[Any]) -> tuple:
    """``values`` rounded to float32; one that float32 has no value for is refused (named as
    ``shown`` gives it) rather than stored as an infinity it never was."""
    if not values:
        return ()
    fmt = f"<{len(values)}f"
    try:
        return struct.unpack(fmt, struct.pack(fmt, *values))
    except OverflowError:
        for i, v in enumerate(values):
            try:
                _F32.pack(v)
            except OverflowError:
                raise Invalid(f"{_describe(shown[i])}{_where(i, len(values))} is too large for float32 "
                              "(largest: 3.4028235e+38)") from None
        raise


def _bytes(items: Sequence[Any]) -> tuple:
    n = len(items)
    out = []
    for i, x in enumerate(items):
        if not isinstance(x, str):
            raise Invalid(f"{_describe(x)}{_where(i, n)} is not a string; "
                          'this feature holds bytes_list, e.g. ["cat", "dog"]')
        try:
            out.append(x.encode("utf-8"))
        except UnicodeEncodeError:
            raise Invalid(f"string{_where(i, n)} holds a lone surrogate escape and is not UTF-8") from None
    return tuple(out)


_CONVERT: dict[str, Callable[[Sequence[Any]], tuple]] = {
    "int64_list": _ints,
    "float_list": _floats,
    "bytes_list": _bytes,
}


def _json_item(x: Any, i: int, n: int) -> str:
    """The sort of one item of a ``.json`` array for ``_infer_kind``."""
    if isinstance(x, _FloatText):
        return "float"
    if type(x) is int:
        return "int"
    if isinstance(x, str):
        return "text"
    raise Invalid(f"{_describe(x)}{_where(i, n)} cannot be a feature value; "
                  'write numbers or strings, e.g. [1, 2] or ["a"]')


def _infer_kind(items: Sequence[Any], sort: Callable[[Any, int, int], str] = _json_item) -> str:
    """SPEC 7, for a key new to the dataset: integers, any float, strings (or nothing)."""
    n = len(items)
    seen = {sort(x, i, n) for i, x in enumerate(items)}
    if "text" in seen and len(seen) > 1:
        raise Invalid("the list mixes strings and numbers; a feature holds one kind")
    if "float" in seen:
        return "float_list"
    if "int" in seen:
        return "int64_list"
    return "bytes_list"  # strings, or [] (what an empty list is at commit when no other value came)


def _items(obj: Any) -> list[Any]:
    if isinstance(obj, list):
        return obj
    if isinstance(obj, dict):
        raise Invalid("a .json feature file holds a JSON array (or one scalar), not an object")
    return [obj]  # a bare scalar means a one-value list


def parse(suffix: str, data: bytes, kind: str | None) -> Value:
    """The Value a feature file of ``suffix`` holding ``data`` stands for (SPEC 7).

    ``kind`` is the dataset's kind for the key (kept), or None for a key new to the dataset
    (inferred). A key of kind ``none`` holds no values to keep, so content decides its kind as
    for a new key: otherwise a Feature with no kind (as TFX writes) could never be filled in.
    Raises ``errors.Invalid`` when the content does not fit.
    """
    if suffix != ".json":
        if suffix not in SUFFIXES:
            raise Invalid(f"{suffix!r} is not a feature file suffix; use one of "
                          + " ".join(sorted(SUFFIXES)))
        if kind in ("int64_list", "float_list"):
            raise Invalid(f"this key holds {kind}: write it as a .json array, not a {suffix} file")
        return Value("bytes_list", (bytes(data),))
    obj = _load_json(data)
    if obj is None:
        if kind is None or kind == "none":
            return Value("none", ())
        raise Invalid(f"null is only for a feature with no kind; this key holds {kind}")
    items = _items(obj)
    if kind is None or kind == "none":
        kind = _infer_kind(items)
    return Value(kind, _CONVERT[kind](items))


def text_as_written(content: bytes, keep_newline: bool) -> bytes:
    """The value a ``KEY.txt`` written with ``content`` stores (SPEC 7 "Text").

    ``echo`` and most editors end what they write with one newline that the user did not mean
    as part of a label: unless ``keep_newline`` (the value replaced ends in one, or for a new
    feature a value of the key in the dataset does), that one newline is dropped. Two newlines
    at the end, or none, are kept exactly as written.
    """
    if keep_newline or not content.endswith(b"\n") or content.endswith(b"\n\n"):
        return content
    return content[:-1]


def parse_list(items: Sequence[tuple[str, bytes]]) -> Value:
    """The bytes_list a ``KEY.list/`` folder holds: its files' bytes, in name order.

    Every single-value row of SPEC 3.2 shows the stored bytes unchanged, so each file's bytes
    are its value whatever its suffix (a ``.json`` put there by hand is taken as bytes too).
    """
    for suffix, _ in items:
        if suffix not in SUFFIXES:
            raise Invalid(f"{suffix!r} is not a feature file suffix")
    return Value("bytes_list", tuple(bytes(data) for _, data in items))


def parse_feature_list(data: bytes, kind: str | None) -> tuple[Value, ...]:
    """The steps a feature list's ``KEY.json`` holds: an array of per-step arrays (SPEC 4).

    ``kind`` is the dataset's kind of the list's steps, or None to infer it (as for ``parse``;
    a list whose steps are all empty comes back as bytes_list). A ``KEY.steps/`` folder is read
    step by step with ``parse`` and ``parse_list``.
    """
    obj = _load_json(data)
    if not isinstance(obj, list):
        raise Invalid("a feature list .json holds an array of per-step arrays, e.g. [[1, 2], [3]]")
    for i, step in enumerate(obj):
        if not isinstance(step, list):
            raise Invalid(f"step {i} is {_describe(step)}, not an array; "
                          "write one array per step, e.g. [[1, 2], [3]]")
    if kind is None or kind == "none":
        kind = _infer_kind([x for step in obj for x in step])
    convert = _CONVERT[kind]
    return tuple(Value(kind, convert(step)) for step in obj)
