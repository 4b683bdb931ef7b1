"""Remote sources (SPEC 1.1): ``s3://``, ``gs://`` and ``http(s)://`` URLs, read through fsspec.

This module knows the stores: which URL is remote, the fsspec file system behind it (credentials
and endpoints found as the store's own tools find them, plus ``-o`` store options), what an
object's size, identity and time are, how a request is retried, and how a failure reads in one
line naming the URL, and how a prefix, a glob or one object is listed (``list_source``; the
``Discovery`` made of it is ``index.storage_discovery``'s). Reading shards through the block cache is
``readers.remote``'s work.
"""

from __future__ import annotations

import datetime as _dt
import email.utils
import hashlib
import logging
import os
import posixpath
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from tfrfs.errors import Unreachable, UsageError
# What a listing says and how a failure reads are the storage seam's own (tfrfs.storage.base).
from tfrfs.storage.base import Listing as Listing, ObjectInfo as ObjectInfo, describe as describe

log = logging.getLogger("tfrfs")

# URL scheme → (fsspec protocol, the extra that installs it)
SCHEMES = {"s3": ("s3", "s3"), "s3a": ("s3", "s3"), "gs": ("gcs", "gcs"), "gcs": ("gcs", "gcs"),
           "http": ("http", "remote"), "https": ("https", "remote")}
PACKAGES = {"s3": "s3fs", "gcs": "gcsfs", "http": "aiohttp", "https": "aiohttp"}
# Schemes fsspec reaches without a package of its own and that no user names as a remote SOURCE:
# a local folder as ``file://`` and fsspec's in-memory store (how the shared storage tests and
# the remote tests reach a third storage through the same code a bucket goes through).
BUILTIN_SCHEMES = {"file": ("file", ""), "memory": ("memory", "")}
GLOB_CHARS = "*?["
SNIFF_WORKERS = 32
# tfrfs's own options in -o form that are not the store's
OWN_OPTIONS = ("retries", "timeout")
DEFAULT_RETRIES = 4          # attempts of one request before it counts as failed
DEFAULT_TIMEOUT_S = 30.0     # for one request
PART_BYTES = 8 << 20        # of an upload: a smaller object goes in one request, held whole
PARTS_AT_ONCE = 8           # parts of one upload sent at a time

T = TypeVar("T")


class NoRanges(OSError):
    """The server sent a whole object for a ranged request: retrying cannot help."""


