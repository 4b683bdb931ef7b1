"""Placeholder: replaced by the module that implements it."""

from __future__ import annotations

from typing import Any


def write(dataset: Any, dest: str, *, shards: int | None = None, compression: str = "none", **options: Any) -> Any:
    raise NotImplementedError
