"""The loopback servers themselves, checked with real clients only (http.client, urllib, fsspec,
boto3, s3fs in a subprocess): what the remote-source tests build on must be right first."""

from __future__ import annotations

import email.utils
import hashlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import botocore.exceptions
import fsspec
import pytest

from support.servers import FaultProxy, RangeHTTPServer, S3Server, etag_of

SIZE = 1000
DATA = bytes((i * 7 + 3) % 256 for i in range(SIZE))

ServerFactory = Callable[[Path], RangeHTTPServer]
ProxyFactory = Callable[[RangeHTTPServer | str], FaultProxy]


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A folder with files at two depths, an empty file and a name that needs quoting."""
    root = tmp_path / "site"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "data.bin").write_bytes(DATA)
    (root / "empty").write_bytes(b"")
    (root / "sub" / "a b&c.txt").write_bytes(b"quoted name\n")
    (root / "sub" / "deeper" / "z.bin").write_bytes(os.urandom(4321))
    return root


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def get(url: str, path: str, method: str = "GET", headers: dict[str, str] | None = None,
        conn: http.client.HTTPConnection | None = None) -> tuple[http.client.HTTPResponse, bytes]:
    """One request; the response (already read) and its body."""
    c = conn or http.client.HTTPConnection("127.0.0.1", port_of(url), timeout=10)
    try:
        c.request(method, path, headers=headers or {})
        response = c.getresponse()
        return response, response.read()
    finally:
        if conn is None:
            c.close()


# --- RangeHTTPServer -------------------------------------------------------------------------

RANGES = [
    ("bytes=0-0", 0, 0), ("bytes=0-99", 0, 99), ("bytes=10-", 10, SIZE - 1), ("bytes=-1", SIZE - 1, SIZE - 1),
    ("bytes=-10", SIZE - 10, SIZE - 1), ("bytes=-5000", 0, SIZE - 1), ("bytes=990-5000", 990, SIZE - 1),
    ("bytes=999-999", SIZE - 1, SIZE - 1), ("bytes=500-600", 500, 600),
]


def test_single_ranges_are_byte_exact_on_one_keepalive_connection(site: Path, http_server: ServerFactory) -> None:
    server = http_server(site)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    for header, first, last in RANGES:
        response, body = get(server.url, "/data.bin", headers={"Range": header}, conn=conn)
        assert response.status == 206, header
        assert response.getheader("Content-Range") == f"bytes {first}-{last}/{SIZE}", header
        assert response.getheader("Content-Length") == str(last - first + 1)
        assert body == DATA[first:last + 1], header
    conn.close()


@pytest.mark.parametrize("header", ["bytes=1000-", "bytes=5000-6000", "bytes=-0", "bytes=1000-1000"])
def test_unsatisfiable_range_is_416(site: Path, http_server: ServerFactory, header: str) -> None:
    response, body = get(http_server(site).url, "/data.bin", headers={"Range": header})
    assert response.status == 416
    assert response.getheader("Content-Range") == f"bytes */{SIZE}"
    assert body == b""


def test_any_range_of_an_empty_file_is_416(site: Path, http_server: ServerFactory) -> None:
    response, _ = get(http_server(site).url, "/empty", headers={"Range": "bytes=0-"})
    assert (response.status, response.getheader("Content-Range")) == (416, "bytes */0")


@pytest.mark.parametrize("header", [None, "bytes=0-1,5-6", "bytes=5-2", "items=0-1", "bytes=abc"])
def test_no_single_range_sends_the_whole_file(site: Path, http_server: ServerFactory, header: str | None) -> None:
    response, body = get(http_server(site).url, "/data.bin", headers={"Range": header} if header else {})
    assert response.status == 200
    assert response.getheader("Content-Range") is None
    assert body == DATA


def test_head_has_the_validators_and_no_body(site: Path, http_server: ServerFactory) -> None:
    server = http_server(site)
    st = (site / "data.bin").stat()
    response, body = get(server.url, "/data.bin", method="HEAD")
    assert response.status == 200 and body == b""
    assert response.getheader("Content-Length") == str(SIZE)
    assert response.getheader("Accept-Ranges") == "bytes"
    assert response.getheader("Content-Type") == "application/octet-stream"
    etag = response.getheader("ETag")
    assert etag == etag_of(st) and etag.startswith('"') and etag.endswith('"')
    assert email.utils.parsedate_to_datetime(response.getheader("Last-Modified", "")).timestamp() == int(st.st_mtime)

    os.utime(site / "data.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    again, _ = get(server.url, "/data.bin", method="HEAD")
    assert again.getheader("ETag") != etag


def test_folders_redirect_list_and_missing_is_404(site: Path, http_server: ServerFactory) -> None:
    server = http_server(site)
    response, _ = get(server.url, "/sub?x=1")
    assert (response.status, response.getheader("Location")) == (301, "/sub/?x=1")
    response, page = get(server.url, "/sub/")
    assert response.status == 200 and response.getheader("Content-Type", "").startswith("text/html")
    assert b'<a href="a%20b%26c.txt">' in page and b'<a href="deeper/">' in page
    for missing in ("/nope", "/sub/nope/", "/../etc/passwd", "/sub/%2e%2e/%2e%2e/etc/passwd"):
        assert get(server.url, missing)[0].status == 404, missing


def test_fsspec_http_finds_lists_sizes_and_reads(site: Path, http_server: ServerFactory) -> None:
    url = http_server(site).url
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    expected = {"data.bin": SIZE, "empty": 0, "sub/a%20b%26c.txt": 12, "sub/deeper/z.bin": 4321}
    found = fs.find(url)
    assert found == [f"{url}/{name}" for name in sorted(expected)]
    listing = {e["name"]: e["type"] for e in fs.ls(f"{url}/sub", detail=True)}
    assert listing == {f"{url}/sub/a%20b%26c.txt": "file", f"{url}/sub/deeper/": "directory"}
    assert {u: fs.info(u)["size"] for u in found} == {f"{url}/{n}": s for n, s in expected.items()}
    assert fs.cat_file(f"{url}/data.bin", 123, 457) == DATA[123:457]
    assert fs.cat_file(f"{url}/data.bin", SIZE - 3, SIZE) == DATA[-3:]
    assert fs.cat_file(f"{url}/sub/a%20b%26c.txt") == b"quoted name\n"


# --- FaultProxy ------------------------------------------------------------------------------


def test_proxy_forwards_and_logs_each_request(site: Path, http_server: ServerFactory,
                                              http_proxy: ProxyFactory) -> None:
    proxy = http_proxy(http_server(site))
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    response, body = get(proxy.url, "/data.bin", headers={"Range": "bytes=5-9"}, conn=conn)
    assert (response.status, response.getheader("Content-Range"), body) == (206, f"bytes 5-9/{SIZE}", DATA[5:10])
    assert get(proxy.url, "/data.bin", method="HEAD", conn=conn)[0].getheader("Content-Length") == str(SIZE)
    assert get(proxy.url, "/sub", conn=conn)[0].status == 301
    assert get(proxy.url, "/nope", conn=conn)[0].status == 404
    conn.close()

    assert [(r.method, r.path, r.range_header, r.status) for r in proxy.requests] == [
        ("GET", "/data.bin", "bytes=5-9", 206), ("HEAD", "/data.bin", None, 200),
        ("GET", "/sub", None, 301), ("GET", "/nope", None, 404)]
    assert proxy.count() == 4
    assert proxy.count(method="get") == 3
    assert proxy.count(path_contains="data") == 2
    assert proxy.count(ranged=True) == 1 and proxy.count(ranged=False) == 3
    proxy.reset()
    assert proxy.requests == []


def test_injected_failures_are_counted_down_then_cleared(site: Path, http_server: ServerFactory,
                                                         http_proxy: ProxyFactory) -> None:
    proxy = http_proxy(http_server(site))
    proxy.fail(403, times=1, match="data")
    proxy.fail(500, times=2)
    response, body = get(proxy.url, "/data.bin")
    assert response.status == 403 and body.startswith(b"403 Forbidden")
    assert [get(proxy.url, "/data.bin")[0].status for _ in range(3)] == [500, 500, 200]

    proxy.fail(404, match="empty")
    assert [get(proxy.url, "/empty")[0].status for _ in range(3)] == [404, 404, 404]
    assert get(proxy.url, "/data.bin")[1] == DATA
    proxy.clear_faults()
    assert get(proxy.url, "/empty")[0].status == 200
    assert [r.status for r in proxy.requests] == [403, 500, 500, 200, 404, 404, 404, 200, 200]


@pytest.mark.parametrize("status, code", [(403, "AccessDenied"), (404, "NoSuchKey"), (500, "InternalError"),
                                          (503, "SlowDown")])
def test_s3_clients_get_s3_errors_then_recover(s3_server: S3Server, s3_proxy: FaultProxy, status: int,
                                               code: str) -> None:
    s3_server.make_bucket("bkt")
    s3_server.client().put_object(Bucket="bkt", Key="k/obj", Body=b"payload")
    client = s3_server.client(s3_proxy.url)
    s3_proxy.fail(status, times=1, match="/bkt/k/")
    with pytest.raises(botocore.exceptions.ClientError) as failed:
        client.get_object(Bucket="bkt", Key="k/obj")
    assert failed.value.response["Error"]["Code"] == code
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert client.get_object(Bucket="bkt", Key="k/obj")["Body"].read() == b"payload"
    assert s3_proxy.count(method="GET", path_contains="/bkt/k/obj") == 2


def test_s3_404_on_a_bucket_path_is_no_such_bucket(s3_server: S3Server, s3_proxy: FaultProxy) -> None:
    s3_server.make_bucket("bkt")
    s3_proxy.fail(404, times=1)
    with pytest.raises(botocore.exceptions.ClientError) as failed:
        s3_server.client(s3_proxy.url).list_objects_v2(Bucket="bkt")
    assert failed.value.response["Error"]["Code"] == "NoSuchBucket"


def test_latency_and_stalls_delay_requests(site: Path, http_server: ServerFactory,
                                           http_proxy: ProxyFactory) -> None:
    proxy = http_proxy(http_server(site))
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    get(proxy.url, "/empty", conn=conn)

    def timed(path: str) -> float:
        t = time.perf_counter()
        get(proxy.url, path, conn=conn)
        return time.perf_counter() - t

    proxy.latency = 0.02
    assert min(timed("/data.bin") for _ in range(3)) >= 0.02
    proxy.latency = 0
    proxy.stall(0.15, match="data")
    assert timed("/data.bin") >= 0.15
    proxy.fail(500, times=1, match="data")
    assert timed("/data.bin") >= 0.15
    conn.close()


def test_down_refuses_connections_and_up_serves_on_the_same_port(site: Path, http_server: ServerFactory,
                                                                 http_proxy: ProxyFactory) -> None:
    proxy = http_proxy(http_server(site))
    port = proxy.port
    kept = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    assert get(proxy.url, "/data.bin", conn=kept)[1] == DATA

    proxy.down()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        get(proxy.url, "/data.bin", conn=kept)
    kept.close()

    proxy.up()
    assert proxy.port == port
    assert get(proxy.url, "/data.bin")[1] == DATA


def test_proxy_forwards_chunked_and_large_request_bodies(s3_server: S3Server, s3_proxy: FaultProxy) -> None:
    s3_server.make_bucket("bkt")
    parts = [b"abc", b"", b"defgh", os.urandom(70_000)][::2] + [os.urandom(5)]
    conn = http.client.HTTPConnection("127.0.0.1", s3_proxy.port, timeout=10)
    conn.putrequest("PUT", "/bkt/chunked")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for part in parts:
        conn.send(b"%x\r\n%b\r\n" % (len(part), part))
    conn.send(b"0\r\n\r\n")
    assert conn.getresponse().status == 200
    conn.close()
    assert s3_server.client().get_object(Bucket="bkt", Key="chunked")["Body"].read() == b"".join(parts)

    big = os.urandom(3 << 20)
    through = s3_server.client(s3_proxy.url)
    through.put_object(Bucket="bkt", Key="big", Body=big)
    assert through.get_object(Bucket="bkt", Key="big")["Body"].read() == big


S3FS_SCRIPT = """
import hashlib, json, sys, s3fs
fs = s3fs.S3FileSystem()
keys = sorted(fs.find("bkt/data"))
blob = fs.cat_file("bkt/data/sub/deeper/z.bin")
part = fs.cat_file("bkt/data/data.bin", start=100, end=200)
json.dump({"keys": keys, "sha": hashlib.sha256(blob).hexdigest(), "part": part.hex(),
           "size": fs.info("bkt/data/data.bin")["size"]}, sys.stdout)
