"""Fixtures for remote sources: real loopback servers from ``support.servers``.

The moto server and the proxy in front of it live for the whole session; each test gets them
clean (no buckets, no faults, no latency, an empty request log, the proxy listening). HTTP
servers are cheap and made per test for whatever folder the test names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

from support.gcs_server import GcsServer
from support.servers import FaultProxy, RangeHTTPServer, S3Server


def _fresh(proxy: FaultProxy) -> FaultProxy:
    proxy.up()
    proxy.clear_faults()
    proxy.latency = 0.0
    proxy.reset()
    return proxy


@pytest.fixture(scope="session")
def _s3_session() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture(scope="session")
def _s3_proxy_session(_s3_session: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(_s3_session.url) as proxy:
        yield proxy


@pytest.fixture
def s3_server(_s3_session: S3Server) -> S3Server:
    """moto's S3 on loopback, emptied before the test."""
    _s3_session.reset()
    return _s3_session


@pytest.fixture
def s3_proxy(request: pytest.FixtureRequest) -> FaultProxy:
    """A FaultProxy in front of ``s3_server``: no faults, no latency, empty log."""
    if _file_store():
        _no_bucket("the test looks at the requests sent")
    request.getfixturevalue("s3_server")
    return _fresh(request.getfixturevalue("_s3_proxy_session"))


@pytest.fixture(scope="session")
def _gcs_session() -> Iterator[GcsServer]:
    # (gcsfs and gcp-storage-emulator are in the remote and test extras, as s3fs and moto are: a
    # missing one is an error here, not a skip that would hide it)
    with GcsServer() as server:
        yield server


@pytest.fixture
def gcs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> GcsServer:
    """A loopback GCS (``support.gcs_server``): bucket ``data`` emptied, the gate's log and faults
    clear, and the environment that lets gcsfs in this process and its children reach it."""
    if _file_store():
        _no_bucket("a gs:// test")
    server: GcsServer = request.getfixturevalue("_gcs_session")
    server.wipe()
    assert server.gate is not None
    _fresh(server.gate)
    for key, value in server.environment().items():
        monkeypatch.setenv(key, value)
    return server


@pytest.fixture
def http_server() -> Iterator[Callable[[Path], RangeHTTPServer]]:
    """``http_server(folder) -> RangeHTTPServer`` serving that folder; all stopped at teardown."""
    started: list[RangeHTTPServer] = []

    def serve(root: Path) -> RangeHTTPServer:
        server = RangeHTTPServer(root)
        server.start()
        started.append(server)
        return server

    yield serve
    for server in reversed(started):
        server.stop()


@pytest.fixture
def http_proxy() -> Iterator[Callable[[RangeHTTPServer | str], FaultProxy]]:
    """``http_proxy(server_or_url) -> FaultProxy`` in front of it; all stopped at teardown."""
    started: list[FaultProxy] = []

    def front(upstream: RangeHTTPServer | str) -> FaultProxy:
        proxy = FaultProxy(upstream if isinstance(upstream, str) else upstream.url)
        proxy.start()
        started.append(proxy)
        return proxy

    yield front
    for proxy in reversed(started):
        proxy.stop()


# --- a bucket the daemon reaches through the proxy ------------------------------------------

class S3Rig:
    """One test's bucket on ``server``, reached by tfrfs subprocesses through ``proxy`` (their
    environment is set by the ``s3`` fixture), with the proxy paths of its objects."""

    def __init__(self, server: S3Server, proxy: FaultProxy, bucket: str) -> None:
        self.server = server
        self.proxy = proxy
        self.bucket = bucket
        server.make_bucket(bucket)

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}" if key else f"s3://{self.bucket}"

    def path(self, key: str) -> str:
        """The path of the object ``key`` in the proxy's log (path-style addressing)."""
        return f"/{self.bucket}/{key}"

    def upload_tree(self, local: Path, prefix: str = "") -> list[str]:
        return self.server.upload_tree(local, self.bucket, prefix)

    def upload_file(self, local: Path, key: str) -> None:
        self.server.upload_file(local, self.bucket, key)

    def put(self, key: str, data: bytes) -> None:
        self.server._direct().put_object(Bucket=self.bucket, Key=key, Body=data)

    def get(self, key: str) -> bytes:
        return self.server._direct().get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def delete(self, key: str) -> None:
        self.server._direct().delete_object(Bucket=self.bucket, Key=key)

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.server._direct().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def last_modified(self, key: str) -> float:
        head = self.server._direct().head_object(Bucket=self.bucket, Key=key)
        return head["LastModified"].timestamp()

    def copy_prefix(self, src: str, dst: str) -> None:
        """Every object under ``src/`` copied under ``dst/`` on the server (the same ETags)."""
        client = self.server._direct()
        for key in self.keys(src + "/"):
            client.copy_object(Bucket=self.bucket, Key=dst + key[len(src):],
                               CopySource={"Bucket": self.bucket, "Key": key})


