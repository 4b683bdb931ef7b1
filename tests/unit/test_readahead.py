"""Reading large records ahead: what is handed over is exactly what a read would give, a
damaged record is left for the usual read to report, and a read-only tree reads ahead only when
a shard's large records are read in order, serves their images from the shard, and reuses the
buffers it read them into."""

from __future__ import annotations

import io
import os
import random
import threading
import time
from pathlib import Path

import pytest
from PIL import Image

from tfrfs.format import proto
from tfrfs.storage import readahead
from tfrfs.view import records
from tfrfs.format import tfrecord
from tfrfs.dataset.assembly import open_mount
from tfrfs.storage.local_reader import LocalReaders
from tfrfs.errors import DataLoss
from tfrfs.storage.readahead import MAX_AHEAD, ReadAhead
from tfrfs.view.nodes import as_bytes
from tfrfs.view.tree import Tree


def _write(path: Path, records: list[bytes]) -> list[tuple[int, int]]:
    """Write a shard; the (offset, length) of each record."""
    spans, pos = [], 0
    with open(path, "wb") as f:
        for r in records:
            f.write(tfrecord.frame(r))
            spans.append((pos, len(r)))
            pos += len(r) + tfrecord.OVERHEAD
    return spans


def _flip(path: Path, pos: int) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= 0x01
    path.write_bytes(bytes(data))


def test_hands_over_what_was_read(tmp_path: Path) -> None:
    # Sizes and places that are not multiples of a block, a last record that ends the file.
    records = [os.urandom(n) for n in (100_000, 1, 0, 300_000, 4096 - 16, 70_001)]
    spans = _write(tmp_path / "s.tfrecord", records)
    fd = os.open(tmp_path / "s.tfrecord", os.O_RDONLY)
    ahead = ReadAhead()
    try:
        for i, (off, n) in enumerate(spans):
            ahead.start(i, fd, off, n)
            ahead.start(i, fd, off, n)        # asked twice: read once
            record = ahead.take(i)
            assert record is not None and bytes(record.data()) == records[i]
            ahead.give_back(record)
            assert ahead.take(i) is None      # handed over once
        assert ahead.taken == len(records)
        assert ahead.take("never started") is None
    finally:
        ahead.close()
        os.close(fd)


def test_prepare_runs_on_the_worker_after_the_check(tmp_path: Path) -> None:
    records = [os.urandom(90_000), os.urandom(90_000), os.urandom(90_000)]
    spans = _write(tmp_path / "s.tfrecord", records)
    _flip(tmp_path / "s.tfrecord", spans[2][0] + tfrecord.HEADER + 7)
    fd = os.open(tmp_path / "s.tfrecord", os.O_RDONLY)
    ahead = ReadAhead()
    seen: list[tuple[str, bytes]] = []

    def prepare(record: readahead.Record) -> int:
        seen.append((threading.current_thread().name, bytes(record.data())))
        return len(record.data())

    def fail(record: readahead.Record) -> int:
        raise ValueError("cannot")
    try:
        ahead.start(0, fd, *spans[0], prepare)
        ahead.start(1, fd, *spans[1], fail)
        first, second = ahead.take(0), ahead.take(1)
        assert first is not None and first.prepared == 90_000
        assert seen == [(seen[0][0], records[0])] and seen[0][0].startswith("tfrfs-readahead")
        # A prepare that fails costs only what it made: the record is handed over without it.
        assert second is not None and second.prepared is None and bytes(second.data()) == records[1]
        ahead.start(2, fd, *spans[2], prepare)   # damaged: never prepared
        assert ahead.take(2) is None and len(seen) == 1
    finally:
        ahead.close()
        os.close(fd)


def test_damaged_or_cut_record_is_left_to_the_caller(tmp_path: Path) -> None:
    path = tmp_path / "s.tfrecord"
    spans = _write(path, [os.urandom(70_000), os.urandom(70_000)])
    _flip(path, spans[0][0] + tfrecord.HEADER + 5)
    fd = os.open(path, os.O_RDONLY)
    ahead = ReadAhead()
    try:
        ahead.start("crc", fd, *spans[0])
        ahead.start("cut", fd, spans[1][0], spans[1][1] + 10)   # longer than the file holds
        assert ahead.take("crc") is None and ahead.take("cut") is None
        assert ahead.taken == 0
        with pytest.raises(DataLoss):          # the caller's own read says what is wrong
            tfrecord.read_record_into(fd, *spans[0], bytearray(spans[0][1] + tfrecord.FOOTER))
    finally:
        ahead.close()
        os.close(fd)


def test_keeps_at_most_max_ahead_and_stops_on_close(tmp_path: Path) -> None:
    records = [os.urandom(80_000) for _ in range(MAX_AHEAD + 2)]
    spans = _write(tmp_path / "s.tfrecord", records)
    fd = os.open(tmp_path / "s.tfrecord", os.O_RDONLY)
    ahead = ReadAhead()
    hung = False
    try:
        for i, span in enumerate(spans[:MAX_AHEAD]):
            ahead.start(i, fd, *span)
        time.sleep(0.5)   # those reads are done: dropping them below recycles their buffers at once
        more = threading.Thread(target=lambda: [ahead.start(i, fd, *spans[i]) for i in range(MAX_AHEAD, len(spans))],
                                daemon=True)
        more.start()
        more.join(10)
        hung = more.is_alive()
        assert not hung, "start() hung while dropping finished reads"
        # The oldest were dropped for the newest; those are still there, whole.
        assert all(ahead.take(i) is None for i in range(len(spans) - MAX_AHEAD))
        for i in range(len(spans) - MAX_AHEAD, len(spans)):
            record = ahead.take(i)
            assert record is not None and bytes(record.data()) == records[i]
        ahead.close()
        ahead.start(0, fd, *spans[0])            # closed: nothing more is read
        assert ahead.take(0) is None
    finally:
        if not hung:   # else close() would wait for the lock the hung thread holds
            ahead.close()
        os.close(fd)


