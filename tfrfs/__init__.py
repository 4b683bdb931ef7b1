"""tfrfs: mount TFRecord datasets as folders of records and feature files.

As a library (SPEC 9): ``tfrfs.open(SOURCE)`` gives a read-only ``Dataset`` and
``tfrfs.ray.read(SOURCE)`` a Ray Data dataset. Both are loaded when first used, so
``import tfrfs`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

from tfrfs.errors import DamagedRecord, DataLoss, TfrfsError, UsageError

__version__ = "0.1.0"

_LAZY = {"open": ("library", "open"), "Dataset": ("library", "Dataset"), "Shard": ("library", "Shard")}

__all__ = ["open", "Dataset", "Shard", "DamagedRecord", "DataLoss", "TfrfsError", "UsageError"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f".{module}", __name__), attr)
    if name == "ray":   # ``tfrfs.ray.read`` after a plain ``import tfrfs``
        return importlib.import_module(".ray", __name__)
    raise AttributeError(f"module 'tfrfs' has no attribute {name!r}")
