"""Large values written through a --rw mount (SPEC 7): the close that stages one holds no copy of
it in the daemon; a value no record can hold (protobuf's 2 GiB) is refused with EFBIG, without
being written or read; a write the disk had no room for refuses the close. Each refusal keeps the
old value and says why in .tfrfs/errors and the log."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tfrfs.format import proto
from tfrfs.format import tfrecord

from conftest import run_tfrfs
from support.daemons import daemon_pid
from support.files import tmpfs
from support import reference

pytestmark = [pytest.mark.mount, pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse")]

SHARD = "d.tfrecord"
BLOB = f"{SHARD}/000000/blob.bin"
OLD = b"\0old value\xff" * 4
MIB = 1 << 20


def write_source(src: Path) -> None:
    src.mkdir(parents=True, exist_ok=True)
    with open(src / SHARD, "wb") as f:
        w = tfrecord.StreamWriter(f)
        for i in range(2):
            ex = proto.Example()
            ex.features.feature["label"].int64_list.value.append(i)
            ex.features.feature["blob"].bytes_list.value.append(OLD)
            w.write(ex.SerializeToString(deterministic=True))
        w.close()


def blob_of(shard: Path, record: int = 0) -> bytes:
    data = reference.written_records(shard)[record]
    return reference.values(data, "blob")[0]


def memory_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmHWM:", "VmRSS:")):
            key, value = line.split(":", 1)
            out[key] = int(value.split()[0])
    return out


def reset_peak(pid: int) -> None:
    """Start VmHWM over from the daemon's current RSS."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5\n")
    except OSError as exc:
        pytest.skip(f"cannot reset the daemon's peak memory: {exc}")


def errors_of(mnt: Path) -> list[dict]:
    return [json.loads(line) for line in (mnt / ".tfrfs" / "errors").read_text().splitlines()]