"""


def test_s3fs_in_a_subprocess_reaches_moto_through_the_proxy_by_environment(
        site: Path, s3_server: S3Server, s3_proxy: FaultProxy) -> None:
    s3_server.make_bucket("bkt")
    keys = s3_server.upload_tree(site, "bkt", prefix="data")
    assert keys == ["data/data.bin", "data/empty", "data/sub/a b&c.txt", "data/sub/deeper/z.bin"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FSSPEC_"))}
    env.update(s3_server.env(s3_proxy.url))
    done = subprocess.run([sys.executable, "-c", S3FS_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["keys"] == [f"bkt/{k}" for k in keys]
    assert got["sha"] == hashlib.sha256((site / "sub/deeper/z.bin").read_bytes()).hexdigest()
    assert bytes.fromhex(got["part"]) == DATA[100:200]
    assert got["size"] == SIZE
    assert s3_proxy.count(method="GET", path_contains="/bkt/data/data.bin", ranged=True) == 1
    assert s3_proxy.count(path_contains="list-type=2") >= 1


# --- clean shutdown --------------------------------------------------------------------------


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_stop_leaves_no_threads_or_sockets(site: Path) -> None:
    threads_before, fds_before = set(threading.enumerate()), open_fds()
    with S3Server() as s3, RangeHTTPServer(site) as http_srv, FaultProxy(http_srv.url) as proxy:
        idle = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        assert get(proxy.url, "/data.bin", conn=idle)[1] == DATA
        s3.client().list_buckets()
        raw = socket.create_connection(("127.0.0.1", s3.port))
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.05)
        assert len(set(threading.enumerate()) - threads_before) >= 5
    assert set(threading.enumerate()) - threads_before == set()
    assert idle.sock is not None and idle.sock.recv(1) == b""
    raw.settimeout(5)
    while raw.recv(65536):
        pass
    idle.close()
    raw.close()
    assert open_fds() <= fds_before
    for port in (s3.port, http_srv.port, proxy.port):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
