"""Which path a test of a compiled part (tfrfs/fuse/_answer.c, tfrfs/format/_floats.c,
tfrfs/format/_example.c, tfrfs/format/_records.c) runs on: the compiled one where it was built,
else the test module is skipped; scripts/test sets TFRFS_REQUIRE_COMPILED, and there a part that
was not built fails the module instead (a machine with a compiler must test what it built). Under TFRFS_PURE=1 the
compiled path is off, and such modules skip."""

from __future__ import annotations

import os
from typing import TypeVar

import pytest

T = TypeVar("T")


def compiled_or_skip(found: T | None, module: str) -> T:
    """``found`` (what ``module`` gives, None where it was not built or is turned off), or the
    calling test module skipped (an ImportError under TFRFS_REQUIRE_COMPILED)."""
    if found is not None:
        return found
    if os.environ.get("TFRFS_PURE"):
        pytest.skip("TFRFS_PURE=1: the compiled path is off", allow_module_level=True)
    if os.environ.get("TFRFS_REQUIRE_COMPILED"):
        raise ImportError(f"{module} was not built (TFRFS_REQUIRE_COMPILED is set)")
    pytest.skip(f"{module} was not built (no compiler here): the Python path runs", allow_module_level=True)
