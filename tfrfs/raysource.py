"""Placeholder: replaced by the module that implements it."""

from __future__ import annotations

from typing import Any


def read(source: str, *, records: str = "raw", override_num_blocks: int | None = None, **options: Any) -> Any:
    raise NotImplementedError
