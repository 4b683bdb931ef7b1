"""Remote sources when the store fails (SPEC 1.1, README "Remote sources").

At mount, a store that refuses, lacks the bucket or object, or cannot be reached is bad input:
exit status 2 and one line naming the URL, nothing mounted. Once mounted, a read whose request
still fails after tfrfs's retries returns EIO and is reported (daemon log and ``.tfrfs/errors``);
everything cached keeps being served, and the same read succeeds once the store is back. The
mounts here use small ``-o retries=…,timeout=…`` so that failing takes a moment only.
"""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from pathlib import Path

import pytest

from remote_support import (BLOCK, MNIST_TFDS, TFDS_DIR, block_gets, blocks_fetched, cli, errors_naming,
                            gets_of, read_file, record_offsets, show, wait_for)

from support.servers import FaultProxy

pytestmark = pytest.mark.mount

SHARD = Path(MNIST_TFDS).name            # mnist-test.tfrecord-00000-of-00001: 10000 records, 4 blocks
FAST = ("-o", "retries=2,timeout=2")



def is_mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f)


def mount_fails(source: str, tmp_path: Path, *args: str) -> tuple[int, str]:
    """``tfrfs mount SOURCE`` expected to fail: (exit status, stderr); nothing may stay mounted."""
    mnt = tmp_path / "mnt-fail"
    mnt.mkdir(exist_ok=True)
    proc = cli("mount", source, str(mnt), "--cache-dir", str(tmp_path / "cache-fail"),
               "--log", str(tmp_path / "fail.log"), *args)
    try:
        assert not is_mounted(mnt), f"{source} was mounted: {proc.stdout}"
    finally:
        if is_mounted(mnt):
            cli("umount", str(mnt))
    return proc.returncode, proc.stderr


def assert_one_line_naming(stderr: str, url: str) -> None:
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1 and url in lines[0], f"expected one line naming {url}, got:\n{stderr}"


# --- at mount -------------------------------------------------------------------------------

def test_access_denied_at_mount_exits_2(realdata: Path, s3, tmp_path: Path) -> None:
    s3.upload_tree(realdata / TFDS_DIR, "tfds")
    s3.proxy.fail(403)
    status, err = mount_fails(s3.url("tfds"), tmp_path)
    assert status == 2, err
    assert_one_line_naming(err, s3.url("tfds"))
    assert "denied" in err.lower(), err


def test_missing_bucket_exits_2(s3, tmp_path: Path) -> None:
    status, err = mount_fails("s3://no-such-bucket/x", tmp_path)
    assert status == 2, err
    assert_one_line_naming(err, "s3://no-such-bucket/x")


def test_missing_object_exits_2(realdata: Path, s3, tmp_path: Path) -> None:
    s3.upload_tree(realdata / TFDS_DIR, "tfds")
    url = s3.url("tfds/no-such-shard.tfrecord")
    status, err = mount_fails(url, tmp_path)
    assert status == 2, err
    assert_one_line_naming(err, url)


def test_s3_down_at_mount_exits_2(realdata: Path, s3, tmp_path: Path) -> None:
    s3.upload_tree(realdata / TFDS_DIR, "tfds")
    s3.proxy.down()
    started = time.monotonic()
    status, err = mount_fails(s3.url("tfds"), tmp_path)
    assert status == 2, err
    assert_one_line_naming(err, s3.url("tfds"))
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("what", ["missing", "down"])
def test_http_missing_or_down_at_mount_exits_2(what: str, realdata: Path, http_server, http_proxy,
                                               tmp_path: Path) -> None:
    proxy = http_proxy(http_server(realdata / TFDS_DIR))
    url = f"{proxy.url}/no-such-shard.tfrecord" if what == "missing" else f"{proxy.url}/"
    if what == "down":
        proxy.down()
    status, err = mount_fails(url, tmp_path)
    assert status == 2, err
    assert_one_line_naming(err, url)


def test_rw_of_a_web_server_exits_2(realdata: Path, http_server, tmp_path: Path) -> None:
    # (A bucket prefix takes --rw, SPEC 7.1: tests/remote/test_bucket_rw.py; a web server's files
    # stay read-only.)
    url = f"{http_server(realdata).url}/{TFDS_DIR}"
    status, err = mount_fails(url, tmp_path, "--rw")
    assert status == 2, err
    assert_one_line_naming(err, url)


