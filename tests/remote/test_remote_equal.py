"""A remote source shows exactly what a local mount of the same bytes shows (SPEC 1.1).

The real data (``conftest.REALDATA``: TF-written Examples and SequenceExamples, GZIP TFX shards,
TFDS MNIST with its JSON files, two damaged shards) is put in a moto bucket and behind an HTTP
server with byte ranges, mounted from there and from the folder, and both mounts are walked:
names, modes, sizes, contents (or the errno a read gives: damaged records give EIO on both),
``user.tfrfs.*`` xattrs, ``.tfrfs/schema.json`` and ``.tfrfs/errors``. Every shard folder's
listing is compared in full, every record of the small shards in depth, and a seeded sample of
records of the large ones.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from remote_support import (CAPTCHA_VALID, CSV_GZ, EVAL_GZ, LITE_TEST, PENGUIN_GZ, PETS, SEQ_GZ, SERENGETI, TFX,
                            SNIFF, differences, every_record, gets_of, gz_shards, realdata_shards,
                            sample_records, show, snapshot, span, tfrfs_meta)

pytestmark = pytest.mark.mount



def assert_same(local: Path, remote: Path, shards: list[str], pick=sample_records) -> dict[str, tuple]:
    expected = snapshot(local, shards, pick)
    actual = snapshot(remote, shards, pick)
    diff = differences(expected, actual)
    assert not diff, "remote mount differs from the local one:\n" + "\n".join(diff)
    schema_l, errors_l = tfrfs_meta(local)
    schema_r, errors_r = tfrfs_meta(remote)
    assert schema_r == schema_l, ".tfrfs/schema.json differs"
    assert errors_r == errors_l, f".tfrfs/errors differs:\nlocal {sorted(errors_l)}\nremote {sorted(errors_r)}"
    return expected


def check_walk_covers(snap: dict[str, tuple], shards: list[str]) -> None:
    """The comparison touched every shard: its folder was listed, and unless it holds no record,
    at least one of its record folders was walked."""
    for shard in shards:
        assert shard in snap and snap[shard][0] == "dir", f"{shard}: no shard folder"
        names = snap[shard][2]
        assert isinstance(names, tuple)
        if shard != SERENGETI:
            assert names, f"{shard}: empty shard folder"
            assert f"{shard}/{names[0]}" in snap, f"{shard}: no record was compared"


def test_s3_prefix_mount_equals_local(realdata: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    s3.upload_tree(realdata, "real")
    shards = realdata_shards(realdata)
    local = tfrfs_mount(realdata, "--cache-dir", str(tmp_path / "local-cache"))
    remote = tfrfs_mount(s3.url("real"))
    snap = assert_same(local, remote, shards)
    check_walk_covers(snap, shards)
    # The damaged records read as EIO on both sides (SPEC 6), so the comparison saw them.
    assert snap[f"{PETS}/000000.bin"][3] == ("errno", 5)
    assert snap[SERENGETI][2] == ()
    # Shard times are the objects' last-modified times (SPEC 1.1); a folder's, the newest object's
    # in it (README).
    for shard in (LITE_TEST, PENGUIN_GZ):
        assert abs(os.stat(remote / shard).st_mtime - s3.last_modified(f"real/{shard}")) < 1.0
    newest = max(s3.last_modified(k) for k in s3.keys("real/tfrecord_lite/"))
    assert abs(os.stat(remote / "tfrecord_lite").st_mtime - newest) < 1.0


def test_http_folder_mount_equals_local(realdata: Path, http_server, http_proxy, tfrfs_mount, tmp_path: Path) -> None:
    server = http_server(realdata)
    proxy = http_proxy(server)
    shards = realdata_shards(realdata)
    local = tfrfs_mount(realdata, "--cache-dir", str(tmp_path / "local-cache"))
    remote = tfrfs_mount(f"{proxy.url}/")
    snap = assert_same(local, remote, shards)
    check_walk_covers(snap, shards)
    assert proxy.count("GET", ranged=True) > 0, "the shards were not read with ranged requests"


def test_s3_single_shard_url_equals_local(realdata: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    s3.upload_tree(realdata / "tfrecord_lite", "lite")
    local = tfrfs_mount(realdata / LITE_TEST, "--cache-dir", str(tmp_path / "local-cache"))
    remote = tfrfs_mount(s3.url("lite/tests/test.tfrecord"))
    assert os.listdir(remote) == ["test.tfrecord"]
    snap = assert_same(local, remote, ["test.tfrecord"], every_record)
    assert len(snap["test.tfrecord"][2]) == 42
    assert os.getxattr(remote / "test.tfrecord" / "000003", "user.tfrfs.shard") == b"test.tfrecord"


def test_s3_glob_url_equals_local_glob(realdata: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    s3.upload_tree(realdata / "captcha_recognize", "captcha")
    local = tfrfs_mount(str(realdata / "captcha_recognize" / "data" / "*.tfrecords"),
                        "--cache-dir", str(tmp_path / "local-cache"))
    remote = tfrfs_mount(s3.url("captcha/data/*.tfrecords"))
    assert sorted(os.listdir(remote)) == ["train.tfrecords", "valid.tfrecords"]
    snap = assert_same(local, remote, ["train.tfrecords", "valid.tfrecords"])
    assert len(snap["train.tfrecords"][2]) == 196


def test_http_single_shard_url_equals_local(realdata: Path, http_server, tfrfs_mount, tmp_path: Path) -> None:
    server = http_server(realdata)
    local = tfrfs_mount(realdata / CAPTCHA_VALID, "--cache-dir", str(tmp_path / "local-cache"))
    remote = tfrfs_mount(f"{server.url}/{CAPTCHA_VALID}")
    assert os.listdir(remote) == ["valid.tfrecords"]
    assert_same(local, remote, ["valid.tfrecords"], every_record)


def test_gzip_shards_list_and_read_like_local_and_are_fetched_once(realdata: Path, s3, tfrfs_mount,
                                                                  tmp_path: Path) -> None:
    """The TFX GZIP shards (SPEC 1: one compressed stream over the whole file), every record of
    the small ones and a sample of the 15000- and 4500-record SequenceExample ones; each
    compressed object is downloaded once (then decompressed into the cache), and reading its
    records costs no further request."""
    s3.upload_tree(realdata / TFX, "tfx")
    shards = [s.removeprefix("tfx/tfx/") for s in gz_shards(realdata)]
    assert len(shards) == 5
    local = tfrfs_mount(realdata / TFX, "--cache-dir", str(tmp_path / "local-cache"))
    remote = tfrfs_mount(s3.url("tfx"))
    sizes = {s: (realdata / TFX / s).stat().st_size for s in shards}
    at_mount = {s: gets_of(s3.proxy, s3.path(f"tfx/{s}")) for s in shards}
    s3.proxy.reset()
    snap = assert_same(local, remote, shards)
    counts = {PENGUIN_GZ: 100, CSV_GZ: 424, SEQ_GZ: 15000, EVAL_GZ: 4500}
    for s, n in counts.items():
        assert len(snap[s.removeprefix("tfx/tfx/")][2]) == n, s
    for s in shards:
        again = gets_of(s3.proxy, s3.path(f"tfx/{s}"))
        assert not again, f"{s}: reading its records fetched it again:\n{show(again)}"
        # Downloaded once (distinguishable from the sniffing read of its head when it is larger
        # than that). The shard not named like one is also read whole to be judged: that is
        # test_remote_index.py::test_sniffing_reads_only_the_head_of_each_object's business.
        if sizes[s] > SNIFF and s != EVAL_GZ.removeprefix("tfx/tfx/"):
            whole = [r for r in at_mount[s] if span(r, sizes[s]) == (0, sizes[s] - 1)]
            assert len(whole) == 1, f"{s}: expected one download at mount, got\n{show(at_mount[s])}"


def test_http_glob_url_equals_local_glob(realdata: Path, http_server, tfrfs_mount, tmp_path: Path) -> None:
    server = http_server(realdata)
    local = tfrfs_mount(str(realdata / "tfrecord_lite" / "tests" / "*.tfrecord"),
                        "--cache-dir", str(tmp_path / "local-cache"))
    remote = tfrfs_mount(f"{server.url}/tfrecord_lite/tests/*.tfrecord")
    assert sorted(os.listdir(remote)) == ["images.tfrecord", "test.tfrecord"]
    assert_same(local, remote, ["images.tfrecord", "test.tfrecord"], every_record)
