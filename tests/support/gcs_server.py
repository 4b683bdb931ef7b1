"""A loopback Google Cloud Storage for the gs:// tests: gcp-storage-emulator's JSON API (in
memory), behind a gate that keeps GCS's generation preconditions.

The emulator serves objects, listings, ranged downloads, uploads, copies and deletes as gcsfs
sends them, but it accepts an upload whatever its ``ifGenerationMatch`` says. Real GCS refuses
one whose generation is not the object's (412 Precondition Failed; 0: the object must not
exist). ``GenerationGate`` is a reverse proxy that does what the store does: it looks up the
object's generation upstream and answers 412 itself when they differ, holding one lock from the
look-up to the end of the upload, so that of two uploads on one generation exactly one lands.
It only understands the condition on an upload that names its object in the query
(``uploadType=media&name=...``); any other conditional request gets 400, so a client that sent
one could not pass a test unchecked.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
from pathlib import Path
from typing import Any, Callable

from support.servers import HOST, FaultProxy, _Lifecycle, _ProxyHandler

# gcsfs asks its zonal-bucket extension (over gRPC) what each bucket is unless told not to; the
# emulator has no gRPC, and each question waits for a timeout.
ENVIRONMENT = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


class _GateHandler(_ProxyHandler):

    def _forward(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        if "ifGenerationMatch" not in query:
            super()._forward()
            return
        gate: GenerationGate = self.server.owner
        names = query.get("name")
        if self.command != "POST" or not names:
            self._read_body()
            self._refuse(400, "the gate checks ifGenerationMatch only on an upload naming its object in the query")
            return
        want = query["ifGenerationMatch"][0]
        bucket = urllib.parse.urlsplit(self.path).path.split("/b/", 1)[1].split("/", 1)[0]
        with gate.writing:
            meanwhile = gate._take_meanwhile(names[0])
            if meanwhile is not None:
                meanwhile()
            now = gate.generation(bucket, names[0])
            if (now or "0") != want:
                self._read_body()
                gate._log(self, 412)
                self._refuse(412, f"conditionNotMet: generation {now or 'none'}, not {want}")
                return
            super()._forward()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = _forward

    def _refuse(self, status: int, message: str) -> None:
        body = json.dumps({"error": {"code": status, "message": message,
                                     "errors": [{"reason": "conditionNotMet", "message": message}]}}).encode()
        self.send_small(status, body, "application/json; charset=UTF-8")


class GenerationGate(FaultProxy):
    """A FaultProxy in front of the emulator that answers for GCS's upload preconditions."""

    _handler = _GateHandler

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.writing = threading.Lock()
        self._meanwhile: tuple[str, Callable[[], None]] | None = None

    def meanwhile(self, match: str, action: Callable[[], None]) -> None:
        """Run ``action`` once, just before the next conditional upload of an object whose name
        contains ``match`` is checked: another writer's write landing at the worst moment."""
        with self._lock:
            self._meanwhile = (match, action)

    def _take_meanwhile(self, name: str) -> Callable[[], None] | None:
        with self._lock:
            if self._meanwhile is None or self._meanwhile[0] not in name:
                return None
            action = self._meanwhile[1]
            self._meanwhile = None
            return action

    def generation(self, bucket: str, name: str) -> str | None:
        """The object's generation as the emulator has it; None when there is no such object."""
        conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=10)
        try:
            conn.request("GET", f"/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o/"
                                f"{urllib.parse.quote(name, safe='')}")
            response = conn.getresponse()
            body = response.read()
        finally:
            conn.close()
        if response.status == 404:
            return None
        if response.status != 200:
            raise OSError(f"the emulator answered {response.status} for {bucket}/{name}")
        return str(json.loads(body)["generation"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class GcsServer(_Lifecycle):
    """gcp-storage-emulator on loopback (one bucket, in memory) with a ``GenerationGate`` in
    front: ``endpoint`` is the gate's, as a client's ``STORAGE_EMULATOR_HOST``; ``url(key)`` is the
    gs:// URL of a key of the bucket."""

    def __init__(self, bucket: str = "data") -> None:
        self.bucket = bucket
        self._server: Any = None
        self.gate: GenerationGate | None = None

    def start(self) -> None:
        from gcp_storage_emulator.server import create_server
        port = _free_port()
        self._server = create_server(HOST, port, in_memory=True, default_bucket=self.bucket)
        self._server.start()
        self.gate = GenerationGate(f"http://{HOST}:{port}")
        self.gate.start()

    def stop(self) -> None:
        if self.gate is not None:
            self.gate.stop()
        if self._server is not None:
            self._server.stop()

    @property
    def endpoint(self) -> str:
        assert self.gate is not None, "not started"
        return self.gate.url

    def environment(self) -> dict[str, str]:
        """What a process (gcsfs in it) needs to reach this store."""
        return {**ENVIRONMENT, "STORAGE_EMULATOR_HOST": self.endpoint}

    def fs(self, *, past_the_gate: bool = False) -> Any:
        """A gcsfs file system on this store, for a test to look at the bucket with (straight to
        the emulator, ``past_the_gate``: for a gate's ``meanwhile`` action, which runs while the
        gate holds its lock)."""
        import gcsfs
        assert self.gate is not None, "not started"
        endpoint = self.gate.upstream if past_the_gate else self.endpoint
        return gcsfs.GCSFileSystem(token="anon", endpoint_url=endpoint, skip_instance_cache=True)

    def wipe(self) -> None:
        """Every object of the bucket deleted (the bucket stays)."""
        fs = self.fs()
        for path in fs.find(self.bucket):
            fs.rm_file(path)

    def url(self, key: str = "") -> str:
        return f"gs://{self.bucket}/{key}".rstrip("/")

    def upload_tree(self, local: Path, prefix: str) -> None:
        fs = self.fs()
        for path in sorted(local.rglob("*")):
            if path.is_file():
                fs.put_file(str(path), f"{self.bucket}/{prefix}/{path.relative_to(local).as_posix()}")

    def get(self, key: str) -> bytes:
        data: bytes = self.fs().cat_file(f"{self.bucket}/{key}")
        return data

    def keys(self, prefix: str = "") -> list[str]:
        return sorted(p.split("/", 1)[1] for p in self.fs().find(f"{self.bucket}/{prefix}"))
