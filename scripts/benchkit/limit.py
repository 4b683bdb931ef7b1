"""``scripts/bench --limit``: tfrfs against the limit, the same files as plain files on the same disk.

The dataset of the read side (``--small`` records of ~5 KB JPEGs in ``--shards`` shards, ``--large``
records of ~2 MB PNGs) is mounted, and its tree (``.tfrfs`` aside) copied once with ``cp -r`` into
``bench-out/work/limit-plain-NAME/``: the plain files. Then, for each of the two, ``--repeat`` times
(3; --quick 1), alternating which goes first:

  cold  = ``sync; echo 3 > drop_caches`` and a fresh mount (plain: the drop only);
  warm  = the same phase again at once, on the same mount.

  find (cold, warm)           ``find DIR | wc -l`` over the small part
  ls -lR (cold, warm)         ``ls -lR DIR > /dev/null`` over the small part
  small files, N readers      ``xargs -P N cat`` over every small file (files/s), cold with 1 and 4
                              readers, warm with 1
  large files (cold)          ``cat`` of every ~2 MB file (MiB/s)
  random open+read (warm)     open, read to the end and close one small file at a time, in a random
                              order (the median, p50, of the latencies)

The table shows the medians, tfrfs / plain as a ratio (for times: how many times plain's; for
rates: the share of plain's), and the goal of issue 32 beside each.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from .common import WORK, progress, run, timed_shell
from .datasets import build_dataset, derived_paths, file_lists
from .tools import Tfrfs, proc_mem

# metric -> (label, unit, lower is better, goal: the most (times) or least (rates) tfrfs/plain)
ROWS: dict[str, tuple[str, str, bool, float]] = {
    "find_cold_s": ("find, cold", "s", True, 2.0),
    "find_warm_s": ("find, warm", "s", True, 1.5),
    "ls_cold_s": ("ls -lR, cold", "s", True, float("inf")),
    "ls_warm_s": ("ls -lR, warm", "s", True, 1.5),
    "small_cold_1": ("small files, cold, 1 reader", "files/s", False, 0.9),
    "small_cold_4": ("small files, cold, 4 readers", "files/s", False, 0.8),
    "small_warm_1": ("small files, warm, 1 reader", "files/s", False, 0.0),
    "large_cold": ("large files, cold", "MiB/s", False, 0.9),
    "random_warm_ms": ("random open+read p50, warm", "ms", True, 2.0),
}


def _drop_caches() -> None:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass   # not root: every "cold" figure is warm


def _readers(root: Path, rels: list[str], n: int, list_file: Path) -> float:
    """Files/s of ``xargs -P n cat`` over ``rels`` (relative to ``root``)."""
    list_file.write_text("\0".join(rels) + "\0")
    took, _ = timed_shell(f"cd {root} && xargs -0 -P {n} -n 64 cat < {list_file} > /dev/null")
    return len(rels) / took


def _large(root: Path, rels: list[str]) -> float:
    total = 0
    t0 = time.perf_counter()
    for rel in rels:
        fd = os.open(root / rel, os.O_RDONLY)
        try:
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                total += len(chunk)
        finally:
            os.close(fd)
    return total / 2**20 / (time.perf_counter() - t0)


def _random_p50(root: Path, rels: list[str], count: int, seed: int) -> float:
    picks = random.Random(seed).sample(rels, min(count, len(rels)))
    times = []
    for rel in picks:
        t0 = time.perf_counter()
        fd = os.open(root / rel, os.O_RDONLY)
        try:
            while os.read(fd, 1 << 20):
                pass
        finally:
            os.close(fd)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


class _Side:
    """One of the two: a tfrfs mount, or the plain copy (``mount`` only empties the caches)."""

    def __init__(self, name: str, root: Path, tf: Tfrfs | None) -> None:
        self.name, self.root, self.tf = name, root, tf

    def fresh(self) -> None:
        if self.tf is not None:
            self.tf.umount()
        _drop_caches()
        if self.tf is not None:
            self.tf.mount()


def measure_limit(args: Any) -> dict[str, Any]:
    src, meta = build_dataset(args.small, args.large, args.shards, args.rebuild)
    _, list_path = derived_paths(meta, args.rebuild)
    tf = Tfrfs(WORK / "mnt-limit", src, WORK / "limit-cache")
    tf.reset_index()
    tf.mount()
    lists = file_lists(tf.mnt, meta, list_path)
    plain_root = WORK / f"limit-plain-{meta['name']}"
    if not (plain_root / ".complete").exists():
        progress(f"copying the mounted tree to {plain_root} (cp -r: the plain files)")
        shutil.rmtree(plain_root, ignore_errors=True)
        plain_root.mkdir(parents=True)
        for part in ("small", "large"):
            run(["cp", "-r", str(tf.mnt / part), str(plain_root / part)])
        os.sync()
        (plain_root / ".complete").touch()
    small, large = lists["small_files"], lists["large_files"]
    sides = [_Side("tfrfs", tf.mnt, tf), _Side("plain", plain_root, None)]
    listing = WORK / "limit-list"
    phases: list[tuple[str, Callable[[Path], float], str | None]] = [
        # (metric, measure on a root, the warm metric measured right after on the same mount)
        ("find_cold_s", lambda r: timed_shell(f"find {r / 'small'} | wc -l")[0], "find_warm_s"),
        ("ls_cold_s", lambda r: timed_shell(f"ls -lR {r / 'small'} > /dev/null")[0], "ls_warm_s"),
        ("small_cold_1", lambda r: _readers(r, small, 1, listing), "small_warm_1"),
        ("small_cold_4", lambda r: _readers(r, small, 4, listing), None),
        ("large_cold", lambda r: _large(r, large), None),
    ]
    samples: dict[str, dict[str, list[float]]] = {s.name: {} for s in sides}
    for k in range(args.repeat):
        for metric, measure, warm in phases:
            order = sides if (k + len(metric)) % 2 == 0 else sides[::-1]
            for side in order:
                side.fresh()
                progress(f"limit: {metric} ({side.name}, run {k + 1}/{args.repeat})")
                samples[side.name].setdefault(metric, []).append(measure(side.root))
                if warm is not None:
                    samples[side.name].setdefault(warm, []).append(measure(side.root))
        for side in sides:
            # warm: every small file read once before (the last phase left the caches cold)
            _readers(side.root, small, 4, listing)
            samples[side.name].setdefault("random_warm_ms", []).append(
                _random_p50(side.root, small, args.random or 500, args.seed + k))
    memory = proc_mem(tf.pid) if tf.pid is not None else None
    tf.umount()
    medians = {name: {m: statistics.median(v) for m, v in per.items()} for name, per in samples.items()}
    return {"dataset": meta, "repeat": args.repeat, "samples": samples, "medians": medians, "rss": memory,
            "small_files": len(small), "large_files": len(large)}


def print_limit(res: dict[str, Any]) -> None:
    meta = res["dataset"]
    t, p = res["medians"]["tfrfs"], res["medians"]["plain"]
    print(f"\ntfrfs against plain files on the same disk: {meta['small']} small records ({res['small_files']} "
          f"files), {res['large_files']} ~2 MB files; medians of {res['repeat']}")
    print(f"{'':34} {'tfrfs':>12} {'plain':>12} {'tfrfs/plain':>12}   goal")
    for metric, (label, unit, lower, goal) in ROWS.items():
        if metric not in t or metric not in p:
            continue
        ratio = t[metric] / p[metric] if p[metric] else float("nan")
        if lower:
            goal_text = f"<= {goal:g}x" if goal != float("inf") else ""
            ok = ratio <= goal
        else:
            goal_text = f">= {goal:g}x" if goal else ""
            ok = ratio >= goal
        mark = ("met" if ok else "NOT met") if goal_text else ""
        print(f"{label:34} {t[metric]:>9.3g} {unit:<3}{p[metric]:>9.3g} {unit:<3}{ratio:>10.2f}x   {goal_text} {mark}")
    print("(times: tfrfs/plain is how many times plain's; rates: the share of plain's)")


