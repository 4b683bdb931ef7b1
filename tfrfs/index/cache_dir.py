"""Where a dataset's indexes and a store's fetched blocks are kept unless told otherwise.

A module of its own, with nothing heavy imported: the commands that only look at a mount
(``umount``, ``status``, ``commit``) need it and nothing else of the index.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/tfrfs``, else ``~/.cache/tfrfs``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tfrfs"