def is_url(source: str) -> bool:
    """``factory.is_url``, the one answer (kept under this name for who imported it here)."""
    from tfrfs.storage.factory import is_url as factory_is_url
    return factory_is_url(source)


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """``-o key=value[,key=value]`` values as keyword arguments: true/false, integers and numbers
    become what they say; the rest stays text. Raises UsageError."""
    out: dict[str, Any] = {}
    for group in pairs:
        for item in filter(None, (p.strip() for p in group.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise UsageError(f"-o {item}: expected KEY=VALUE")
            out[key.strip()] = _typed(value.strip())
    return out


def _typed(value: str) -> Any:
    low = value.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    for conv in (int, float):
        try:
            return conv(value)
        except ValueError:
            pass
    return value


def _final(exc: BaseException) -> bool:
    """Whether retrying cannot help: the object is missing, access is denied, no credentials."""
    return (isinstance(exc, (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
                             NotADirectoryError, NoRanges))
            or "Credentials" in type(exc).__name__)


class Store:
    """One remote file system for one source: the fsspec object, retries and request counts."""

    def __init__(self, url: str, options: dict[str, Any] | None = None) -> None:
        options = dict(options or {})
        self.options = dict(options)   # as given: what a job in another process opens the store with
        self.url = url.rstrip("/") if not url.endswith("://") else url
        scheme = url.partition("://")[0].lower()
        self.protocol = (SCHEMES.get(scheme) or BUILTIN_SCHEMES[scheme])[0]
        self.retries = max(1, int(options.pop("retries", DEFAULT_RETRIES)))
        self.timeout = float(options.pop("timeout", DEFAULT_TIMEOUT_S))
        self.fs = _filesystem(self.protocol, scheme, options, self.timeout)
        self.requests = 0
        self.fetched = 0
        self._lock = threading.Lock()

    # -- paths ------------------------------------------------------------------

    def path_of(self, url: str) -> str:
        """The fsspec path of a URL (http keeps its URL)."""
        return self.fs._strip_protocol(url)

    def url_of(self, path: str) -> str:
        if self.protocol in ("http", "https"):
            return path
        return self.fs.unstrip_protocol(path)

    # -- requests ---------------------------------------------------------------

    def call(self, what: str, url: str, fn: Callable[[], T]) -> T:
        """``fn()``, retried with backoff. When retrying cannot help, the error as the store
        raised it if it is a file error (missing, forbidden: the caller tells what that means),
        else ``Unreachable`` naming ``url``; so too when every attempt failed."""
        delay = 0.1
        attempt = 1
        while True:
            with self._lock:
                self.requests += 1
            try:
                return fn()
            except OSError as exc:
                if _final(exc):
                    raise
                failure: Exception = exc
            except Exception as exc:  # noqa: BLE001 - every store raises its own types
                if _final(exc):   # no credentials
                    raise Unreachable(f"{url}: {what} failed: {describe(exc)}") from exc
                failure = exc
            if attempt >= self.retries:
                raise Unreachable(f"{url}: {what} failed after {attempt} attempt(s): {describe(failure)}") from failure
            log.info("%s %s failed (%s); retrying in %.1fs", what, url, describe(failure), delay)
            time.sleep(delay)
            delay = min(delay * 3, 5.0)
            attempt += 1

    def read_range(self, url: str, start: int, end: int, *, exact: bool = True) -> bytes:
        """Bytes ``start``..``end`` of an object in one ranged request (retried); ``exact=False``:
        fewer past the object's end."""
        path = self.path_of(url)
        started = time.monotonic()

        def get() -> bytes:
            data = self.fs.cat_file(path, start=start, end=end, timeout=self.timeout)
            if len(data) > end - start:
                raise NoRanges(f"the server does not answer ranged requests: asked for {end - start} bytes "
                               f"at {start}, it sent {len(data)}")
            if len(data) != end - start and exact:
                raise OSError(f"asked for {end - start} bytes at {start}, got {len(data)}")
            return bytes(data)
        data = self.read_call(url, get)
        with self._lock:
            self.fetched += len(data)
        log.debug("GET %s bytes=%d-%d (%.1f ms)", url, start, end - 1, (time.monotonic() - started) * 1e3)
        return data

    def note_fetched(self, data: bytes) -> bytes:
        """``data`` fetched by a request made through ``call``: counted for ``stats``."""
        with self._lock:
            self.fetched += len(data)
        return data

    def read_call(self, url: str, fn: Callable[[], T]) -> T:
        """``call`` for a read while mounted: an object that went missing or became forbidden
        since it was listed is a failed read (``Unreachable``, EIO), not a missing file."""
        try:
            return self.call("read", url, fn)
        except (FileNotFoundError, PermissionError, NoRanges) as exc:
            raise Unreachable(f"{url}: read failed: {describe(exc)}") from exc

    def read_head(self, url: str, size: int) -> bytes:
        """The first ``size`` bytes of an object in one ranged request (a shorter object, or a
        server that sends it whole, gives what there is, cut at ``size``)."""
        path = self.path_of(url)
        return bytes(self.read_call(url, lambda: self.fs.cat_file(path, start=0, end=size,
                                                                   timeout=self.timeout)))[:size]

    def write_all(self, url: str, data: bytes) -> None:
        path = self.path_of(url)
        self.call("write", url, lambda: self.fs.pipe_file(path, data))

    def put_file(self, url: str, local: str) -> None:
        """Upload a local file as the object ``url``, streamed in parts (a bucket shows a
        multipart upload only once it is complete: the object appears whole or not at all)."""
        path = self.path_of(url)
        kw: dict[str, Any] = {"chunksize": PART_BYTES, "max_concurrency": PARTS_AT_ONCE} if self.protocol == "s3" else {}
        self.call("write", url, lambda: self.fs.put_file(local, path, **kw))

    def copy(self, src: str, dst: str) -> None:
        """A server-side copy of one object over another (none of its bytes pass through here);
        the copy replaces ``dst`` whole. On S3 a multipart object keeps its ETag."""
        kw: dict[str, Any] = {"preserve_etag": True} if self.protocol == "s3" else {}
        self.fs.invalidate_cache(self.path_of(src))   # it may be newer than a listing held here
        self.call("copy", dst, lambda: self.fs.cp_file(self.path_of(src), self.path_of(dst), **kw))

    def delete(self, url: str) -> None:
        """Delete an object; one that is not there is no error."""
        try:
            self.call("delete", url, lambda: self.fs.rm_file(self.path_of(url)))
        except FileNotFoundError:
            pass

    def info(self, url: str, *, fresh: bool = False) -> dict[str, Any]:
        """The object's look-up; ``fresh``: asked of the store, not taken from a listing this
        file system holds (an object written since, by this process or another)."""
        path = self.path_of(url)
        if fresh:
            self.fs.invalidate_cache(path)
        return self.call("look-up", url, lambda: self.fs.info(path, timeout=self.timeout))

    def open_stream(self, url: str) -> Any:
        """A sequential binary reader of the whole object (for decompressing a GZIP/ZLIB shard)."""
        path = self.path_of(url)
        return self.read_call(url, lambda: self.fs.open(path, "rb", block_size=8 << 20, cache_type="readahead"))

    def stats(self) -> str:
        with self._lock:
            return f"{self.requests:,} requests, {self.fetched / 2**20:,.1f} MiB fetched"


def _filesystem(protocol: str, scheme: str, options: dict[str, Any], timeout: float) -> Any:
    try:
        import fsspec
        fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        extra = (SCHEMES.get(scheme) or BUILTIN_SCHEMES[scheme])[1]
        raise UsageError(f"reading {scheme}:// URLs needs {PACKAGES[protocol]}: pip install 'tfrfs[{extra}]' "
                         f"({exc})") from exc
    except ValueError as exc:
        raise UsageError(f"{scheme}:// URLs are not supported here: {exc}") from exc
    kwargs: dict[str, Any] = {"skip_instance_cache": True}
    if protocol == "s3":
        config = dict(options.pop("config_kwargs", {}) or {})
        config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        config.setdefault("connect_timeout", min(timeout, 10.0))
        config.setdefault("read_timeout", timeout)
        config.setdefault("max_pool_connections", 32)   # as many as requests in flight (sniffing, read-ahead)
        kwargs["config_kwargs"] = config
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint and "endpoint_url" not in options:
            kwargs["endpoint_url"] = endpoint
    kwargs.update(options)
    try:
        fs = fsspec.filesystem(protocol, **kwargs)
        if protocol in ("s3", "gcs") and hasattr(fs, "retries"):
            fs.retries = 1   # tfrfs retries itself (Store.call): one attempt each at the lower layers
        return fs
    except TypeError as exc:
        raise UsageError(f"bad store option for {scheme}://: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - credentials and configuration errors of each store
        raise UsageError(f"cannot reach {scheme}:// store: {describe(exc)}") from exc


# --- objects -------------------------------------------------------------------

def object_info(store: Store, entry: dict[str, Any]) -> ObjectInfo:
    """What a listing (or look-up) entry says about one object."""
    name = entry.get("name") or entry.get("url") or ""
    size = int(entry.get("size") or 0)
    mtime_ns = _mtime_ns(entry)
    ident = None
    for key in ("generation", "ETag", "etag", "VersionId"):
        value = entry.get(key)
        if value:
            ident = f"{key.lower()}:{str(value).strip(chr(34))}"
            break
    if ident is None:
        ident = f"mtime:{mtime_ns}"
    return ObjectInfo(store.url_of(name), size, f"{ident}:{size}", mtime_ns)


def _mtime_ns(entry: dict[str, Any]) -> int:
    for key in ("LastModified", "last_modified", "updated", "mtime", "Last-Modified", "created"):
        value = entry.get(key)
        if value is None:
            continue
        try:
            if isinstance(value, _dt.datetime):
                when = value
            elif isinstance(value, (int, float)):
                return int(value * 1e9)
            elif key == "Last-Modified":
                when = email.utils.parsedate_to_datetime(str(value))
            else:
                when = _dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
            if when.tzinfo is None:
                when = when.replace(tzinfo=_dt.timezone.utc)
            return int(when.timestamp() * 1e9)
        except (ValueError, TypeError, OverflowError):
            continue
    return 0


def cache_key(url: str, identity: str = "") -> str:
    return hashlib.sha256(f"{url}\0{identity}".encode("utf-8", "surrogateescape")).hexdigest()[:32]


def list_source(store: Store, url: str) -> Listing:
    """List a URL source: one object, a prefix (recursively) or a glob. Raises UsageError."""
    try:
        return _list(store, url)
    except UsageError:
        raise
    except Unreachable as exc:
        raise UsageError(str(exc)) from exc
    except FileNotFoundError as exc:
        raise UsageError(f"{url}: no such bucket, object or prefix") from exc
    except PermissionError as exc:
        raise UsageError(f"{url}: access denied (check the credentials)") from exc
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"{url}: {describe(exc)}") from exc


def _list(store: Store, url: str) -> Listing:
    scheme_len = len(url.partition("://")[0]) + 3
    if any(ch in url[scheme_len:] for ch in GLOB_CHARS):
        globbed = store.call("list", url, lambda: store.fs.glob(store.path_of(url), detail=True))
        matched = sorted((store.url_of(name), e) for name, e in globbed.items() if e.get("type") != "directory")
        if not matched:
            raise UsageError(f"no object matches {url!r}")
        shown: list[tuple[str, ObjectInfo]] = []
        seen: set[str] = set()
        for u, e in matched:
            name = base = posixpath.basename(u)
            n = 2
            while name in seen:   # two matches of one name from different folders
                name = f"{base}~{n}"
                n += 1
            seen.add(name)
            shown.append((name, object_info(store, e)))
        if store.protocol in ("http", "https"):
            shown = _with_sizes(store, shown)   # an HTTP listing is links only: sizes come from HEAD
        return Listing(posixpath.dirname(matched[0][0]), tuple(shown), ("",), False)
    http = store.protocol in ("http", "https")
    is_dir = url.endswith("/")
    found: dict[str, Any] | None = None
    if not is_dir and not http:
        # A bucket lists a prefix in one request: list first, look the object up only if nothing
        # is under it (a single-object SOURCE).
        path = store.path_of(url).rstrip("/")
        found = store.call("list", url, lambda: store.fs.find(path, detail=True, withdirs=True))
        is_dir = any(name.startswith(path + "/") for name in found)
    if not is_dir:
        try:
            info = store.info(url)
        except FileNotFoundError:
            if http:
                raise
            info = {"type": "directory"}
        is_dir = info.get("type") == "directory" or (http and str(info.get("mimetype", "")).startswith("text/html"))
        if not is_dir:
            if info.get("size") is None:
                raise UsageError(f"{url}: the server does not say the object's size")
            obj = object_info(store, {**info, "name": info.get("name", store.path_of(url))})
            obj = ObjectInfo(url, obj.size, obj.identity, obj.mtime_ns)
            return Listing(posixpath.dirname(url), ((posixpath.basename(url), obj),), ("",), True)
    root = url.rstrip("/")
    if found is None:
        base = store.path_of(root if not http else root + "/")
        found = store.call("list", url, lambda: store.fs.find(base, detail=True, withdirs=True))
    prefix = store.path_of(root).rstrip("/") + "/"
    files: list[tuple[str, ObjectInfo]] = []
    dirs: set[str] = {""}
    for name, entry in found.items():
        rel = name[len(prefix):] if name.startswith(prefix) else None
        if not rel:
            continue
        rel = rel.rstrip("/")
        if http:
            rel = urllib.parse.unquote(rel)   # links are url-quoted; the mount shows names
        parts = rel.split("/")
        if any(p in (".tfrfs-staging",) for p in parts[:-1]) or parts[0] == ".tfrfs-staging":
            continue
        for i in range(1, len(parts)):
            dirs.add("/".join(parts[:i]))
        if entry.get("type") == "directory":
            dirs.add(rel)
        else:
            files.append((rel, object_info(store, entry)))
    if not files:
        raise UsageError(f"{url}: no such bucket, object or prefix, or nothing in it")
    if any(entry.size == 0 and http for _, entry in files):
        files = _with_sizes(store, files)   # an HTTP listing is links only: sizes come from HEAD
    files.sort()
    return Listing(root, tuple(files), tuple(sorted(dirs)), False)


def _with_sizes(store: Store, files: list[tuple[str, ObjectInfo]]) -> list[tuple[str, ObjectInfo]]:
    def one(item: tuple[str, ObjectInfo]) -> tuple[str, ObjectInfo]:
        rel, obj = item
        info = store.info(obj.url)
        got = object_info(store, {**info, "name": obj.url})
        return rel, ObjectInfo(obj.url, got.size, got.identity, got.mtime_ns)
    with ThreadPoolExecutor(min(SNIFF_WORKERS, len(files))) as pool:
        return list(pool.map(one, files))
