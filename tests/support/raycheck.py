"""Functions the cluster tests send to Ray workers (a test file is not importable there)."""

from __future__ import annotations

import sys
from typing import Any


def tensorflow_loaded(batch: Any) -> dict:
    """Whether TensorFlow is imported in the worker that handles ``batch`` (one row per batch)."""
    return {"tensorflow": ["tensorflow" in sys.modules], "rows": [len(batch["index"])]}
