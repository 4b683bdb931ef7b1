"""The write-back side (--rw mounts): writing a new feature file through the mount, and
`tfrfs commit` of one changed label against cp + sync of the same shard file, each with the
daemon's peak memory; the write-back table that reports them."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .common import WORK, progress, run, timed_shell
from .datasets import build_commit_dataset, build_write_source
from .report import fmt, print_columns, target_cell
from .schedule import drop_caches
from .tools import PeakWatch, Profiler, Tfrfs, force_unmount, proc_cpu, proc_io

WB_BLOCK = 1 << 20        # the writer's block size, as dd bs=1M
COMMIT_TARGET = 0.5       # the goal: commit at least half as fast as cp of the same shard files
STALL_EVERY = 0.05        # the stall probe asks the mount this often during a commit
STALL_MAX_TARGET = 0.5    # the goal: no read or listing during a commit waits longer than this,
STALL_MEDIAN_TARGET = 0.1  # and half of them no longer than this


def write_timed(path: Path, total: int) -> tuple[float, float]:
    """Write ``total`` bytes in 1 MiB os.write calls, as dd bs=1M; returns (seconds from open to the
    last write returning, seconds in close). No fsync: close is where tfrfs checks the content and
    stages it durably (its staging fsyncs), so the close is timed too."""
    # Random bytes: the value is neither text nor an image by its first bytes, so it stays a .bin.
    block = memoryview(os.urandom(WB_BLOCK))
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = total
        while left:
            left -= os.write(fd, block[:min(left, WB_BLOCK)])
        t1 = time.perf_counter()
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)   # raises if tfrfs refuses the content
    return t1 - t0, time.perf_counter() - t1


def measure_write(args: argparse.Namespace, profiler: Profiler | None) -> dict[str, Any]:
    """A new ``.bin`` feature of ``--write-mib`` MiB in a record of a --rw mount."""
    total = args.write_mib * 2**20
    src = build_write_source(WORK / "wb-write-src")
    cache = WORK / "wb-write-cache"
    shutil.rmtree(cache, ignore_errors=True)
    tool = Tfrfs(WORK / "mnt-wb-write", src, cache, rw=True)
    r: dict[str, Any] = {"bytes": total, "block": WB_BLOCK, "fsync": False}
    tool.mount()
    try:
        target = tool.mnt / "scratch-00000-of-00001.tfrecord" / "000000" / "blob.bin"
        os.sync()   # nothing of earlier phases left to write back while this one is timed
        progress(f"tfrfs --rw: writing {args.write_mib} MiB into {target.relative_to(tool.mnt)}")
        if profiler:
            profiler.start(tool.pid, "tfrfs-write")
        io0, cpu0 = proc_io(tool.pid), proc_cpu(tool.pid)
        try:
            with PeakWatch(tool.pid) as watch:
                write_s, close_s = write_timed(target, total)
                io1 = proc_io(tool.pid)
        finally:
            if profiler:
                profiler.stop()
        r["daemon_cpu_s"] = round(proc_cpu(tool.pid) - cpu0, 3)
        r["write_s"], r["close_s"] = write_s, close_s
        r["seconds"] = write_s + close_s
        r["mib_per_s"] = total / 2**20 / r["seconds"]
        # Every FUSE request is one read of /dev/fuse by the daemon: its read syscalls during the
        # writes (close excluded) tell how finely the kernel cut them.
        requests = io1.get("syscr", 0) - io0.get("syscr", 0)
        r["fuse_requests"] = requests
        r["kib_per_request"] = total / 1024 / requests if requests > 0 else None
        r["memory"] = watch.result()
        size = os.stat(target).st_size
        if size != total:
            raise RuntimeError(f"{target}: {size} bytes after the write, expected {total}")
        progress(f"  {r['mib_per_s']:.0f} MiB/s ({write_s:.2f}s writing, {close_s:.2f}s in close), "
                 f"~{requests} FUSE requests, daemon peak {r['memory']['peak_mib']:.0f} MiB")
    finally:
        tool.umount()   # commits the tiny scratch dataset; it is thrown away below
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    return r


def time_cp(files: list[Path], dest: Path) -> float:
    """cp of ``files`` into the sibling folder ``dest``, then sync of the copies and the folder:
    commit fsyncs its new shard and the folder, so cp's bytes must reach the disk too."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir()
    copies = [dest / f.name for f in files]
    cmd = (f"cp {' '.join(shlex.quote(str(f)) for f in files)} {shlex.quote(str(dest))}/ && "
           f"sync {' '.join(shlex.quote(str(c)) for c in copies)} {shlex.quote(str(dest))}")
    drop_caches()
    warm_up(["cp", "--version"], ["sync", "--version"])
    try:
        t, _ = timed_shell(cmd)
    finally:
        shutil.rmtree(dest, ignore_errors=True)
    return t


