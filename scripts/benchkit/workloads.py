"""The read phases, the same for every tool: find, ls -lR, reading every small file from a list
and by walking the tree, reading the ~2 MB files, and random record access, all over one reader
(os.open, os.read of 1 MiB until EOF, os.close); Phase describes each for the schedule and the
tables."""

from __future__ import annotations

import argparse
import os
import random
import shlex
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import progress, raise_error, timed_shell
from .tools import Tool


CHUNK = 1 << 20


def read_file(path: str) -> int:
    fd = os.open(path, os.O_RDONLY)
    n = 0
    try:
        while True:
            b = os.read(fd, CHUNK)
            if not b:
                break
            n += len(b)
    finally:
        os.close(fd)
    return n


def read_files(root: Path, rels: list[str]) -> int:
    base = str(root) + "/"
    total = 0
    for rel in rels:
        total += read_file(base + rel)
    return total


def read_record(folder: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(folder, onerror=raise_error):
        for f in files:
            total += read_file(os.path.join(dirpath, f))
    return total


Sample = dict[str, float]


@dataclass
class ReadInputs:
    """What the read phases need besides the mount."""
    lists: dict[str, list[str]]
    meta: dict[str, Any]
    args: argparse.Namespace


def find_small(tool: Tool, inp: ReadInputs) -> Sample:
    t, out = timed_shell(f"find {shlex.quote(str(tool.mnt / 'small'))} | wc -l")
    progress(f"  find: {t:.2f}s, {int(out):,} entries")
    return {"find_s": t, "find_entries": int(out)}


def ls_small(tool: Tool, inp: ReadInputs) -> Sample:
    t, _ = timed_shell(f"ls -lR {shlex.quote(str(tool.mnt / 'small'))} > /dev/null")
    progress(f"  ls -lR: {t:.2f}s")
    return {"ls_lR_s": t}


def read_small(tool: Tool, inp: ReadInputs) -> Sample:
    rels = inp.lists["small_files"]
    t0 = time.perf_counter()
    nbytes = read_files(tool.mnt, rels)
    t = time.perf_counter() - t0
    progress(f"  {len(rels):,} files, {nbytes / 2**20:.0f} MiB in {t:.2f}s: {len(rels) / t:,.0f} files/s")
    return {"small_files": len(rels), "small_bytes": nbytes, "small_read_s": t,
            "small_files_per_s": len(rels) / t, "small_mib_per_s": nbytes / 2**20 / t}


def walk_small(tool: Tool, inp: ReadInputs) -> Sample:
    """Read every small file the way cp -r, tar or a training script's glob find them: by
    listing each folder, then reading the files it holds."""
    t0 = time.perf_counter()
    files = nbytes = 0
    for folder, _dirs, names in os.walk(tool.mnt / "small"):
        for name in names:
            nbytes += read_file(os.path.join(folder, name))
            files += 1
    t = time.perf_counter() - t0
    progress(f"  walked {files:,} files, {nbytes / 2**20:.0f} MiB in {t:.2f}s: {files / t:,.0f} files/s")
    return {"walk_files": files, "walk_s": t, "walk_files_per_s": files / t}


def read_large(tool: Tool, inp: ReadInputs) -> Sample:
    rels = inp.lists["large_files"]
    t0 = time.perf_counter()
    nbytes = read_files(tool.mnt, rels)
    t = time.perf_counter() - t0
    rate = nbytes / 2**20 / t if t else 0.0
    progress(f"  {len(rels)} files, {nbytes / 2**20:.0f} MiB in {t:.2f}s: {rate:,.0f} MiB/s")
    return {"large_files": len(rels), "large_bytes": nbytes, "large_read_s": t, "large_mib_per_s": rate}


def random_records(tool: Tool, inp: ReadInputs) -> Sample:
    """List each picked record's folders and read all its files; the same pick in every run."""
    pool = inp.lists["small_records"]
    pick = random.Random(inp.args.seed).sample(pool, min(inp.args.random, len(pool)))
    lat = []
    for rel in pick:
        t0 = time.perf_counter()
        read_record(str(tool.mnt / rel))
        lat.append((time.perf_counter() - t0) * 1000.0)
    lat.sort()
    med, p95 = statistics.median(lat), lat[min(len(lat) - 1, round(0.95 * (len(lat) - 1)))]
    progress(f"  {len(lat)} records: median {med:.2f} ms, p95 {p95:.2f} ms")
    return {"random_records": len(lat), "random_median_ms": med, "random_p95_ms": p95}


@dataclass(frozen=True)
class Phase:
    name: str
    work: Callable[[Tool, ReadInputs], Sample] | None   # None: the index build, timed by the mount itself
    shown: tuple[str, ...]                               # its table figures whose samples are printed
    times: int = 1                                       # pairs of runs per --repeat
    ceiling: bool = False                                # plain files take their turn too


INDEX = Phase("index", None, ("index_s",))
READ_PHASES = [
    Phase("find", find_small, ("find_s",)),
    Phase("ls -lR", ls_small, ("ls_lR_s",)),
    Phase("read small files", read_small, ("small_files_per_s",)),
    Phase("walk and read small files", walk_small, ("walk_files_per_s",)),
    Phase("read large files", read_large, ("large_mib_per_s",), times=3, ceiling=True),
    Phase("random records", random_records, ("random_median_ms", "random_p95_ms")),
]
