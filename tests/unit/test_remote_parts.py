"""The parts of remote sources that need no server: the index file, ``-o`` options, what a listing
entry says about an object, and the block cache's bound."""

from __future__ import annotations

import datetime as dt
import struct
from array import array
from pathlib import Path

import pytest

from tfrfs.index import idxfile
from tfrfs.errors import UsageError
from tfrfs.storage.remote_reader import BlockCache
from tfrfs.storage.fsspec_store import Store, cache_key, is_url, object_info, parse_options


def test_index_file_round_trip_is_four_bytes_a_record() -> None:
    offsets = array("Q", range(0, 16 * 10_001, 16))
    data = idxfile.dump({"size": 160_016, "identity": "etag:x", "compression": "NONE"}, offsets)
    meta, back = idxfile.load(data)
    assert back == offsets and back.typecode == "I"   # kept as stored: 4 bytes a record in memory too
    assert meta["count"] == 10_000 and meta["width"] == 4 and meta["identity"] == "etag:x"
    (hlen,) = struct.unpack_from("<I", data, 8)
    assert len(data) - 12 - hlen == 4 * 10_001


def test_index_file_of_a_stream_past_4_gib_keeps_its_offsets() -> None:
    offsets = array("Q", [0, 5 << 30, (5 << 30) + 100])
    meta, back = idxfile.load(idxfile.dump({}, offsets))
    assert list(back) == [0, 5 << 30, (5 << 30) + 100] and meta["width"] == 8


@pytest.mark.parametrize("damage", ["magic", "header", "offsets", "short", "version"])
def test_damaged_index_files_are_refused(damage: str) -> None:
    data = bytearray(idxfile.dump({"size": 48}, array("Q", [0, 16, 32, 48])))
    (hlen,) = struct.unpack_from("<I", data, 8)
    if damage == "magic":
        data[0] ^= 1
    elif damage == "header":
        data[12] = ord("[")
    elif damage == "offsets":
        data[-1] ^= 1
    elif damage == "short":
        del data[-2:]
    else:
        data[12:12 + hlen] = bytes(data[12:12 + hlen]).replace(b'"version": %d' % idxfile.VERSION, b'"version": 2')
    with pytest.raises(idxfile.IndexFileError):
        idxfile.load(bytes(data))


def test_store_options_are_typed_and_checked() -> None:
    assert parse_options(["anon=true,requester_pays=False", "retries=2", "timeout=1.5", "endpoint_url=http://h:9"]) == {
        "anon": True, "requester_pays": False, "retries": 2, "timeout": 1.5, "endpoint_url": "http://h:9"}
    with pytest.raises(UsageError):
        parse_options(["anon"])
    with pytest.raises(UsageError):
        parse_options(["=1"])


def test_urls_are_told_from_paths() -> None:
    assert is_url("s3://b/p") and is_url("gs://b") and is_url("HTTPS://h/x") and is_url("http://h/")
    assert not is_url("/data/x.tfrecord") and not is_url("ftp://h/x") and not is_url("s3:/b")


def test_object_identity_and_time_from_a_listing_entry() -> None:
    store = Store.__new__(Store)   # only url_of is used: no file system needed
    store.protocol = "https"
    when = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
    s3 = object_info(store, {"name": "https://h/a", "size": 10, "ETag": '"abc"', "LastModified": when})
    assert s3.identity == "etag:abc:10" and s3.mtime_ns == int(when.timestamp()) * 10**9
    gcs = object_info(store, {"name": "https://h/a", "size": 10, "generation": "17", "etag": "zz",
                              "updated": "2024-05-01T12:00:00.000Z"})
    assert gcs.identity == "generation:17:10" and gcs.mtime_ns == s3.mtime_ns
    http = object_info(store, {"name": "https://h/a", "size": 3, "Last-Modified": "Wed, 01 May 2024 12:00:00 GMT"})
    assert http.identity == f"mtime:{s3.mtime_ns}:3" and http.mtime_ns == s3.mtime_ns
    assert cache_key("s3://b/a", "etag:1") != cache_key("s3://b/a", "etag:2")


def test_block_cache_keeps_at_most_its_capacity_least_recently_used_out(tmp_path: Path) -> None:
    cache = BlockCache(tmp_path, capacity=3 * 100)
    for n in range(3):
        cache.put("k", n, bytes([n]) * 100)
    assert cache.read("k", 0, 10, 20) == bytes([0]) * 10   # block 0 is now the most recently used
    cache.put("k", 3, b"\x03" * 100)
    assert cache.size == 300
    assert cache.read("k", 1, 0, 1) is None                 # the least recently used went
    assert cache.read("k", 0, 0, 1) == b"\x00" and cache.read("k", 3, 99, 100) == b"\x03"
    assert not (tmp_path / "k" / "1").exists()
    again = BlockCache(tmp_path, capacity=3 * 100)          # a later mount finds what is there
    assert again.size == 300 and again.read("k", 2, 0, 2) == b"\x02\x02"
    smaller = BlockCache(tmp_path, capacity=100)            # and a smaller bound is kept at once
    assert smaller.size == 100


def test_a_block_cache_that_cannot_write_costs_no_read(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    cache = BlockCache(blocker, capacity=1 << 20)   # its folder is a file: nothing can be kept
    cache.put("k", 0, b"x" * 10)
    assert cache.read("k", 0, 0, 1) is None and cache.size == 0
