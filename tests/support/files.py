"""Files on disk: what a source folder holds (to compare before and after), and a disk that fills up."""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from tfrfs.index.discovery import STAGING_DIR


def disk_files(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` outside the staging folder, by relative path."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != STAGING_DIR]
        for name in filenames:
            full = Path(dirpath) / name
            out[str(full.relative_to(root))] = full.read_bytes()
    return out


@contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A small tmpfs mounted at ``where`` (made if missing): a disk that fills up. Skips the test
    when it cannot be mounted."""
    where.mkdir(exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {proc.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)