def warm_up(*cmds: list[str]) -> None:
    """Run each command once after caches were dropped: the shard bytes are to be read cold, not
    the program (a cold Python start reads a hundred files and would be counted as commit time)."""
    for cmd in cmds:
        run(cmd)


def _flip_label(path: Path) -> int:
    """Change the one-value label at ``path`` (through the mount) to another one-digit value."""
    old = json.loads(path.read_text())
    new = old[0] ^ 1 if 0 < old[0] < 10 else 1
    with open(path, "w") as f:
        f.write(json.dumps([new]) + "\n")
    return new


def _shard_stamps(src: Path, files: list[str]) -> dict[str, tuple[int, int, int]]:
    return {f: (st.st_ino, st.st_mtime_ns, st.st_size) for f in files for st in [os.stat(src / f)]}


def _check_commit(result: dict[str, Any], meta: dict[str, Any], target: str, before: dict[str, tuple[int, int, int]],
                  after: dict[str, tuple[int, int, int]]) -> None:
    """The commit rewrote the one changed shard (new inode and mtime, same size and record count)
    and left every other shard file alone."""
    want = meta["records"][meta["files"].index(target)]
    shards = result.get("shards", [])
    if not result.get("ok") or [(s["relpath"], s["action"], s["records"]) for s in shards] != [
            (target, "rewritten", want)]:
        raise RuntimeError(f"unexpected commit result: {result}")
    b, a = before[target], after[target]
    if a[0] == b[0] or a[1] == b[1] or a[2] != b[2]:
        raise RuntimeError(f"{target} was not rewritten as expected: (ino, mtime, size) {b} -> {a}")
    moved = [f for f in meta["files"] if f != target and before[f] != after[f]]
    if moved:
        raise RuntimeError(f"commit touched unchanged shards: {moved}")


