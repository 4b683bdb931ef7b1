"""The block cache of remote shards, counted at the server (README, "Remote sources").

A remote shard is read in aligned 1 MiB blocks kept on disk under the cache folder: a second
pass over the same records costs no request at all, a later mount with the same cache folder
reads none of the shard's blocks again, and one record read on a fresh cache costs exactly one
ranged GET. The shards carry an index file so that the mount itself reads only a sample of
blocks, leaving the others to be fetched by the reads under test.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from remote_support import (BLOCK, MNIST_TFDS, TFX_MNIST, block_gets, blocks_fetched, cli, gets_of,
                            n_blocks, read_file, record_offsets, show, span)

pytestmark = pytest.mark.mount



def read_all(folder: Path) -> dict[str, bytes | int]:
    """Every file under ``folder`` (relative path -> bytes, or the errno reading it gave)."""
    out: dict[str, bytes | int] = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = Path(dirpath) / name
            out[path.relative_to(folder).as_posix()] = read_file(path)
    return out


def test_second_pass_and_a_remount_fetch_nothing(realdata: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    key = "m/mnist.tfrecord"
    local_shard = realdata / TFX_MNIST
    size = local_shard.stat().st_size
    s3.upload_file(local_shard, key)
    proc = cli("index", s3.url("m"), "--beside", "--cache-dir", str(tmp_path / "indexer"))
    assert proc.returncode == 0, proc.stderr

    s3.proxy.reset()
    mnt = tfrfs_mount(s3.url("m"))
    at_mount = blocks_fetched(block_gets(s3.proxy, s3.path(key), size), size)
    assert at_mount < set(range(n_blocks(size))), "the mount scanned the shard despite its index file"

    s3.proxy.reset()
    first = read_all(mnt / "mnist.tfrecord")
    assert len(first) == 2 * 1000 and not any(isinstance(v, int) for v in first.values())
    gets = block_gets(s3.proxy, s3.path(key), size)
    fetched = blocks_fetched(gets, size)
    assert fetched == set(range(n_blocks(size))) - at_mount, show(gets)
    assert sum(span(r, size)[1] - span(r, size)[0] + 1 for r in gets) == sum(
        min(BLOCK, size - n * BLOCK) for n in fetched), f"a block was fetched twice:\n{show(gets)}"

    s3.proxy.reset()
    assert read_all(mnt / "mnist.tfrecord") == first
    assert s3.proxy.requests == [], f"the second pass made requests:\n{show(s3.proxy.requests)}"

    assert cli("umount", str(mnt)).returncode == 0
    s3.proxy.reset()
    again = tfrfs_mount(s3.url("m"))    # the same cache folder
    late = [r for r in gets_of(s3.proxy, s3.path(key)) if span(r, size)[0] > 0]
    assert not late, f"the remount read blocks of the shard:\n{show(late)}"
    s3.proxy.reset()
    assert read_all(again / "mnist.tfrecord") == first
    assert not gets_of(s3.proxy, s3.path(key)), show(s3.proxy.requests)


def _one_record(local_shard: Path, avoid: set[int], seed: str) -> int:
    """A record wholly inside one block that the mount did not read (chosen at random)."""
    offsets = record_offsets(local_shard)
    inside = [i for i in range(len(offsets) - 1)
              if offsets[i] // BLOCK == (offsets[i + 1] - 1) // BLOCK and offsets[i] // BLOCK not in avoid]
    return random.Random(seed).choice(inside)


@pytest.mark.parametrize("store", ["s3", "http"])
def test_one_record_on_a_fresh_cache_is_one_ranged_get(store: str, realdata: Path, s3, http_server, http_proxy,
                                                      tfrfs_mount, tmp_path: Path) -> None:
    """S3 with a ``NAME.tfrfs-idx`` written there by ``tfrfs index --beside``; HTTP with the DALI
    index a local ``tfrfs index --format dali`` wrote beside the served shard."""
    name = Path(MNIST_TFDS).name
    local_shard = realdata / MNIST_TFDS
    size = local_shard.stat().st_size
    if store == "s3":
        s3.upload_file(local_shard, f"one/{name}")
        assert cli("index", s3.url("one"), "--beside", "--cache-dir", str(tmp_path / "ix")).returncode == 0
        proxy, url, path = s3.proxy, s3.url("one"), s3.path(f"one/{name}")
    else:
        site = tmp_path / "site"
        site.mkdir()
        shutil.copy2(local_shard, site / name)
        assert cli("index", str(site), "--format", "dali", "--cache-dir", str(tmp_path / "ix")).returncode == 0
        assert (site / f"{name}.idx").is_file()
        proxy = http_proxy(http_server(site))
        url, path = f"{proxy.url}/", f"/{name}"
    proxy.reset()
    # Listed, not from the manifest index --beside wrote too: the index is then checked at mount,
    # and what is measured below is the record's read alone (test_remote_manifest measures the
    # manifest's way, which checks the index when the shard is first touched).
    mnt = tfrfs_mount(url, "--no-manifest")
    at_mount = blocks_fetched(block_gets(proxy, path, size), size)
    assert len(at_mount) < n_blocks(size), f"the mount scanned the shard:\n{show(gets_of(proxy, path))}"

    index = _one_record(local_shard, at_mount, f"{store}-{tmp_path.name}")
    proxy.reset()
    data = read_file(mnt / name / f"{index:06d}" / "label.json")
    assert isinstance(data, bytes) and data.startswith(b"[") and data.endswith(b"]\n"), data
    gets = gets_of(proxy, path)
    assert len(gets) == 1 and gets[0].range_header is not None, \
        f"record {index}: expected one ranged GET of the shard, got\n{show(proxy.requests)}"
    first, last = span(gets[0], size)
    assert first % BLOCK == 0 and last - first < 2 * BLOCK, show(gets)
