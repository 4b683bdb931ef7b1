"""``scripts/bench --scale``: a dataset of millions of tiny records (``scaledata``), as a user meets it.

Measured, each with the page cache emptied first (when root): ``verify`` (the yardstick for reading
every record), a cold ``index`` of the offsets only, the first ``inspect`` (which reads the schema),
a second ``inspect``, a warm mount, and in a ``--rw`` mount the time ``echo '[1]' > .../newkey.json``
takes to return: right after the mount (the schema may still be being read) and once it is read.
The mounts end with ``tfrfs umount --discard``: the dataset is never changed.

``--code DIR`` measures the tfrfs of another checkout (an older commit) with the same steps, for a
before/after table: what it lacks (``index --no-schema``) is left out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .common import WORK, progress
from .scaledata import scale_dataset
from .tools import find_pids, fstype_at, proc_mem


def _drop_caches() -> None:
    if os.geteuid() == 0:
        subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=False)


class Cli:
    """``python -m tfrfs`` of one checkout."""

    def __init__(self, code: Path | None) -> None:
        self.env = dict(os.environ)
        if code is not None:
            self.env["PYTHONPATH"] = str(code)
        self.code = code

    def run(self, *args: str, ok: tuple[int, ...] = (0, 1)) -> tuple[float, str]:
        t0 = time.perf_counter()
        # Run from the checkout measured: ``python -m`` looks in the current folder first.
        proc = subprocess.run([sys.executable, "-m", "tfrfs", *args], capture_output=True, text=True, env=self.env,
                              cwd=str(self.code) if self.code is not None else None)
        elapsed = time.perf_counter() - t0
        if proc.returncode not in ok or "Traceback" in proc.stderr:
            raise RuntimeError(f"tfrfs {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return elapsed, proc.stdout

    def knows(self, option: str, command: str) -> bool:
        _, out = self.run(command, "--help", ok=(0,))
        return option in out


def _create_ms(path: Path) -> float:
    t0 = time.perf_counter()
    with open(path, "w") as f:
        f.write("[1]\n")
    return (time.perf_counter() - t0) * 1000


def measure_scale(records: int, shards: int, code: Path | None) -> dict[str, Any]:
    data = scale_dataset(records, shards)
    cli = Cli(code)
    cache = WORK / "scale-cache"
    mnt = WORK / "scale-mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"records": records, "shards": shards, "code": str(code) if code else "this checkout",
                           "mb": sum(p.stat().st_size for p in data.glob("*.tfrecord-*")) / 1e6}
    first_shard = sorted(p.name for p in data.glob("*.tfrecord-*"))[0]
    offsets_only = ["--no-schema"] if cli.knows("--no-schema", "index") else []

    def fresh_index() -> float:
        shutil.rmtree(cache, ignore_errors=True)
        _drop_caches()
        return cli.run("index", str(data), "--cache-dir", str(cache), *offsets_only)[0]

    progress("scale: verify")
    _drop_caches()
    out["verify_s"] = cli.run("verify", str(data), "--cache-dir", str(cache))[0]
    progress("scale: index (offsets only)")
    out["index_cold_s"] = fresh_index()
    progress("scale: first inspect (reads the schema)")
    _drop_caches()
    out["inspect_first_s"] = cli.run("inspect", str(data), "--cache-dir", str(cache))[0]
    progress("scale: second inspect")
    _drop_caches()
    out["inspect_again_s"] = cli.run("inspect", str(data), "--cache-dir", str(cache))[0]

    def rw_mount() -> tuple[float, int | None]:
        _drop_caches()
        t0 = time.perf_counter()
        cli.run("mount", str(data), str(mnt), "--rw", "--cache-dir", str(cache), "--log", str(WORK / "scale.log"),
                ok=(0,))
        elapsed = time.perf_counter() - t0
        pids = find_pids(mnt, "--daemon")
        return elapsed, pids[-1] if pids else None

    def umount_discard() -> None:
        cli.run("umount", "--discard", str(mnt), ok=(0,))
        deadline = time.monotonic() + 60
        while fstype_at(mnt) and time.monotonic() < deadline:
            time.sleep(0.05)

    progress("scale: --rw mount with the schema known; a new key")
    out["mount_warm_s"], pid = rw_mount()
    try:
        time.sleep(0.5)
        out["newkey_built_ms"] = _create_ms(mnt / first_shard / "000000" / "newkey.json")
        out["newkey_second_ms"] = _create_ms(mnt / first_shard / "000001" / "otherkey.json")
        if pid is not None:
            out["daemon_rss_mib"] = proc_mem(pid)["VmRSS"]
    finally:
        umount_discard()
    progress("scale: --rw mount with the schema unknown; a new key at once")
    fresh_index()
    out["mount_cold_schema_s"], _ = rw_mount()
    try:
        out["newkey_first_ms"] = _create_ms(mnt / first_shard / "000000" / "newkey.json")
    finally:
        umount_discard()
    return out


def print_scale(r: dict[str, Any]) -> None:
    rows = [
        ("verify (reads and checks every record)", f"{r['verify_s']:.1f} s"),
        ("index, offsets only, cold", f"{r['index_cold_s']:.1f} s"),
        ("inspect, first (reads the schema)", f"{r['inspect_first_s']:.1f} s"),
        ("inspect, again", f"{r['inspect_again_s']:.2f} s"),
        ("mount --rw (index known)", f"{r['mount_warm_s']:.2f} s"),
        ("new key, schema being read since mount", f"{r['newkey_first_ms']:,.0f} ms"),
        ("new key, schema known", f"{r['newkey_built_ms']:,.0f} ms"),
        ("another new key", f"{r['newkey_second_ms']:,.0f} ms"),
    ]
    if "daemon_rss_mib" in r:
        rows.append(("daemon RSS after a new key", f"{r['daemon_rss_mib']:.0f} MiB"))
    print(f"\nscale: {r['records']:,} records in {r['shards']} shards ({r['mb']:.0f} MB); tfrfs of {r['code']}")
    width = max(len(a) for a, _ in rows)
    for a, b in rows:
        print(f"  {a.ljust(width)}  {b.rjust(10)}")
