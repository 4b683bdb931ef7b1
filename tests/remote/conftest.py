"""Fixtures for remote sources: real loopback servers from ``support.servers``.

The moto server and the proxy in front of it live for the whole session; each test gets them
clean (no buckets, no faults, no latency, an empty request log, the proxy listening). HTTP
servers are cheap and made per test for whatever folder the test names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

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
def s3_proxy(s3_server: S3Server, _s3_proxy_session: FaultProxy) -> FaultProxy:
    """A FaultProxy in front of ``s3_server``: no faults, no latency, empty log."""
    return _fresh(_s3_proxy_session)


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