def test_closing_a_large_value_holds_no_copy_of_it(tfrfs_mount, tmp_path: Path) -> None:
    size = 64 * MIB
    src = tmp_path / "src"
    write_source(src)
    mnt = tfrfs_mount(src, "--rw")
    pid = daemon_pid(mnt)
    block = os.urandom(MIB)
    digest = hashlib.sha256()
    fd = os.open(mnt / BLOB, os.O_WRONLY | os.O_TRUNC)
    try:
        for i in range(size // MIB):
            piece = block[i:] + block[:i]
            digest.update(piece)
            assert os.write(fd, piece) == MIB
    finally:
        reset_peak(pid)
        before = memory_kib(pid)["VmRSS"]
        os.close(fd)   # judged and staged here
    above_mib = (memory_kib(pid)["VmHWM"] - before) / 1024
    # Read into memory, put into the message and serialized, the value was four copies (256 MiB).
    # Staged from its temporary file, it is none: the bound leaves room for two and some slack.
    assert above_mib < 2 * size / MIB + 32, f"the close took {above_mib:.0f} MiB above the daemon's RSS before it"
    assert os.stat(mnt / BLOB).st_size == size
    proc = run_tfrfs("commit", str(mnt))
    assert proc.returncode == 0, proc.stderr
    assert hashlib.sha256(blob_of(src / SHARD)).digest() == digest.digest()
    assert blob_of(src / SHARD, 1) == OLD


def _staging_bytes(src: Path) -> int:
    """Disk blocks taken by the journal beside the shards (sparse files count what they hold)."""
    total = 0
    for folder, _, files in os.walk(src / ".tfrfs-staging"):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def _refused_as_too_large(mnt: Path, src: Path, pid: int, mounts) -> None:
    """The old value is kept, the reason is in .tfrfs/errors and the log, and the daemon neither
    held the value nor wrote it out."""
    assert (mnt / BLOB).read_bytes() == OLD
    reasons = [e["reason"] for e in errors_of(mnt) if e.get("path") == "blob.bin"]
    assert reasons and all("2,147,483,647" in r and "the old value stays" in r for r in reasons), reasons
    assert "blob.bin" in mounts.log_text(mnt) and "2,147,483,647" in mounts.log_text(mnt)
    assert memory_kib(pid)["VmHWM"] < 512 * 1024
    assert _staging_bytes(src) < 8 * MIB


def test_a_value_past_protobufs_limit_is_refused_with_efbig(tfrfs_mount, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_source(src)
    mnt = tfrfs_mount(src, "--rw")
    pid = daemon_pid(mnt)
    reset_peak(pid)

    # truncate(1): open, ftruncate past 2 GiB, close.
    proc = subprocess.run(["truncate", "-s", "2100M", str(mnt / BLOB)], capture_output=True, text=True)
    assert proc.returncode != 0 and "File too large" in proc.stderr, proc.stderr
    _refused_as_too_large(mnt, src, pid, tfrfs_mount)

    # truncate(2) by path.
    with pytest.raises(OSError) as got:
        os.truncate(mnt / BLOB, 3 << 30)
    assert got.value.errno == errno.EFBIG
    _refused_as_too_large(mnt, src, pid, tfrfs_mount)

    # A write that ends past the limit fails at once, and so does the close after it.
    fd = os.open(mnt / BLOB, os.O_WRONLY)
    try:
        with pytest.raises(OSError) as got:
            os.pwrite(fd, b"x" * 4096, 2**31 - 100)
        assert got.value.errno == errno.EFBIG
    finally:
        with pytest.raises(OSError) as got:
            os.close(fd)
    assert got.value.errno == errno.EFBIG
    _refused_as_too_large(mnt, src, pid, tfrfs_mount)

    # A value that fits alone, in a record that then would not.
    proc = subprocess.run(["truncate", "-s", str(2**31 - 10), str(mnt / BLOB)], capture_output=True, text=True)
    assert proc.returncode != 0 and "File too large" in proc.stderr, proc.stderr
    _refused_as_too_large(mnt, src, pid, tfrfs_mount)
    assert "the record would be 2,147,483,6" in errors_of(mnt)[-1]["reason"]

    status = run_tfrfs("status", str(mnt)).stdout.splitlines()
    assert status[0] == "nothing staged", status
    refused = [line for line in status if "blob.bin: " in line]
    assert len(refused) == 4 and all("more than a record can hold" in line for line in refused), status
    proc = run_tfrfs("umount", str(mnt))
    assert proc.returncode == 0, proc.stderr
    assert blob_of(src / SHARD) == OLD


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", "16m") as d:
        yield d


def test_a_write_the_disk_had_no_room_for_refuses_the_close(small_disk: Path, tfrfs_mount, tmp_path: Path) -> None:
    src = small_disk / "src"
    write_source(src)
    mnt = tfrfs_mount(src, "--rw", mountpoint=tmp_path / "mnt")
    st = os.statvfs(small_disk)
    filler = small_disk / "filler"
    filler.write_bytes(b"\1" * (st.f_bavail * st.f_frsize - 4 * MIB))

    fd = os.open(mnt / BLOB, os.O_WRONLY | os.O_TRUNC)
    try:
        written = 0
        with pytest.raises(OSError) as got:
            while True:
                written += os.write(fd, b"\2" * MIB)
        assert got.value.errno == errno.ENOSPC
        assert 0 < written < 8 * MIB
        # Room again before the close: what was written still is not what the writer meant.
        filler.unlink()
    finally:
        with pytest.raises(OSError) as got:
            os.close(fd)
    assert got.value.errno == errno.ENOSPC
    assert (mnt / BLOB).read_bytes() == OLD
    reasons = [e["reason"] for e in errors_of(mnt) if e.get("path") == "blob.bin"]
    assert any("No space left on device" in r and "the old value stays" in r for r in reasons), reasons

    # The file is whole again once written whole.
    (mnt / BLOB).write_bytes(b"\3" * MIB)
    proc = run_tfrfs("umount", str(mnt))
    assert proc.returncode == 0, proc.stderr
    assert blob_of(src / SHARD) == b"\3" * MIB
