"""What a source folder holds on disk, to compare before and after."""

from __future__ import annotations

import os
from pathlib import Path

from tfrfs.index import STAGING_DIR


def disk_files(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` outside the staging folder, by relative path."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != STAGING_DIR]
        for name in filenames:
            full = Path(dirpath) / name
            out[str(full.relative_to(root))] = full.read_bytes()
    return out