def _noise_jpeg(seed: int) -> bytes:
    rnd = random.Random(seed)
    img = Image.frombytes("RGB", (256, 256), rnd.randbytes(256 * 256 * 3))
    out = io.BytesIO()
    img.save(out, "JPEG", quality=95)
    assert len(out.getvalue()) > 64 << 10
    return out.getvalue()


def _example(image: bytes, n: int) -> bytes:
    ex = proto.Example()
    ex.features.feature["image/encoded"].bytes_list.value.append(image)
    ex.features.feature["n"].int64_list.value.append(n)
    return ex.SerializeToString()


def _read_all(tree: Tree, path: str) -> bytes:
    """A file's bytes, taken where the FUSE adapter takes them from."""
    node = tree.lookup(path)
    return as_bytes(tree.serve(node, tree.stat(node).size, 0))


def test_local_reader_reads_the_next_record_ahead_when_read_in_order(tmp_path: Path, monkeypatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    images = [_noise_jpeg(i) for i in range(6)]
    buffers: list[int] = []   # the sizes of the buffers the read-ahead mapped
    real_mmap = readahead.mmap.mmap

    def counting(fileno: int, length: int, *args, **kwargs):
        if fileno == -1:   # (anonymous memory: not a file such as an index mapped)
            buffers.append(length)
        return real_mmap(fileno, length, *args, **kwargs)
    monkeypatch.setattr(readahead.mmap, "mmap", counting)
    spans = _write(src / "big.tfrecord", [_example(img, i) for i, img in enumerate(images)])
    bad = 4   # its image is damaged: read ahead, found wanting, reported by the usual read
    _flip(src / "big.tfrecord", spans[bad][0] + tfrecord.HEADER + spans[bad][1] // 2)
    readers = LocalReaders()
    m = open_mount(str(src), cache_dir=str(tmp_path / "cache"), readers=readers)
    tree = m.tree
    try:
        # Out of order: nothing is read ahead.
        for i in (5, 2, 0):
            assert _read_all(tree, f"/big.tfrecord/{i:06d}/image/encoded.jpg") == images[i]
        assert readers.ahead.taken == 0
        # In order: from the second record on, each next one is read ahead and handed over.
        readers2 = LocalReaders()
        m2 = open_mount(str(src), cache_dir=str(tmp_path / "cache"), readers=readers2)
        tree2 = m2.tree
        built_on: dict[int, str] = {}
        index_at = {offset + tfrecord.HEADER: i for i, (offset, _) in enumerate(spans)}
        render = records.render_in_shard

        def recording(data, options, *, shard, data_offset, pin=None):
            built_on[index_at[data_offset]] = threading.current_thread().name
            return render(data, options, shard=shard, data_offset=data_offset, pin=pin)
        monkeypatch.setattr(records, "render_in_shard", recording)
        try:
            for i in range(6):
                path = f"/big.tfrecord/{i:06d}/image/encoded.jpg"
                if i == bad:
                    with pytest.raises(DataLoss):
                        _read_all(tree2, path)
                else:
                    assert _read_all(tree2, path) == images[i]
                    assert _read_all(tree2, f"/big.tfrecord/{i:06d}/n.json") == f"[{i}]\n".encode()
            # Reading record 1 (after 0) started 2 and 3, then each record taken starts the one
            # two after it. 4 was read ahead but damaged; 5, started by 3, was handed over too.
            assert MAX_AHEAD == 2
            assert readers2.ahead.taken == 3
            # Their views were built on the worker, once read and checked; the others' here.
            assert sorted(i for i, name in built_on.items() if name.startswith("tfrfs-readahead")) == [2, 3, 5]
            assert all(built_on[i] == threading.current_thread().name for i in (0, 1))
            # Every image is served from the shard (libfuse copies it from there): none is held
            # in the buffers the records were read into, which went back to be read into again.
            # (The damaged record's files cannot even be looked up: SPEC 6, EIO.)
            with pytest.raises(DataLoss):
                tree2.lookup(f"/big.tfrecord/{bad:06d}/image/encoded.jpg")
            for i in range(6):
                if i != bad:
                    node = tree2.lookup(f"/big.tfrecord/{i:06d}/image/encoded.jpg")
                    fd, pos, count = tree2.serve(node, 1 << 20, 5)   # type: ignore[misc]
                    assert count == len(images[i]) - 5 and os.pread(fd, count, pos) == images[i][5:]
            # Four records went through the read-ahead (2, 3, 4 and 5) in at most as many buffers
            # as are read into at once and kept spare: records are not each given new memory.
            assert 0 < len(buffers) <= MAX_AHEAD + readahead._SPARE_BUFFERS - 1
            assert [e for e in tree2.errors.render().decode().splitlines() if '"index": 4' in e]
        finally:
            m2.close()
    finally:
        m.close()
