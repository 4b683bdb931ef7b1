"""What the drivers of shard jobs (``jobs.verify``, ``jobs.repair``, ``jobs.bucketrepair``) read
of an opened SOURCE: typed here, below ``jobs``, so that ``jobs`` need not import the ``dataset``
layer that assembles one (``dataset.sources.Source`` is the one there is)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from tfrfs.index.discovery import Discovery
from tfrfs.storage.base import Storage
from tfrfs.storage.readers import Readers


class OpenedSource(Protocol):
    """An opened SOURCE: its name as given, its shards and files, how they are read and where
    they are stored, its cache folder."""

    @property
    def name(self) -> str: ...

    @property
    def discovery(self) -> Discovery: ...

    @property
    def readers(self) -> Readers: ...

    @property
    def cache_dir(self) -> Path: ...

    @property
    def storage(self) -> Storage: ...

    @property
    def local_root(self) -> str | None: ...