def s3_environment(mp: pytest.MonkeyPatch, server: S3Server, proxy: FaultProxy) -> None:
    """The AWS variables a user would set for the loopback server, through ``proxy``."""
    for name, value in server.env(proxy.url).items():
        mp.setenv(name, value)
    mp.delenv("AWS_PROFILE", raising=False)
    mp.delenv("AWS_ENDPOINT_URL_S3", raising=False)


# ``TFRFS_REMOTE_STORE=file``: the remote tests' bucket is a local folder that tfrfs reaches as
# ``file://`` URLs through the same fsspec storage a bucket goes through (the storage seam's
# proof). A test that looks at the requests a bucket was sent (the proxy's log, its faults) has
# no bucket to look at there, and is skipped.
REMOTE_STORE_ENV = "TFRFS_REMOTE_STORE"


def _file_store() -> bool:
    import os
    return os.environ.get(REMOTE_STORE_ENV, "s3") == "file"


def _no_bucket(what: str) -> None:
    pytest.skip(f"{what}: there is no bucket behind {REMOTE_STORE_ENV}=file (file:// through fsspec)")


class FileRig:
    """``S3Rig``'s calls on a local folder (one sub-folder a bucket), reached as ``file://``."""

    def __init__(self, root: Path, bucket: str) -> None:
        self.folder = root / bucket
        self.folder.mkdir(parents=True)
        self.bucket = bucket

    @property
    def server(self) -> S3Server:
        _no_bucket("the test talks to the S3 server")
        raise AssertionError

    @property
    def proxy(self) -> FaultProxy:
        _no_bucket("the test looks at the requests sent")
        raise AssertionError

    def url(self, key: str = "") -> str:
        return f"file://{self.folder}/{key}" if key else f"file://{self.folder}"

    def path(self, key: str) -> str:
        _no_bucket("the test looks at the requests sent")
        raise AssertionError

    def upload_tree(self, local: Path, prefix: str = "") -> list[str]:
        keys = []
        for path in (p for p in Path(local).rglob("*") if p.is_file()):
            rel = path.relative_to(local).as_posix()
            key = f"{prefix.rstrip('/')}/{rel}" if prefix.strip("/") else rel
            self.upload_file(path, key)
            keys.append(key)
        return sorted(keys)

    def upload_file(self, local: Path, key: str) -> None:
        self.put(key, Path(local).read_bytes())

    def put(self, key: str, data: bytes) -> None:
        target = self.folder / key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    def get(self, key: str) -> bytes:
        return (self.folder / key).read_bytes()

    def delete(self, key: str) -> None:
        (self.folder / key).unlink()

    def keys(self, prefix: str = "") -> list[str]:
        return sorted(k for k in (p.relative_to(self.folder).as_posix() for p in self.folder.rglob("*") if p.is_file())
                      if k.startswith(prefix))

    def last_modified(self, key: str) -> float:
        return (self.folder / key).stat().st_mtime

    def copy_prefix(self, src: str, dst: str) -> None:
        """Every file under ``src/`` copied under ``dst/``, times kept (identities are times here)."""
        import shutil
        shutil.copytree(self.folder / src, self.folder / dst, copy_function=shutil.copy2)


@pytest.fixture
def s3(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> S3Rig | FileRig:
    """A fresh bucket ``data``; tfrfs processes started by the test reach it through ``s3_proxy``
    (the AWS variables a user would set, in this process's environment, which they inherit).
    With ``TFRFS_REMOTE_STORE=file``, a fresh local folder reached as ``file://`` instead."""
    if _file_store():
        return FileRig(tmp_path / "file-store", "data")
    s3_server: S3Server = request.getfixturevalue("s3_server")
    s3_proxy: FaultProxy = request.getfixturevalue("s3_proxy")
    s3_environment(monkeypatch, s3_server, s3_proxy)
    rig = S3Rig(s3_server, s3_proxy, "data")
    s3_proxy.reset()
    return rig


@pytest.fixture(scope="module")
def realdata() -> Path:
    """The real shards of ../shared/realdata, or of $TFRFS_REALDATA (``conftest.REALDATA``). Every
    test that reads them takes them from here, so that a checkout without them skips those tests,
    saying why, instead of failing."""
    from conftest import REALDATA
    if not REALDATA.is_dir():
        pytest.skip(f"no real data at {REALDATA} (TFRFS_REALDATA names another folder)")
    return REALDATA