def measure_commit(args: argparse.Namespace, profiler: Profiler | None) -> dict[str, Any]:
    """One changed label in a --commit-mib dataset; `tfrfs commit` timed against cp of the same shard."""
    src, meta = build_commit_dataset(args.commit_mib, args.commit_shards, args.rebuild)
    mnt = WORK / "mnt-wb-commit"
    force_unmount(mnt)
    # A run that died with edits staged would make this commit do more than one record.
    run([sys.executable, "-m", "tfrfs", "discard", str(src)])
    shard_no = len(meta["files"]) // 2
    target = meta["files"][shard_no]
    count = meta["records"][shard_no]
    rec = f"{count // 2:0{max(6, len(str(count - 1)))}d}"
    shard_bytes = (src / target).stat().st_size
    r: dict[str, Any] = {"dataset": meta, "shard": target, "record": rec, "shard_bytes": shard_bytes,
                         "cold": os.geteuid() == 0}

    progress(f"cp of {target} ({shard_bytes / 2**20:.0f} MiB) to a sibling folder, then sync")
    r["cp_s"] = time_cp([src / target], src.with_name(src.name + "-cp"))
    r["cp_mib_per_s"] = shard_bytes / 2**20 / r["cp_s"]
    progress(f"  {r['cp_s']:.2f}s, {r['cp_mib_per_s']:.0f} MiB/s")

    tool = Tfrfs(mnt, src, WORK / "wb-commit-cache", rw=True)
    tool.mount()
    try:
        label = tool.mnt / target / rec / "label.json"
        r["label"] = _flip_label(label)
        before = _shard_stamps(src, meta["files"])
        drop_caches()
        warm_up([sys.executable, "-m", "tfrfs", "--version"])
        progress(f"tfrfs --rw: commit of one changed record ({target}/{rec}/label.json)")
        if profiler:
            profiler.start(tool.pid, "tfrfs-commit")
        cpu0 = proc_cpu(tool.pid)
        try:
            with PeakWatch(tool.pid) as watch:
                t0 = time.perf_counter()
                run([sys.executable, "-m", "tfrfs", "commit", str(tool.mnt)])
                r["commit_s"] = time.perf_counter() - t0
        finally:
            if profiler:
                profiler.stop()
        r["daemon_cpu_s"] = round(proc_cpu(tool.pid) - cpu0, 3)
        r["memory"] = watch.result()
        result = json.loads((tool.mnt / ".tfrfs" / "commit").read_text())
        _check_commit(result, meta, target, before, _shard_stamps(src, meta["files"]))
        if json.loads(label.read_text()) != [r["label"]]:
            raise RuntimeError(f"{label}: the committed label does not read back as {r['label']}")
        r["daemon_commit_s"] = result.get("seconds")
        r["rewritten_bytes"] = sum(s["bytes"] for s in result["shards"])
        r["commit_mib_per_s"] = r["rewritten_bytes"] / 2**20 / r["commit_s"]
        r["ratio"] = r["commit_mib_per_s"] / r["cp_mib_per_s"]
        # Without the start-up of the `tfrfs commit` process (~0.1 s warm): what the daemon itself took.
        secs = r["daemon_commit_s"]
        r["daemon_mib_per_s"] = r["rewritten_bytes"] / 2**20 / secs if secs else None
        r["daemon_ratio"] = r["daemon_mib_per_s"] / r["cp_mib_per_s"] if secs else None
        progress(f"  {r['commit_s']:.2f}s ({r['daemon_commit_s']}s in the daemon), {r['commit_mib_per_s']:.0f} MiB/s,"
                 f" {r['ratio']:.2f}x cp; daemon peak {r['memory']['peak_mib']:.0f} MiB")
    finally:
        tool.umount()
    return r


class _Probe(threading.Thread):
    """Times one request to the mount (``ask``) every ``STALL_EVERY`` seconds until stopped."""

    def __init__(self, name: str, ask: Callable[[], object]) -> None:
        super().__init__(name=f"probe-{name}", daemon=True)
        self.ask = ask
        self.seconds: list[float] = []
        self.failures: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                self.ask()
            except OSError as exc:
                self.failures.append(str(exc))
            took = time.perf_counter() - t0
            self.seconds.append(took)
            self.stop.wait(max(0.0, STALL_EVERY - took))

    def result(self) -> dict[str, Any]:
        s = sorted(self.seconds)
        return {"n": len(s), "max_s": s[-1] if s else None, "median_s": statistics.median(s) if s else None,
                "failures": self.failures[:5], "failed": len(self.failures)}


