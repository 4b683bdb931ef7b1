"""The compiled float32 texts (tfrfs/format/_floats.c) against the Python reference (jsontext).

Both paths write every float: the compiled one where it was built, the Python one elsewhere
and with TFRFS_PURE=1. They must give the same bytes for every float32, so a dataset shows the
same files whichever machine mounts it. Skipped where the extension was not built, unless
TFRFS_REQUIRE_COMPILED is set (scripts/test sets it)."""

from __future__ import annotations

import math
import os
import random
import struct
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.compiled import compiled_or_skip
from tfrfs.format import jsontext

compiled = compiled_or_skip(jsontext.compiled_floats(), "tfrfs.format._floats")


def from_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b))[0]


def edge_patterns() -> list[int]:
    """Bit patterns where the search takes its rarer turns: powers of two (the asymmetric
    interval) and their neighbours, subnormals, the largest finite values, integers around 2**24."""
    out = []
    for e in range(0, 255):
        for m in (0, 1, 2, 0x7FFFFF, 0x400000, 0x7FFFFE):
            out += [(e << 23) | m, (1 << 31) | (e << 23) | m]
    out += list(range(0, 4096)) + [0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000]
    out += [struct.unpack("<I", struct.pack("<f", float(i)))[0] for i in range(16777200, 16777240)]
    return out


def test_the_known_texts() -> None:
    cases = [(0.0, "0.0"), (-0.0, "-0.0"), (1.0, "1.0"), (-2.5, "-2.5"), (from_bits(0x3DCCCCCD), "0.1"),
             (from_bits(0x7F7FFFFF), "3.4028235e+38"), (from_bits(1), "1e-45"), (2.0 ** -126, "1.1754944e-38"),
             (16777216.0, "16777216.0"), (1e39, "Infinity"), (-1e39, "-Infinity"), (math.inf, "Infinity"),
             (math.nan, "NaN"), (0.1, "0.1"), (1 / 3, "0.33333334")]
    for x, text in cases:
        assert compiled.format_float32(x) == text == jsontext.py_format_float32(x), x


def test_the_same_text_at_every_edge() -> None:
    for b in edge_patterns():
        x = from_bits(b)
        assert compiled.format_float32(x) == jsontext.py_format_float32(x), hex(b)


def test_the_same_text_for_random_floats_and_doubles() -> None:
    rnd = random.Random(11)
    for _ in range(20000):
        x = from_bits(rnd.getrandbits(32))
        assert compiled.format_float32(x) == jsontext.py_format_float32(x), x
        d = rnd.uniform(-1e6, 1e6) * 10.0 ** rnd.randint(-45, 33)   # a double, rounded on the way
        assert compiled.format_float32(d) == jsontext.py_format_float32(d), d


@settings(max_examples=2000, deadline=None)
@given(st.integers(0, 2 ** 32 - 1))
def test_the_same_text_for_any_float32(b: int) -> None:
    x = from_bits(b)
    assert compiled.format_float32(x) == jsontext.py_format_float32(x)


@given(st.lists(st.floats(width=32), max_size=40))
def test_a_list_is_written_as_the_reference_writes_it(values: list[float]) -> None:
    assert compiled.json_floats(values) == jsontext.py_json_floats(values)
    assert compiled.json_floats(tuple(values)) == jsontext.py_json_floats(values)


def test_a_list_of_what_is_not_a_number_is_refused() -> None:
    assert compiled.json_floats([]) == "[]"
    with pytest.raises(TypeError):
        compiled.json_floats([1.0, "2"])
    with pytest.raises(TypeError):
        compiled.json_floats(3.0)


def test_the_pure_path_writes_in_python() -> None:
    code = "from tfrfs.format import jsontext as j; print(j.format_float32 is j.py_format_float32)"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TFRFS_PURE": "1"},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
    assert jsontext.format_float32 is compiled.format_float32
