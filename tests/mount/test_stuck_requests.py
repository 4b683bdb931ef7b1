"""A request must never hang the mount: ``mkdir`` of a new shard folder with every ``--records``
value (it once looped for ever, and every process touching the mount hung with it), and a request
that runs past its limit is logged with its stack and named by ``tfrfs status``.

A hung FUSE request leaves the caller in an uninterruptible sleep that no signal ends, so each
step runs as a subprocess: when it has not returned in time, the daemon is killed (the kernel
then fails the request with ENOTCONN), and the test fails instead of blocking the suite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.daemons import daemon_pid, wait_gone
from tfrfs.format import proto

from conftest import force_unmount, run_tfrfs

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from test_index import example, write_shard  # noqa: E402

pytestmark = pytest.mark.mount


def with_blob(i: int, size: int) -> bytes:
    ex = proto.Example()
    ex.features.feature["id"].int64_list.value.append(i)
    ex.features.feature["blob"].bytes_list.value.append(bytes(size))
    return ex.SerializeToString()


def within(seconds: float, mnt: Path, *cmd: str) -> subprocess.CompletedProcess:
    """Run ``cmd``; if it is not done within ``seconds``, kill the daemon of ``mnt`` (which ends the
    hung request), unmount, and fail."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        pid = daemon_pid(mnt)
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid)
        proc.communicate(timeout=30)
        force_unmount(mnt)
        pytest.fail(f"{' '.join(cmd)} did not return within {seconds} s: the mount hung")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.parametrize("records", [None, "example", "sequence", "raw"])
def test_mkdir_of_a_new_shard_returns(records: str | None, tmp_path: Path, tfrfs_mount) -> None:
    src = tmp_path / "src"
    src.mkdir()
    write_shard(src / "a.tfrecord", [example(id=i) for i in range(3)])
    mnt = tfrfs_mount(src, "--rw", *(("--records", records) if records else ()))
    made = within(20, mnt, "mkdir", str(mnt / "new.tfrecord"))
    assert made.returncode == 0, made.stderr
    assert within(20, mnt, "ls", str(mnt)).stdout.split() == ["a.tfrecord", "new.tfrecord"]
    # The new shard holds the mount's record kind: what --records says, else its shards'.
    kind = os.getxattr(mnt / "new.tfrecord", "user.tfrfs.records").decode()
    assert kind == (records or "example")


def test_a_request_past_its_limit_is_logged_and_named_by_status(tmp_path: Path, tfrfs_mount, http_server,
                                                                 http_proxy, monkeypatch) -> None:
    """A read that waits on a slow store longer than the limit (here 1 s, through
    TFRFS_SLOW_REQUEST_S): the log names it with its stack, and ``tfrfs status`` says what the
    daemon is busy with, while the request still runs; once it ends, both say so."""
    src = tmp_path / "src"
    src.mkdir()
    # Records of 200 KB, indexed beside the shard: the mount reads no record until one is asked for.
    write_shard(src / "a.tfrecord", [with_blob(i, 200_000) for i in range(40)])
    run_tfrfs("index", str(src), "--beside", check=True)
    proxy = http_proxy(http_server(src))
    monkeypatch.setenv("TFRFS_SLOW_REQUEST_S", "1")
    mnt = tfrfs_mount(proxy.url)
    proxy.latency = 4.0
    reader = subprocess.Popen(["cat", str(mnt / "a.tfrecord" / "000038" / "id.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while "has run for" not in tfrfs_mount.log_text(mnt):
            assert time.monotonic() < deadline, tfrfs_mount.log_text(mnt)
            time.sleep(0.1)
        status = run_tfrfs("status", str(mnt), timeout=60)
        assert "busy with one request" in status.stdout, status.stdout + status.stderr
        log = tfrfs_mount.log_text(mnt)
        assert "(most recent call last)" in log and "File " in log, log
    finally:
        proxy.latency = 0.0
        out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0 and out == "[38]\n", err
    deadline = time.monotonic() + 10
    while "ended after" not in tfrfs_mount.log_text(mnt):
        assert time.monotonic() < deadline, tfrfs_mount.log_text(mnt)
        time.sleep(0.1)
    assert "busy with one request" not in run_tfrfs("status", str(mnt)).stdout
