"""Real protocol servers on 127.0.0.1 for the remote-source tests and the benchmark.

- ``RangeHTTPServer(root)``: a folder over HTTP/1.1 with byte ranges, validators and HTML listings
  of the shape fsspec's ``HTTPFileSystem`` parses.
- ``FaultProxy(upstream)``: a reverse proxy that logs every request and can add latency, answer
  with errors, slow responses down, or refuse connections, all while it runs.
- ``S3Server``: moto's S3 in server mode, with helpers to fill buckets and the environment a
  subprocess needs to reach it through s3fs.

Each binds an ephemeral port, serves from daemon threads, and is a context manager; ``stop()``
closes the listening socket and every open connection and joins the threads that served them, so
nothing outlives a test. Only the standard library is needed, except for ``S3Server`` (moto,
boto3), which imports them when it is used.
"""

from __future__ import annotations

import email.utils
import html
import http.client
import os
import socket
import sys
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Literal, TypeVar

HOST = "127.0.0.1"
CHUNK = 256 * 1024

# Headers that describe one connection, not the message (RFC 9110 7.6.1), plus Expect: the proxy
# answers ``100 Continue`` itself and sends the upstream a complete body.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade", "expect",
})

_Self = TypeVar("_Self", bound="_Lifecycle")


class _Lifecycle:
    """``with server:`` starts it and stops it."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Self) -> _Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class _ConnectionTracking:
    """Server mixin: each connection on its own daemon thread, registered until it ends, with
    Nagle's algorithm off (headers and body go out as separate writes; with Nagle on, the
    client's delayed ACK would add ~40 ms to every small response).

    The stock ``ThreadingMixIn`` forgets daemon threads, so a client's idle keep-alive connection
    would keep its thread blocked after shutdown; here ``close_connections()`` shuts every
    registered socket down (waking the thread) and joins the threads. A socket leaves the registry
    under the lock before its thread closes it, so it is never shut down after being closed.
    """

    def _init_tracking(self) -> None:
        self._tracking_lock = threading.Lock()
        self._open: dict[socket.socket, threading.Thread] = {}

    def process_request(self, request: Any, client_address: Any) -> None:
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        thread = threading.Thread(target=self._serve_connection, args=(request, client_address),
                                  name=f"{type(self).__name__}-conn", daemon=True)
        with self._tracking_lock:
            self._open[request] = thread
        thread.start()

    def _serve_connection(self, request: socket.socket, client_address: Any) -> None:
        server: Any = self
        try:
            server.finish_request(request, client_address)
        except Exception:
            server.handle_error(request, client_address)
        finally:
            with self._tracking_lock:
                self._open.pop(request, None)
            server.shutdown_request(request)

    def close_connections(self, timeout: float = 5.0) -> None:
        with self._tracking_lock:
            open_now = list(self._open.items())
            for sock, _ in open_now:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        for _, thread in open_now:
            thread.join(timeout)


class _LoopbackServer(_ConnectionTracking, ThreadingHTTPServer):
    """A threaded HTTP server on 127.0.0.1 that knows its owner and stays quiet about clients
    that hang up."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, handler: type[BaseHTTPRequestHandler], owner: Any) -> None:
        self._init_tracking()
        self.owner = owner
        super().__init__((HOST, port), handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _ServedOnThread(_Lifecycle):
    """Runs one ``_LoopbackServer`` at a time on a daemon thread. The first start picks a free
    port; it is kept, so that listening again after a halt answers at the same address."""

    _handler: type[BaseHTTPRequestHandler]

    def __init__(self) -> None:
        self._server: _LoopbackServer | None = None
        self._thread: threading.Thread | None = None
        self._port = 0
        self._state_lock = threading.Lock()
        self._halted = threading.Event()

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError(f"{type(self).__name__} was never started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def _listen(self) -> None:
        with self._state_lock:
            if self._server is not None:
                return
            server = _LoopbackServer(self._port, self._handler, self)
            self._port = server.server_address[1]
            self._halted = threading.Event()
            self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                            name=f"{type(self).__name__}-accept", daemon=True)
            self._server = server
            self._thread.start()

    def _halt(self) -> None:
        with self._state_lock:
            server, thread = self._server, self._thread
            self._server = self._thread = None
            if server is None:
                return
            self._halted.set()
            server.shutdown()
            server.server_close()
            server.close_connections()
            if thread is not None:
                thread.join()

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` unless the server is halted meanwhile; True when it was."""
        if seconds <= 0:
            return self._halted.is_set()
        return self._halted.wait(seconds)

    def start(self) -> None:
        self._listen()

    def stop(self) -> None:
        self._halt()


class _QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive, and no line on stderr per request."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_small(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
                   headers: dict[str, str] | None = None) -> None:
        """Answer with a complete small body (none for HEAD), keeping the connection usable."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


# --- RangeHTTPServer -------------------------------------------------------------------------


def parse_range(header: str | None, size: int) -> tuple[int, int] | Literal["unsatisfiable"] | None:
    """The inclusive span one ``Range`` header asks of ``size`` bytes.

    None when the whole file should be sent (no header, a syntax the server ignores, or several
    ranges); ``"unsatisfiable"`` when the single range starts past the end.
    """
    if not header:
        return None
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    try:
        if first == "":
            suffix = int(last)
            if suffix <= 0 or size == 0:
                return "unsatisfiable"
            return max(0, size - suffix), size - 1
        start = int(first)
        end = int(last) if last else None
    except ValueError:
        return None
    if start < 0 or (end is not None and end < start):
        return None
    if start >= size:
        return "unsatisfiable"
    return start, size - 1 if end is None else min(end, size - 1)


def etag_of(st: os.stat_result) -> str:
    """A strong validator that changes whenever the size or the modification time does."""
    return f'"{st.st_size:x}-{st.st_mtime_ns:x}"'


class _RangeHandler(_QuietHandler):
    server: _LoopbackServer

    def do_GET(self) -> None:
        self._answer()

    def do_HEAD(self) -> None:
        self._answer()

    def _answer(self) -> None:
        root: Path = self.server.owner.root
        url = urllib.parse.urlsplit(self.path)
        parts = [p for p in urllib.parse.unquote(url.path).split("/") if p not in ("", ".")]
        local = root.joinpath(*parts) if ".." not in parts and "\0" not in url.path else None
        if local is not None and local.is_dir():
            if not url.path.endswith("/"):
                location = url.path + "/" + (f"?{url.query}" if url.query else "")
                self.send_small(301, b"", headers={"Location": location})
            else:
                self._listing(local, url.path)
        elif local is not None and local.is_file():
            self._file(local)
        else:
            self.send_small(404, b"not found\n")

    def _listing(self, folder: Path, url_path: str) -> None:
        entries = sorted(folder.iterdir(), key=lambda p: p.name)
        items = []
        for entry in entries:
            slash = "/" if entry.is_dir() else ""
            href = urllib.parse.quote(entry.name, safe="") + slash
            items.append(f'<li><a href="{href}">{html.escape(entry.name)}{slash}</a></li>')
        page = ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
                f"<title>Index of {html.escape(url_path)}</title></head>\n"
                f"<body><ul>\n{chr(10).join(items)}\n</ul></body></html>\n")
        self.send_small(200, page.encode(), "text/html; charset=utf-8")

    def _file(self, path: Path) -> None:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            size = st.st_size
            span = parse_range(self.headers.get("Range"), size)
            common = {
                "Accept-Ranges": "bytes",
                "ETag": etag_of(st),
                "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True),
            }
            if span == "unsatisfiable":
                self.send_small(416, b"", "application/octet-stream",
                                {**common, "Content-Range": f"bytes */{size}"})
                return
            if isinstance(span, tuple):
                start, end = span
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            else:
                start, end = 0, size - 1
                self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start + 1))
            for name, value in common.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command == "HEAD":
                return
            f.seek(start)
            left = end - start + 1
            while left > 0:
                data = f.read(min(CHUNK, left))
                if not data:
                    break
                self.wfile.write(data)
                left -= len(data)


class RangeHTTPServer(_ServedOnThread):
    """Serves the folder ``root`` read-only at ``url``: GET and HEAD, single byte ranges, strong
    ETags from size and mtime, and HTML listings for ``/dir/`` (``/dir`` redirects there)."""

    _handler = _RangeHandler

    def __init__(self, root: Path | str) -> None:
        super().__init__()
        self.root = Path(root)


# --- FaultProxy ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request the proxy answered: the path includes the query; status is what the client
    got (an injected one, the upstream's, or 502 when the upstream could not be reached)."""

    method: str
    path: str
    range_header: str | None
    status: int
    sent: int = 0    # the bytes of the request's body (an upload's)


@dataclass
class _Fault:
    status: int
    times: int | None
    match: str | None
    method: str | None = None


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


S3_ERROR_CODES = {400: "InvalidRequest", 403: "AccessDenied", 404: "NoSuchKey", 405: "MethodNotAllowed",
                  409: "Conflict", 416: "InvalidRange", 500: "InternalError", 501: "NotImplemented",
                  503: "SlowDown"}


def looks_like_s3(headers: Any, path: str) -> bool:
    """Whether a request is signed the AWS way (header or presigned query), so that an injected
    error should be an S3 XML error for the SDK to parse."""
    auth = headers.get("Authorization", "")
    return (auth.startswith(("AWS4-", "AWS ")) or any(k.lower().startswith("x-amz-") for k in headers.keys())
            or "X-Amz-Signature=" in path)


def s3_error_body(status: int, path: str) -> bytes:
    """An S3 ``<Error>`` document for an injected ``status``; 404 names the bucket as missing when
    the path has no key."""
    resource = urllib.parse.unquote(urllib.parse.urlsplit(path).path)
    code = S3_ERROR_CODES.get(status, _phrase(status).replace(" ", ""))
    if status == 404 and resource.strip("/").count("/") == 0:
        code = "NoSuchBucket"
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>Injected fault: {status}</Message>"
            f"<Resource>{html.escape(resource)}</Resource><RequestId>fault-proxy</RequestId></Error>"
            ).encode()


class _ProxyHandler(_QuietHandler):
    server: _LoopbackServer

    def setup(self) -> None:
        super().setup()
        self._upstream: http.client.HTTPConnection | None = None

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self._drop_upstream()

    def _drop_upstream(self) -> None:
        if self._upstream is not None:
            self._upstream.close()
            self._upstream = None

    def _forward(self) -> None:
        proxy: FaultProxy = self.server.owner
        epoch = proxy.epoch
        body = self._read_body()
        if body is None:
            return
        if proxy.sleep(proxy.latency):
            self.close_connection = True
            return
        fault = proxy._take_fault(self.path, self.command)
        if fault is not None:
            if proxy.sleep(proxy._stall_for(self.path)) or proxy.epoch != epoch:
                self.close_connection = True
                return
            proxy._log(self, fault)   # before answering: the client's next request may come at once
            self._send_fault(fault)
            return
        try:
            response = self._exchange(proxy, body)
        except OSError as exc:
            self._drop_upstream()
            proxy._log(self, 502)
            self.send_small(502, f"upstream unreachable: {exc}\n".encode())
            return
        try:
            # A request held past a reset belongs to a test that has ended: it is dropped unlogged,
            # or the next test would count it among its own.
            if proxy.sleep(proxy._stall_for(self.path)) or proxy.epoch != epoch:
                self.close_connection = True
                return
            proxy._log(self, response.status)
            self._relay(response)
        finally:
            if not response.isclosed():
                response.close()
                self._drop_upstream()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = _forward

    def _read_body(self) -> bytes | None:
        """The request body, de-chunked; None (connection closed) when it is malformed."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts: list[bytes] = []
            while True:
                line = self.rfile.readline(65537)
                try:
                    n = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    self.close_connection = True
                    return None
                if n == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(n))
                self.rfile.readline(3)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _outgoing_headers(self, body: bytes) -> list[tuple[str, str]]:
        named = {t.strip().lower() for t in self.headers.get("Connection", "").split(",")}
        out = [(k, v) for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | named]
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = [(k, v) for k, v in out if k.lower() != "content-length"]
            out.append(("Content-Length", str(len(body))))
        return out

    def _exchange(self, proxy: FaultProxy, body: bytes) -> http.client.HTTPResponse:
        """Send the request upstream on this connection's upstream connection, opening a fresh
        one once if a reused one turns out to have been closed by the upstream."""
        headers = self._outgoing_headers(body)
        if not any(k.lower() == "host" for k, _ in headers):
            headers.append(("Host", f"{proxy.upstream_host}:{proxy.upstream_port}"))
        reused = self._upstream is not None
        try:
            return self._send_upstream(proxy, headers, body)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            self._drop_upstream()
            if not reused:
                raise
        return self._send_upstream(proxy, headers, body)

    def _send_upstream(self, proxy: FaultProxy, headers: list[tuple[str, str]],
                       body: bytes) -> http.client.HTTPResponse:
        if self._upstream is None:
            self._upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=60)
        conn = self._upstream
        conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        conn.endheaders(body or None)
        return conn.getresponse()

    def _relay(self, response: http.client.HTTPResponse) -> None:
        """Stream the upstream's answer back; a body without a length is re-chunked (or, to an
        HTTP/1.0 client, ended by closing)."""
        bodiless = self.command == "HEAD" or response.status in (204, 304) or response.status < 200
        length = response.getheader("Content-Length")
        named = {t.strip().lower() for t in (response.getheader("Connection") or "").split(",")}
        chunked = not bodiless and length is None and self.request_version != "HTTP/1.0"
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP | named:
                self.send_header(name, value)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        elif not bodiless and length is None:
            self.close_connection = True
        self.end_headers()
        if bodiless:
            response.read()
            return
        while True:
            data = response.read1(CHUNK) if chunked or length is None else response.read(CHUNK)
            if not data:
                break
            if chunked:
                self.wfile.write(b"%x\r\n%b\r\n" % (len(data), data))
            else:
                self.wfile.write(data)
        if chunked:
            self.wfile.write(b"0\r\n\r\n")
        if response.will_close:
            self._drop_upstream()

    def _send_fault(self, status: int) -> None:
        if looks_like_s3(self.headers, self.path):
            body, kind = s3_error_body(status, self.path), "application/xml"
        else:
            body = f"{status} {_phrase(status)} (injected fault)\n".encode()
            kind = "text/plain; charset=utf-8"
        self.send_small(status, body, kind)


class FaultProxy(_ServedOnThread):
    """A reverse proxy at ``url`` in front of ``upstream`` (``http://host:port``) that tests can
    slow down, break and watch while it runs.

    Requests go upstream as the client sent them (method, path and query, headers including Host,
    body) minus hop-by-hop headers; responses stream back with their status and headers. Each
    client connection gets its own keep-alive connection upstream. All settings are thread-safe
    and take effect on the next request.
    """

    _handler = _ProxyHandler

    def __init__(self, upstream: str) -> None:
        super().__init__()
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"upstream must be http://host:port, not {upstream!r}")
        self.upstream = upstream.rstrip("/")
        self.upstream_host: str = parsed.hostname
        self.upstream_port: int = parsed.port or 80
        self._lock = threading.Lock()
        self._latency = 0.0
        self._faults: list[_Fault] = []
        self._stalls: dict[str | None, float] = {}
        self._requests: list[Request] = []
        self._epoch = 0

    @property
    def latency(self) -> float:
        """Seconds slept before forwarding (or failing) each request: a network's round trip."""
        with self._lock:
            return self._latency

    @latency.setter
    def latency(self, seconds: float) -> None:
        with self._lock:
            self._latency = max(0.0, float(seconds))

    @property
    def requests(self) -> list[Request]:
        """A copy of the log, oldest first."""
        with self._lock:
            return list(self._requests)

    def count(self, method: str | None = None, path_contains: str | None = None,
              ranged: bool | None = None) -> int:
        """How many logged requests have this method, contain this in their path, and did (True)
        or did not (False) carry a Range header; None matches any."""
        return sum(1 for r in self.requests
                   if (method is None or r.method == method.upper())
                   and (path_contains is None or path_contains in r.path)
                   and (ranged is None or (r.range_header is not None) == ranged))

    @property
    def epoch(self) -> int:
        """How many times the log was reset (requests received before the last reset are not
        logged when they finish after it)."""
        with self._lock:
            return self._epoch

    def reset(self) -> None:
        """Forget the logged requests, and those still held (stalled) from before."""
        with self._lock:
            self._requests.clear()
            self._epoch += 1

    def fail(self, status: int, times: int | None = None, match: str | None = None, method: str | None = None) -> None:
        """Answer the next ``times`` requests whose path contains ``match`` (any when None), of
        ``method`` (any when None), with ``status`` instead of forwarding them; all of them while
        set when ``times`` is None. Faults added earlier are used up first."""
        if times is not None and times <= 0:
            return
        with self._lock:
            self._faults.append(_Fault(status, times, match, method))

    def stall(self, seconds: float, match: str | None = None) -> None:
        """Hold responses to requests whose path contains ``match`` (any when None) ``seconds``
        longer; 0 removes the stall for ``match``. Stalls that match add up."""
        with self._lock:
            if seconds > 0:
                self._stalls[match] = float(seconds)
            else:
                self._stalls.pop(match, None)

    def clear_faults(self) -> None:
        """Remove every injected failure and stall (latency stays)."""
        with self._lock:
            self._faults.clear()
            self._stalls.clear()

    def down(self) -> None:
        """Close the listening socket and every open connection: clients get connection refused
        until ``up()``."""
        self._halt()

    def up(self) -> None:
        """Listen again on the same port."""
        self._listen()

    def _take_fault(self, path: str, method: str = "") -> int | None:
        with self._lock:
            for fault in self._faults:
                if (fault.match is None or fault.match in path) and fault.method in (None, method):
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            self._faults.remove(fault)
                    return fault.status
        return None

    def _stall_for(self, path: str) -> float:
        with self._lock:
            return sum(s for m, s in self._stalls.items() if m is None or m in path)

    def _log(self, handler: BaseHTTPRequestHandler, status: int) -> None:
        try:
            # (an aws-chunked body's own size is in x-amz-decoded-content-length)
            sent = int(handler.headers.get("x-amz-decoded-content-length") or handler.headers.get("Content-Length") or 0)
        except ValueError:
            sent = 0
        record = Request(handler.command, handler.path, handler.headers.get("Range"), status, sent)
        with self._lock:
            self._requests.append(record)


# --- S3Server --------------------------------------------------------------------------------


def _moto_server_class() -> Callable[[int], Any]:
    """A werkzeug server running moto's S3 app, built like ``moto.server.ThreadedMotoServer``
    but with tracked connections (that class leaves idle keep-alive threads behind on stop) and
    without a log line per request."""
    from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import ThreadedWSGIServer

    class QuietMotoHandler(MotoRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            pass

    class TrackedMotoServer(_ConnectionTracking, ThreadedWSGIServer):
        def __init__(self, port: int) -> None:
            self._init_tracking()
            super().__init__(HOST, port, _WritesOneAtATime(DomainDispatcherApplication(create_backend_app)),
                             handler=QuietMotoHandler)

    return TrackedMotoServer


class _WritesOneAtATime:
    """moto's app, answering one write (PUT, POST, DELETE) at a time. moto checks a PUT's
    ``If-None-Match: *`` or ``If-Match`` and then stores the object, in two steps, so two creates
    of one key racing on two server threads could both pass the check; S3 decides each
    conditional write atomically. Reads are answered concurrently, as before."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict, start_response: Callable[..., Any]) -> Any:
        if environ.get("REQUEST_METHOD") not in ("PUT", "POST", "DELETE"):
            return self.app(environ, start_response)
        with self.lock:
            return list(self.app(environ, start_response))   # the whole answer made under the lock


class S3Server(_Lifecycle):
    """moto's S3 in server mode at ``url``, credentials ``testing``/``testing``, region us-east-1.

    Its state lives in this process (moto's backends), so ``reset()`` empties every bucket a test
    made. Clients made by ``client()`` are closed by ``stop()``.
    """

    ACCESS_KEY = "testing"
    SECRET_KEY = "testing"
    REGION = "us-east-1"

    def __init__(self) -> None:
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._clients: list[Any] = []
        self._admin: Any = None
        self._port = 0

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError("S3Server was never started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        if self._server is not None:
            return
        self._server = _moto_server_class()(self._port)
        self._port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="S3Server-accept", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        for client in self._clients:
            client.close()
        self._clients.clear()
        self._admin = None
        server.shutdown()
        server.server_close()
        server.close_connections()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def reset(self) -> None:
        """Drop all moto state (buckets, objects), as a fresh server would have it."""
        request = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

    def client(self, endpoint: str | None = None) -> Any:
        """A boto3 S3 client for this server (or for ``endpoint``, e.g. a proxy in front of it)
        that makes one attempt per call, so that injected faults reach the caller."""
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", endpoint_url=endpoint or self.url, region_name=self.REGION,
                              aws_access_key_id=self.ACCESS_KEY, aws_secret_access_key=self.SECRET_KEY,
                              config=Config(retries={"total_max_attempts": 1, "mode": "standard"}))
        self._clients.append(client)
        return client

    def _direct(self) -> Any:
        if self._admin is None:
            self._admin = self.client()
        return self._admin

    def make_bucket(self, name: str) -> None:
        self._direct().create_bucket(Bucket=name)

    def upload_file(self, path: Path | str, bucket: str, key: str) -> None:
        """Upload one file (in parts when it is large, as boto3's transfer manager does)."""
        self._direct().upload_file(str(path), bucket, key)

    def upload_tree(self, local_dir: Path | str, bucket: str, prefix: str = "") -> list[str]:
        """Upload every file under ``local_dir`` as ``prefix/relative/path``; the keys, sorted."""
        root = Path(local_dir)
        keys = []
        for path in (p for p in root.rglob("*") if p.is_file()):
            rel = path.relative_to(root).as_posix()
            key = f"{prefix.rstrip('/')}/{rel}" if prefix.strip("/") else rel
            self.upload_file(path, bucket, key)
            keys.append(key)
        return sorted(keys)

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """Environment variables with which a subprocess's ``s3fs.S3FileSystem()`` (no arguments)
        reaches this server, or ``endpoint`` in front of it.

        Credentials, region and endpoint come from botocore's standard variables (s3fs honours
        ``AWS_ENDPOINT_URL``; fsspec's ``FSSPEC_S3_ENDPOINT_URL`` would work too but is left out so
        that what is tested is what users set). Shared config files point at nothing and instance
        metadata is off, so a developer's ~/.aws cannot interfere.
        """
        url = endpoint or self.url
        return {
            "AWS_ACCESS_KEY_ID": self.ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": self.SECRET_KEY,
            "AWS_DEFAULT_REGION": self.REGION,
            "AWS_ENDPOINT_URL": url,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