def measure_commit_stall(args: argparse.Namespace) -> dict[str, Any]:
    """How long the mount keeps a reader waiting while it commits: one record changed in a shard of
    ``--stall-mib`` MiB, and during its `tfrfs commit` a `cat` of another record's file of that
    shard and an `ls` of the shard folder, each every ``STALL_EVERY`` s, timed (max and median)."""
    src, meta = build_commit_dataset(args.stall_mib, 1, args.rebuild)
    mnt = WORK / "mnt-wb-stall"
    force_unmount(mnt)
    run([sys.executable, "-m", "tfrfs", "discard", str(src)])
    target, count = meta["files"][0], meta["records"][0]
    width = max(6, len(str(count - 1)))
    rec, other = f"{count // 2:0{width}d}", f"{count // 4:0{width}d}"
    r: dict[str, Any] = {"shard": target, "shard_bytes": (src / target).stat().st_size, "every_s": STALL_EVERY}
    tool = Tfrfs(mnt, src, WORK / "wb-stall-cache", rw=True)
    tool.mount()
    try:
        shard = tool.mnt / target
        _flip_label(shard / rec / "label.json")
        other_label = shard / other / "label.json"
        want = other_label.read_bytes()
        drop_caches()
        warm_up([sys.executable, "-m", "tfrfs", "--version"])
        progress(f"tfrfs --rw: commit of {target} ({r['shard_bytes'] / 2**20:.0f} MiB) while reading "
                 f"{other}/label.json and listing the shard every {STALL_EVERY * 1000:.0f} ms")

        def cat() -> None:
            if other_label.read_bytes() != want:
                raise OSError(f"{other_label}: other content during the commit")
        probes = [_Probe("cat", cat), _Probe("ls", lambda: os.listdir(shard))]
        for p in probes:
            p.start()
        t0 = time.perf_counter()
        try:
            run([sys.executable, "-m", "tfrfs", "commit", str(tool.mnt)])
        finally:
            r["commit_s"] = time.perf_counter() - t0
            for p in probes:
                p.stop.set()
            for p in probes:
                p.join()
        r["cat"], r["ls"] = probes[0].result(), probes[1].result()
        for name in ("cat", "ls"):
            got = r[name]
            progress(f"  {name}: {got['n']} during a {r['commit_s']:.2f}s commit, max {fmt(got['max_s'])}s, "
                     f"median {fmt(got['median_s'])}s" + (f", {got['failed']} failed" if got["failed"] else ""))
    finally:
        tool.umount()
    return r


def measure_writeback(args: argparse.Namespace, profiler: Profiler | None) -> dict[str, Any]:
    wb: dict[str, Any] = {"loadavg_start": os.getloadavg()}
    if getattr(args, "only_stall", False):
        wb["stall"] = measure_commit_stall(args)
        wb["loadavg_end"] = os.getloadavg()
        wb["table"] = stall_rows(wb["stall"])
        return wb
    wb["write"] = measure_write(args, profiler)
    wb["commit"] = measure_commit(args, profiler)
    wb["stall"] = measure_commit_stall(args)
    wb["loadavg_end"] = os.getloadavg()
    wb["table"] = writeback_rows(wb) + stall_rows(wb["stall"])
    return wb


def stall_rows(st: dict[str, Any]) -> list[dict[str, Any]]:
    """The stall probe's rows: max and median latency of each probe during the commit."""
    mib = st["shard_bytes"] / 2**20
    rows = []
    for name, what in (("cat", "cat of another record's file"), ("ls", "ls of the shard folder")):
        got = st[name]
        for stat, target in (("max_s", STALL_MAX_TARGET), ("median_s", STALL_MEDIAN_TARGET)):
            value = got[stat]
            rows.append({"label": f"{what} during a {mib:.0f} MiB commit, {stat[:-2]}", "unit": "s",
                         "tfrfs": value, "cp": None, "ratio": None, "target": f"<= {target:g} s",
                         "target_met": None if value is None else value <= target})
    return rows


