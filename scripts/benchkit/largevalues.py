"""--large-values: a large value written over a feature file of a --rw mount, as `cp` of a file of
random bytes over a record's ``blob.bin`` does (open with O_TRUNC, 1 MiB writes, close), then
`tfrfs commit`. For each size (--large-mib, default 100 and 1024 MiB): the daemon's peak memory
above what it held just before, during the close (where tfrfs judges the content and stages the
record) and during the commit, as MiB and as copies of the value; the time of each. The committed
shard is read back and its value compared with the file's."""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from tfrfs.format import proto
from tfrfs.format import tfrecord
from tfrfs.format.tfrecord import StreamWriter

from .common import WORK, progress, run
from .tools import PeakWatch, Tfrfs

BLOCK = 1 << 20
SHARD = "large-00000-of-00001.tfrecord"


def build_source(folder: Path) -> Path:
    """Two records, each a label and a small ``blob`` value shown as ``blob.bin``; made anew."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with open(folder / SHARD, "wb") as fh:
        w = StreamWriter(fh)
        for i in range(2):
            ex = proto.Example()
            ex.features.feature["label"].int64_list.value.append(i)
            ex.features.feature["blob"].bytes_list.value.append(b"\0" + os.urandom(63))
            w.write(ex.SerializeToString(deterministic=True))
        w.close()
    return folder


def value_file(mib: int) -> tuple[Path, str]:
    """A file of ``mib`` MiB of random bytes (kept between runs), and its SHA-256."""
    path = WORK / f"large-value-{mib}.bin"
    if not path.exists() or path.stat().st_size != mib * 2**20:
        progress(f"making {path.name}")
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(os.urandom(BLOCK))
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * BLOCK):
            h.update(chunk)
    return path, h.hexdigest()


def _committed_digest(shard: Path) -> str:
    """SHA-256 of record 0's ``blob`` in the committed shard (read here, not through the mount)."""
    for data in tfrecord.iter_records(shard):
        ex = proto.Example.FromString(data)
        return hashlib.sha256(ex.features.feature["blob"].bytes_list.value[0]).hexdigest()
    raise RuntimeError(f"{shard} holds no record")


def _write(target: Path, value: Path) -> int:
    """Open ``target`` with O_TRUNC and write ``value`` into it in 1 MiB writes; the open descriptor."""
    buf = bytearray(BLOCK)
    fd = os.open(target, os.O_WRONLY | os.O_TRUNC)
    try:
        with open(value, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                os.write(fd, memoryview(buf)[:n])
    except BaseException:
        os.close(fd)
        raise
    os.sync()   # the value's pages written back first: the close is timed, not the disk's backlog
    return fd


def _close(pid: int | None, fd: int) -> dict[str, Any]:
    with PeakWatch(pid) as watch:
        t0 = time.perf_counter()
        os.close(fd)   # raises if tfrfs refuses the value
        seconds = time.perf_counter() - t0
        time.sleep(0.2)   # the release that follows close(2) runs in the daemon too
    return {"s": seconds, **watch.result()}


def measure_one(mib: int) -> dict[str, Any]:
    value, digest = value_file(mib)
    src = build_source(WORK / "large-src")
    cache = WORK / "large-cache"
    shutil.rmtree(cache, ignore_errors=True)
    tool = Tfrfs(WORK / "mnt-large", src, cache, rw=True)
    r: dict[str, Any] = {"mib": mib}
    tool.mount()
    try:
        target = tool.mnt / SHARD / "000000" / "blob.bin"
        os.stat(target)
        progress(f"{mib} MiB: writing over {target.relative_to(tool.mnt)} (a 64-byte value)")
        r["close"] = _close(tool.pid, _write(target, value))
        progress(f"{mib} MiB: writing it again, over the value just staged")
        r["again"] = _close(tool.pid, _write(target, value))
        size = os.stat(target).st_size
        if size != mib * 2**20:
            raise RuntimeError(f"{target}: {size} bytes after the close, expected {mib * 2**20}")
        with PeakWatch(tool.pid) as watch:
            t0 = time.perf_counter()
            run([sys.executable, "-m", "tfrfs", "commit", str(tool.mnt)])
            seconds = time.perf_counter() - t0
        r["commit"] = {"s": seconds, **watch.result()}
    finally:
        tool.umount()
    if _committed_digest(src / SHARD) != digest:
        raise RuntimeError(f"the committed value differs from {value}")
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    for step in STEPS:
        m = r[step]
        m["above_mib"] = max(0.0, m["peak_mib"] - m["rss_before_mib"])
        m["copies"] = m["above_mib"] / mib
        progress(f"  {STEPS[step]}: {m['s']:.2f}s, {m['above_mib']:.0f} MiB above its RSS before "
                 f"({m['copies']:.2f} copies)")
    return r


STEPS = {"close": "close, over a 64-byte value", "again": "close, over the value staged before",
         "commit": "tfrfs commit"}


def measure_large_values(args: argparse.Namespace) -> list[dict[str, Any]]:
    return [measure_one(mib) for mib in args.large_mib]


def print_large_values(rows: list[dict[str, Any]]) -> None:
    print("\nLarge values (--rw mount): a file of random bytes written over a record's blob.bin "
          "(O_TRUNC, 1 MiB writes, close), the same again, then `tfrfs commit`")
    head = ("value", "step", "time", "peak above RSS before", "copies of the value", "RSS before")
    table = [head]
    for r in rows:
        for step, label in STEPS.items():
            m = r[step]
            table.append((f"{r['mib']:,} MiB", label, f"{m['s']:.2f} s", f"+{m['above_mib']:,.0f} MiB",
                          f"{m['copies']:.2f}", f"{m['rss_before_mib']:,.0f} MiB"))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for n, row in enumerate(table):
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    vmhwm = all(r[step]["vmhwm_reset"] for r in rows for step in STEPS)
    print("peak: the daemon's highest resident memory during the step above its RSS just before it, "
          + ("VmHWM reset by clear_refs at the start" if vmhwm else "RSS sampled every 10 ms")
          + "; copies: that over the value's size. A close includes the durable staging (fsync); the "
          "commit is `tfrfs commit` end to end; the committed value is read back and compared.")