# --- while mounted --------------------------------------------------------------------------

class Mounted:
    """A TFDS MNIST split in the bucket with its index beside it, mounted on an empty cache:
    the mount read at most the shard's first and last blocks (the sample check), so records in
    blocks 1 and 2 are not cached. ``realdata``: the fixture's folder."""

    def __init__(self, realdata: Path, s3, tfrfs_mount, tmp_path: Path, *args: str) -> None:
        s3.upload_tree(realdata / TFDS_DIR, "tfds")
        proc = cli("index", s3.url("tfds"), "--beside", "--cache-dir", str(tmp_path / "indexer"))
        assert proc.returncode == 0, proc.stderr
        self.s3 = s3
        self.proxy: FaultProxy = s3.proxy
        self.key = f"tfds/{SHARD}"
        self.local = realdata / MNIST_TFDS
        self.size = self.local.stat().st_size
        self.proxy.reset()
        self.mnt = tfrfs_mount(s3.url("tfds"), *args)
        self.mounts = tfrfs_mount
        self.cached = blocks_fetched(block_gets(self.proxy, s3.path(self.key), self.size), self.size)
        assert self.cached <= {0, 3}, show(gets_of(self.proxy, s3.path(self.key)))
        self.offsets = record_offsets(self.local)
        self.reference = tfrfs_mount(realdata / TFDS_DIR, "--cache-dir", str(tmp_path / "local-cache"))
        self._rng = random.Random(str(tmp_path))

    def record_in(self, block: int) -> int:
        """A random record lying wholly in ``block``."""
        o = self.offsets
        return self._rng.choice([i for i in range(len(o) - 1) if o[i] // BLOCK == (o[i + 1] - 1) // BLOCK == block])

    def warm_up(self) -> int:
        """Read a record of the first block (so that block is cached); another record of that
        block, never looked at, whose bytes are now on disk."""
        first = self.record_in(0)
        assert read_file(self.file(first)) == self.expected(first)
        while (other := self.record_in(0)) == first:
            pass
        return other

    def file(self, index: int, root: Path | None = None) -> Path:
        return (root or self.mnt) / SHARD / f"{index:06d}" / "label.json"

    def expected(self, index: int) -> bytes:
        data = read_file(self.file(index, self.reference))
        assert isinstance(data, bytes)
        return data

    def log(self) -> str:
        return self.mounts.log_text(self.mnt)

    def alive(self) -> bool:
        return SHARD in os.listdir(self.mnt) and len(os.listdir(self.mnt / SHARD)) == 10000


def timed_read(path: Path) -> tuple[bytes | int, float]:
    started = time.monotonic()
    return read_file(path), time.monotonic() - started


def test_server_errors_give_eio_then_the_same_read_recovers(s3, tfrfs_mount, tmp_path: Path, realdata: Path) -> None:
    m = Mounted(realdata, s3, tfrfs_mount, tmp_path, *FAST)
    warm, cold = m.warm_up(), m.record_in(1)

    m.proxy.fail(500)
    got, took = timed_read(m.file(cold))
    assert got == errno.EIO, f"expected EIO, got {got!r}"
    assert took < 10, f"EIO took {took:.1f}s with retries=2, timeout=2"
    assert read_file(m.mnt / "dataset_info.json") == errno.EIO   # a plain file not fetched yet
    # Cached bytes are still served: a record of the first block, never looked at.
    assert read_file(m.file(warm)) == m.expected(warm)
    assert m.alive()
    # Reported: in .tfrfs/errors (naming the shard) and the daemon's log (naming the object).
    assert wait_for(lambda: errors_naming(m.mnt, SHARD)), (m.mnt / ".tfrfs" / "errors").read_text()
    assert any("500" in e["reason"] or "Internal" in e["reason"] for e in errors_naming(m.mnt, SHARD)), \
        errors_naming(m.mnt, SHARD)
    assert wait_for(lambda: f"s3://data/{m.key}" in m.log()), m.log()[-3000:]

    m.proxy.clear_faults()
    assert read_file(m.file(cold)) == m.expected(cold), "the record stayed failed after the store recovered"
    info = read_file(m.mnt / "dataset_info.json")
    assert info == (realdata / TFDS_DIR / "dataset_info.json").read_bytes()


def test_store_going_down_mid_read_gives_eio_then_recovers(realdata: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    # A timeout longer than the test: what ends the read is the store going down.
    m = Mounted(realdata, s3, tfrfs_mount, tmp_path, "-o", "retries=2,timeout=60")
    index = m.record_in(2)
    m.proxy.stall(30, match=m.key)       # the shard's GET is in flight when the store goes down
    result: list[bytes | int] = []
    reader = threading.Thread(target=lambda: result.append(read_file(m.file(index))))
    reader.start()
    time.sleep(0.5)
    assert reader.is_alive(), f"the read did not wait for the stalled store: {result}"
    m.proxy.down()
    reader.join(30)
    assert not reader.is_alive(), "the read hangs after the store went down"
    assert result == [errno.EIO], result
    assert m.alive()
    m.proxy.clear_faults()
    m.proxy.up()
    assert read_file(m.file(index)) == m.expected(index)


def test_stalled_response_past_the_timeout_gives_eio_and_the_daemon_lives(realdata: Path, s3, tfrfs_mount,
                                                                          tmp_path: Path) -> None:
    m = Mounted(realdata, s3, tfrfs_mount, tmp_path, "-o", "retries=2,timeout=1")
    warm, index = m.warm_up(), m.record_in(1)
    m.proxy.stall(6, match=m.key)
    got, took = timed_read(m.file(index))
    assert got == errno.EIO, got
    assert took < 6, f"a stalled request held the read {took:.1f}s with timeout=1, retries=2"
    assert m.alive()
    assert read_file(m.file(warm)) == m.expected(warm)
    m.proxy.clear_faults()
    assert read_file(m.file(index)) == m.expected(index)


def test_shard_deleted_after_mount_gives_eio(realdata: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    m = Mounted(realdata, s3, tfrfs_mount, tmp_path, *FAST)
    warm, index = m.warm_up(), m.record_in(2)
    m.s3.delete(m.key)
    got = read_file(m.file(index))
    assert got == errno.EIO, f"expected EIO for a record of a deleted object, got {got!r}"
    assert m.alive()
    assert read_file(m.file(warm)) == m.expected(warm)
    assert wait_for(lambda: errors_naming(m.mnt, SHARD)), (m.mnt / ".tfrfs" / "errors").read_text()


# --- commands on a URL ----------------------------------------------------------------------

def _normalised(text: str, source: str) -> str:
    return text.replace(source, "SOURCE")


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_verify_and_inspect_of_a_bucket_print_what_a_local_run_prints(command: str, realdata: Path, s3,
                                                                      tmp_path: Path) -> None:
    s3.upload_tree(realdata, "real")
    local = cli(command, str(realdata), "--cache-dir", str(tmp_path / "lc"))
    remote = cli(command, s3.url("real"), "--cache-dir", str(tmp_path / "rc"))
    assert "Traceback" not in remote.stderr, remote.stderr
    assert remote.returncode == local.returncode, remote.stderr
    if command == "verify":
        assert local.returncode == 1   # the two damaged shards
        # 42,310 sound-framed records, plus the 6 that salvage finds in pets_examples.record after
        # its damaged headers (SPEC 6)
        assert "18 shards, 42,316 records checked, 7 problem(s)" in local.stdout
    assert _normalised(remote.stdout, s3.url("real")) == _normalised(local.stdout, str(realdata))


def test_verify_over_http_prints_what_a_local_run_prints(realdata: Path, http_server, tmp_path: Path) -> None:
    server = http_server(realdata)
    local = cli("verify", str(realdata), "--cache-dir", str(tmp_path / "lc"))
    remote = cli("verify", f"{server.url}/", "--cache-dir", str(tmp_path / "rc"))
    assert remote.returncode == local.returncode == 1, remote.stderr
    assert remote.stdout == local.stdout


def test_index_out_dir_that_does_not_exist(realdata: Path, s3, tmp_path: Path) -> None:
    """``tfrfs index URL --out-dir DIR`` with DIR missing: made, or refused in one line (exit
    2) -- never a traceback."""
    s3.upload_tree(realdata / TFDS_DIR, "tfds")
    out = tmp_path / "not-there"
    proc = cli("index", s3.url("tfds"), "--out-dir", str(out), "--cache-dir", str(tmp_path / "c"))
    assert "Traceback" not in proc.stderr, proc.stderr
    if proc.returncode == 0:
        assert (out / f"{SHARD}.tfrfs-idx").is_file()
    else:
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
