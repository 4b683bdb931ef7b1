"""Framing: masked CRC32C, headers, reading records, compression sniffing (the walk past\ndamage and inflating are in test_salvage)."""

from __future__ import annotations

import io
import os
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrfs.format import tfrecord
from tfrfs.errors import DataLoss


def _shard(records: list[bytes], compression: str = tfrecord.NONE) -> bytes:
    buf = io.BytesIO()
    w = tfrecord.StreamWriter(buf, compression)
    for r in records:
        w.write(r)
    w.close()
    return buf.getvalue()


def test_masked_crc_matches_crc32c_definition() -> None:
    # CRC-32C of "123456789" is 0xE3069283 (RFC 3720); masking rotates right by 15 and adds a constant.
    crc = 0xE3069283
    assert tfrecord.masked_crc(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    header = tfrecord.frame(b"")[:12]
    assert tfrecord.parse_header(header) == 0


def test_frame_layout() -> None:
    framed = tfrecord.frame(b"abc")
    assert len(framed) == 3 + tfrecord.OVERHEAD
    assert struct.unpack("<Q", framed[:8])[0] == 3
    assert framed[12:15] == b"abc"
    assert tfrecord.check_data(framed[15:], b"abc")


@given(records=st.lists(st.binary(max_size=300), max_size=20))
@settings(max_examples=60, deadline=None)
def test_iter_records_round_trip(records: list[bytes], tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("s") / "x.tfrecord"
    path.write_bytes(_shard(records))
    assert list(tfrecord.iter_records(path)) == records


def test_data_crc_failure_raises_dataloss(tmp_path) -> None:
    data = bytearray(_shard([b"payload"]))
    data[14] ^= 1
    p = tmp_path / "c.tfrecord"
    p.write_bytes(bytes(data))
    fd = os.open(p, os.O_RDONLY)
    with pytest.raises(DataLoss):
        tfrecord.read_record(fd, 0, 7)
    assert tfrecord.read_record(fd, 0, 7, verify=False) == bytes(data[12:19])
    os.close(fd)


@pytest.mark.parametrize("size", [100, 1 << 20])   # small records are read with their footer, large apart
def test_read_record_checks_every_byte(size: int, tmp_path) -> None:
    payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    good = _shard([payload])
    p = tmp_path / "r.tfrecord"
    for flip in (12, 12 + size - 1, 12 + size, len(good) - 1):   # first and last data byte, footer
        bad = bytearray(good)
        bad[flip] ^= 0x40
        p.write_bytes(bytes(bad))
        fd = os.open(p, os.O_RDONLY)
        with pytest.raises(DataLoss):
            tfrecord.read_record(fd, 0, size)
        os.close(fd)
    for cut in (len(good) - 1, len(good) - 4, 12 + size // 2):
        p.write_bytes(good[:cut])
        fd = os.open(p, os.O_RDONLY)
        with pytest.raises(DataLoss, match="cut short"):
            tfrecord.read_record(fd, 0, size)
        os.close(fd)
    p.write_bytes(good)
    fd = os.open(p, os.O_RDONLY)
    assert tfrecord.read_record(fd, 0, size) == payload
    os.close(fd)


@pytest.mark.parametrize("comp", [tfrecord.GZIP, tfrecord.ZLIB])
def test_compressed_sniff(comp: str) -> None:
    packed = _shard([b"a" * 100, b"", b"b"], comp)
    assert tfrecord.sniff(packed[:4096]) == comp


def test_sniff_prefers_plain_header_even_with_gzip_magic() -> None:
    # A plain shard whose first length happens to start with 1f 8b.
    length = 0x8B1F
    data = _shard([b"x" * length])
    assert data[:2] == b"\x1f\x8b"
    assert tfrecord.sniff(data[:4096]) == tfrecord.NONE


def test_sniff_rejects_other_files() -> None:
    assert tfrecord.sniff(b'{"name": "mnist"}') is None
    assert tfrecord.sniff(zlib.compress(b"not a tfrecord stream at all")) is None
