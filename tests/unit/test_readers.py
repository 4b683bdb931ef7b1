"""One test suite every shard reader passes (the seam of ``tfrfs.storage.readers``).

Each reader is checked for what the layers above rely on: size and identity, ``pread`` of any
range (short only at the end), records with their checksums checked, large records lent by
``borrow`` (read ahead or not), and ``serve`` answering the same bytes whatever form it takes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tfrfs.format import tfrecord
from tfrfs.errors import DataLoss
from tfrfs.storage.readers import READER_ENV, ReaderClass, Readers, ShardReader, default_readers
from tfrfs.storage.local_reader import LocalReaders
from tfrfs.view.nodes import as_bytes

from support.plain_reader import PlainReader

FACTORIES: dict[str, Callable[[], Readers]] = {
    "local": LocalReaders,
    "plain": lambda: ReaderClass(PlainReader),
}
REMOTE = "remote over HTTP"   # the remote readers, reading the same files from a loopback HTTP server


class OverHTTP:
    """``Readers`` that open a local path as its URL on a loopback HTTP server serving ``root``,
    through the remote readers (block cache, ranged requests)."""

    def __init__(self, root: Path, cache: Path) -> None:
        pytest.importorskip("fsspec")
        pytest.importorskip("aiohttp")
        from support.servers import RangeHTTPServer
        from tfrfs.storage.remote_reader import RemoteReaders
        from tfrfs.storage.fsspec_store import Store
        self.root = root
        self.server = RangeHTTPServer(root)
        self.server.start()
        self.remote = RemoteReaders(Store(self.server.url + "/"), cache)
        self.name = "remote"

    def open(self, path: str) -> ShardReader:
        return self.remote.open(f"{self.server.url}/{Path(path).relative_to(self.root).as_posix()}")

    def close(self) -> None:
        self.remote.close()
        self.server.stop()

RECORDS = [b"", b"small", bytes(range(256)) * 300, os.urandom(200_000), os.urandom(150_000), b"tail"]


def _write(path: Path, records: list[bytes]) -> list[tuple[int, int]]:
    spans = []
    with open(path, "wb") as f:
        for r in records:
            spans.append((f.tell(), len(r)))
            f.write(tfrecord.frame(r))
    return spans


@pytest.fixture(params=[*sorted(FACTORIES), REMOTE])
def readers(request, tmp_path: Path) -> Iterator[Readers]:
    r: Readers = OverHTTP(tmp_path, tmp_path / "cache") if request.param == REMOTE else FACTORIES[request.param]()
    yield r
    r.close()


@pytest.fixture
def shard(tmp_path: Path) -> tuple[Path, list[tuple[int, int]]]:
    path = tmp_path / "s.tfrecord"
    return path, _write(path, RECORDS)


def _open(readers: Readers, path: Path) -> ShardReader:
    return readers.open(str(path))


def test_size_identity_and_ranges(readers: Readers, shard) -> None:
    path, _ = shard
    data = path.read_bytes()
    r = _open(readers, path)
    try:
        assert r.size == len(data)
        assert r.pread(10, 0) == data[:10]
        assert r.pread(100_000, 12_345) == data[12_345:112_345]
        assert r.pread(50, len(data) - 20) == data[-20:]      # short only at the end
        assert r.pread(10, len(data) + 5) == b""
        ident = r.identity
    finally:
        r.close()
    os.utime(path, ns=(1, 1))
    r = _open(readers, path)
    try:
        assert r.identity != ident, "identity must change when the file may have"
    finally:
        r.close()


def test_records_and_their_checksums(readers: Readers, shard, tmp_path: Path) -> None:
    path, spans = shard
    r = _open(readers, path)
    try:
        assert [r.record(o, n) for o, n in spans] == RECORDS
    finally:
        r.close()
    bad = bytearray(path.read_bytes())
    o, n = spans[3]
    bad[o + tfrecord.HEADER + n // 2] ^= 0xFF
    damaged = tmp_path / "bad.tfrecord"
    damaged.write_bytes(bytes(bad))
    r = _open(readers, damaged)
    try:
        with pytest.raises(DataLoss):
            r.record(o, n)
        assert len(r.record(o, n, verify=False)) == n
        with pytest.raises(DataLoss):
            r.borrow(3, o, n)
    finally:
        r.close()


def test_borrow_and_serve_in_order_and_out_of_order(readers: Readers, shard) -> None:
    """Records lent in order (which the local reader reads ahead) and out of order hold the same
    bytes, and ``serve`` answers the same bytes of them whether it answers with bytes, memory or
    a descriptor and position."""
    path, spans = shard
    big = [i for i, (_, n) in enumerate(spans) if n >= 64 << 10]

    def following(i: int) -> tuple[int, int] | None:
        return spans[i] if i in big else None

    prepared: list[int] = []

    def prepare(index: int, offset: int, data: memoryview) -> int:
        prepared.append(index)
        return len(data)

    r = _open(readers, path)
    try:
        for order in (big, list(reversed(big)), big):
            for i in order:
                o, n = spans[i]
                lent = r.borrow(i, o, n, following=following, prepare=prepare)
                try:
                    assert bytes(lent.data) == RECORDS[i]
                    if lent.prepared is not None:
                        assert lent.prepared == (n,)
                finally:
                    lent.done()
                start = o + tfrecord.HEADER
                assert as_bytes(r.serve(start + 7, 1000)) == RECORDS[i][7:1007]
                assert as_bytes(r.serve(start, 0)) == b""
    finally:
        r.close()


def test_the_reader_can_be_chosen_by_the_environment(monkeypatch) -> None:
    """How scripts/test runs the mount suite a second time on the plain reader."""
    monkeypatch.delenv(READER_ENV, raising=False)
    assert isinstance(default_readers(), LocalReaders)
    monkeypatch.setenv(READER_ENV, "support.plain_reader:PlainReader")
    chosen = default_readers()
    assert isinstance(chosen, ReaderClass) and chosen.cls is PlainReader and chosen.name == "PlainReader"
