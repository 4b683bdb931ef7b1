"""Canonical JSON text (SPEC 3.2): float32 values as their shortest decimal, ``json.dumps`` layout.

The same dataset always shows the same bytes, and every float written reads back to the very
float32 it came from, with a ``.`` or an exponent so a JSON file copied out and back in keeps its
kind. This sits on a FUSE hot path (every numeric feature a user opens), so the common cases
(integral values, repeated values) take shortcuts, and where the compiled part was built
(``_floats.c``: the same search, with the same formatting and parsing) ``format_float32`` and
``json_floats`` are its functions; ``TFRFS_PURE=1`` keeps them in Python.
"""

from __future__ import annotations

import math
import struct
from json.encoder import encode_basestring  # the C escaper json.dumps uses, without ASCII escaping
from typing import Any, Callable, Sequence

from tfrfs.format.compiled import optional


_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")
_E_FORMATS = tuple(f"%.{p}e" for p in range(9))  # 1 .. 9 significant digits; 9 always suffices
_TWO_24 = float(1 << 24)
_F32_MIN_NORMAL = 2.0 ** -126
_SMALLEST_ASYMMETRIC = 2.0 ** -125  # from here up, a power of two has a closer neighbour below


def _to_f32(x: float) -> float:
    return _F32.unpack(_F32.pack(x))[0]


def _next_decimal_up(text: str, precision: int) -> str:
    """The decimal one unit in the last place above ``text`` (``'%.{precision}e'`` output)."""
    mantissa, exponent = text.split("e")
    digits = int(mantissa.replace(".", "")) + 1
    return f"{digits}e{int(exponent) - precision}"


def _shortest_f32(a: float) -> str:
    """Shortest decimal reading back to the positive finite float32 ``a`` (nearest among ties)."""
    bits = _U32.unpack(_F32.pack(a))[0]
    # At a power of two the gap below is half the gap above, so the nearest p-digit decimal may
    # miss while the next one up still reads back: only then is a second candidate needed.
    asymmetric = bits & 0x7FFFFF == 0 and a >= _SMALLEST_ASYMMETRIC

    def fits(p: int) -> str | None:
        text = _E_FORMATS[p] % a
        candidates = (text, _next_decimal_up(text, p)) if asymmetric else (text,)
        for cand in candidates:
            try:
                if _to_f32(float(cand)) == a:
                    return cand
            except OverflowError:  # rounds past the largest float32
                pass
        return None

    if a >= _F32_MIN_NORMAL:
        # Six-digit decimals lie further apart (>= 1e-6 relative) than a normal float32's rounding
        # interval is wide (<= 1.2e-7 relative), so at most one is inside it: when the nearest
        # six-digit decimal reads back, every shorter one that reads back is that same number
        # (repr drops its trailing zeros). Otherwise the answer has 7, 8 or 9 digits.
        six = fits(5)
        if six is not None:
            return six
        eight = fits(7)
        if eight is None:
            nine = fits(8)
            assert nine is not None
            return nine
        return fits(6) or eight
    found = fits(0)  # subnormals: wide intervals; round numbers (1e-45) are common
    if found is not None:
        return found
    # "Some p-digit decimal reads back" only grows with p (a p-digit decimal is also a
    # (p+1)-digit one), so the shortest precision can be found by bisection.
    lo, hi, best = 1, 8, None
    while lo < hi:
        mid = (lo + hi) // 2
        got = fits(mid)
        if got is None:
            lo = mid + 1
        else:
            hi, best = mid, got
    if best is None:  # nothing up to 8 digits: the 9-digit nearest always reads back
        best = fits(8)
    assert best is not None
    return best


def py_format_float32(x: float) -> str:
    """The shortest decimal that reads back to the same float32, written as Python writes floats.

    ``1.0``, ``0.1``, ``1e-30``, ``3.4028235e+38``, ``-0.0``; non-finite values as JSON's
    ``NaN``, ``Infinity`` and ``-Infinity``. ``x`` is rounded to float32 first.
    """
    if x != x:
        return "NaN"
    # Integers below 2**24 are exact in float32 and no shorter decimal lies within half a unit
    # of them, so Python's own repr already is the answer (labels stored as floats hit this).
    if -_TWO_24 < x < _TWO_24 and x.is_integer():
        return repr(x)
    try:
        f = _to_f32(x)
    except OverflowError:
        f = math.copysign(math.inf, x)
    if math.isinf(f):
        return "Infinity" if f > 0 else "-Infinity"
    # Datasets repeat values (box corners on a pixel grid, scores): remember recent answers.
    # Zeros never get here, so -0.0 and 0.0 (equal as keys) cannot mix.
    text = _FLOAT_TEXT.get(f)
    if text is None:
        text = "-" + repr(float(_shortest_f32(-f))) if f < 0 else repr(float(_shortest_f32(f)))
        if len(_FLOAT_TEXT) >= _FLOAT_TEXT_MAX:
            _FLOAT_TEXT.clear()
        _FLOAT_TEXT[f] = text
    return text


_FLOAT_TEXT: dict[float, str] = {}
_FLOAT_TEXT_MAX = 1 << 16


def py_json_floats(values: Sequence[float]) -> str:
    """``[v, v, ...]``: each value as ``format_float32`` writes it, ``json.dumps`` layout."""
    return "[" + ", ".join(map(py_format_float32, values)) + "]"


def compiled_floats() -> Any | None:
    """The compiled ``format_float32`` and ``json_floats`` (``_floats.c``), or None where they
    were not built, or with ``TFRFS_PURE=1``."""
    return optional("tfrfs.format._floats")


_COMPILED = compiled_floats()
format_float32: Callable[[float], str] = _COMPILED.format_float32 if _COMPILED else py_format_float32
json_floats: Callable[[Sequence[float]], str] = _COMPILED.json_floats if _COMPILED else py_json_floats


def _encode_json(obj: Any) -> str:
    if isinstance(obj, str):
        return encode_basestring(obj)
    if obj is None:
        return "null"
    if obj is True:
        return "true"
    if obj is False:
        return "false"
    if isinstance(obj, int):
        return int.__repr__(obj)
    if isinstance(obj, float):
        return format_float32(obj)
    if isinstance(obj, (list, tuple)):
        return "[" + ", ".join(map(_encode_json, obj)) + "]"
    if isinstance(obj, dict):
        parts = []
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError(f"JSON object keys must be str, not {type(k).__name__}")
            parts.append(f"{encode_basestring(k)}: {_encode_json(v)}")
        return "{" + ", ".join(parts) + "}"
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def dumps_json(obj: Any) -> bytes:
    """Canonical JSON (SPEC 3.2): ``json.dumps`` layout, UTF-8 unescaped, float32 floats, newline."""
    return (_encode_json(obj) + "\n").encode("utf-8")