def writeback_rows(wb: dict[str, Any]) -> list[dict[str, Any]]:
    """The write-back section: (label, unit, tfrfs, cp, ratio, target) per row."""
    w, c = wb["write"], wb["commit"]
    mib = w["bytes"] / 2**20
    data_mib = c["dataset"]["bytes"] / 2**20

    def row(label: str, unit: str, value: float | None, cp: float | None = None, ratio: float | None = None,
            target: float | None = None) -> dict[str, Any]:
        return {"label": label, "unit": unit, "tfrfs": value, "cp": cp, "ratio": ratio,
                "target": f">= {target:g}x" if target is not None else None,
                "target_met": None if target is None or ratio is None else ratio >= target}

    return [
        row(f"write {mib:.0f} MiB feature file, open..close", "MiB/s", w["mib_per_s"]),
        row("  of which close (check + stage)", "s", w["close_s"]),
        row("  data per FUSE write request (~)", "KiB", w["kib_per_request"]),
        row("  daemon peak memory in the write", "MiB", w["memory"]["peak_mib"]),
        row(f"commit {data_mib:,.0f} MiB, 1 record changed", "MiB/s", c["commit_mib_per_s"], c["cp_mib_per_s"],
            c["ratio"], COMMIT_TARGET),
        row("  tfrfs commit (wall) / cp + sync", "s", c["commit_s"], c["cp_s"]),
        row("  the daemon's own commit time", "s", c["daemon_commit_s"]),
        row("  the same in MiB/s", "MiB/s", c["daemon_mib_per_s"], c["cp_mib_per_s"], c["daemon_ratio"]),
        row("  daemon peak memory in the commit", "MiB", c["memory"]["peak_mib"]),
    ]


def print_writeback(wb: dict[str, Any]) -> None:
    head = ["write-back", "unit", "tfrfs", "cp", "ratio", "target met"]
    body = [[r["label"], r["unit"], fmt(r["tfrfs"]), "" if r["cp"] is None else fmt(r["cp"]),
             "" if r["ratio"] is None else f"{r['ratio']:.2f}x", target_cell(r)] for r in wb["table"]]
    if "write" not in wb:
        print()
        print_columns(head, body)
        _print_stall(wb["stall"])
        return
    w, c = wb["write"], wb["commit"]
    ds = c["dataset"]
    print()
    print(f"write-back (--rw mounts); commit dataset {ds['name']}: {sum(ds['records']):,} records in "
          f"{ds['shards']} shards, {ds['bytes'] / 2**20:,.0f} MiB (ratio: commit MiB/s over cp MiB/s)")
    print_columns(head, body)
    print(f"write: {w['block'] // 2**10} KiB os.write calls of random bytes into a new .bin feature of a record, "
          f"timed from open to close returning, no fsync (close is where tfrfs checks the content and stages "
          f"it durably); {w['write_s']:.2f}s writing + {w['close_s']:.2f}s in close; ~{w['fuse_requests']} "
          f"FUSE requests (daemon reads of /dev/fuse); daemon CPU {w['daemon_cpu_s']:.2f}s; memory "
          f"{w['memory']['rss_before_mib']:.0f} MiB before")
    how = "caches dropped before each, both read cold" if c["cold"] else "not root: caches not dropped, both warm"
    print(f"commit: rewrote {c['shard']} ({c['rewritten_bytes'] / 2**20:.0f} MiB; new inode and mtime, same "
          f"size and record count, other shards untouched); MiB/s over the bytes of the rewritten shard and the "
          f"wall time of `tfrfs commit`; cp: the same shard file to a sibling folder, then `sync` of the copy "
          f"and the folder (commit fsyncs both); {how}; daemon CPU {c['daemon_cpu_s']:.2f}s; memory "
          f"{c['memory']['rss_before_mib']:.0f} MiB before (peak: VmHWM reset by clear_refs at the start"
          f"{'' if c['memory']['vmhwm_reset'] else ' REFUSED, so RSS sampled every 10 ms'})")
    _print_stall(wb["stall"])


def _print_stall(st: dict[str, Any]) -> None:
    failed = st["cat"]["failed"] + st["ls"]["failed"]
    print(f"stall probe: during `tfrfs commit` of {st['shard']} ({st['shard_bytes'] / 2**20:.0f} MiB, one record "
          f"changed; {st['commit_s']:.2f}s), a read of another record's label.json and a listing of the shard "
          f"folder, each every {st['every_s'] * 1000:.0f} ms on its own thread ({st['cat']['n']} reads, "
          f"{st['ls']['n']} listings" + (f"; {failed} FAILED: {st['cat']['failures'] + st['ls']['failures']}"
                                          if failed else "") + ")")
