"""The optional compiled parts (setup.py): ``tfrfs.fuse._answer``, ``tfrfs.format._floats``,
``tfrfs.format._example`` and ``tfrfs.format._records``. Each has a Python path with the same results; a part is used where it
was built, unless ``TFRFS_PURE=1`` keeps a process on the Python paths."""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def optional(module: str) -> ModuleType | None:
    """Compiled ``module``, or None where it was not built, or with ``TFRFS_PURE=1``."""
    if os.environ.get("TFRFS_PURE"):
        return None
    try:
        return importlib.import_module(module)
    except ImportError:
        return None
