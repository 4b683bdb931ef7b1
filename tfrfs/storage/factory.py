"""The one place that tells a URL from a local path and opens the storage behind it."""

from __future__ import annotations

import os
from typing import Any

from tfrfs.storage.base import Location, Storage
from tfrfs.storage.fsspec_store import BUILTIN_SCHEMES, SCHEMES


def is_url(source: str) -> bool:
    """Whether ``source`` is a URL that the fsspec storage reaches (a bucket, a web server, a
    local folder as ``file://``, fsspec's memory) rather than a local path."""
    scheme, sep, _ = source.partition("://")
    return bool(sep) and (scheme.lower() in SCHEMES or scheme.lower() in BUILTIN_SCHEMES)


def open_storage(url_or_path: str, options: dict[str, Any] | None = None) -> Storage:
    """The storage that holds ``url_or_path``: a store through fsspec for a URL (``s3://``,
    ``gs://``, ``http(s)://``, ``file://``, ``memory://``), else the local file system. Store
    options apply to URLs only (UsageError otherwise)."""
    if is_url(url_or_path):
        from tfrfs.storage.fsspec_storage import FsspecStorage
        return FsspecStorage(url_or_path, options)
    from tfrfs.storage.local_storage import LocalStorage
    return LocalStorage(options)


def chained_source(fo: str, protocol: str | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any] | None]:
    """SOURCE and its store options from what fsspec hands a filesystem chained before another
    (``tfrfs://...::s3://bucket/ds``): the inner path ``fo`` without its protocol, the protocol,
    its options. No protocol: ``fo`` as a user names SOURCE (a path or a URL). Raises UsageError
    for a protocol tfrfs does not read through."""
    from tfrfs.errors import UsageError
    if not protocol:
        return fo, options or None
    proto = protocol[0] if isinstance(protocol, (list, tuple)) else protocol
    proto = proto.lower()
    if proto in ("file", "local"):
        path = fo[len("file://"):] if fo.startswith("file://") else fo
        return path, None
    url = fo if fo.startswith(proto + "://") else f"{proto}://{fo}"
    if not is_url(url):
        known = ", ".join(sorted(set(SCHEMES) | set(BUILTIN_SCHEMES)))
        raise UsageError(f"{url}: tfrfs reads datasets through {known}, not {proto}://")
    return url, options or None


def locate(url_or_path: str, options: dict[str, Any] | None = None) -> Location:
    """A ``Location`` for a folder or prefix as a user names it: a local path made absolute, a
    URL without its trailing "/"."""
    if is_url(url_or_path):
        root = url_or_path.rstrip("/") if not url_or_path.endswith("://") else url_or_path
        return Location(root, tuple(sorted((options or {}).items())))
    open_storage(url_or_path, options)   # refuses store options for a local path
    return Location(os.path.abspath(url_or_path))
