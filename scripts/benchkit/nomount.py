"""``scripts/bench --no-mount``: the ways in and out without a mount.

* ``tfrfs://`` (fsspec, in one process) against a tfrfs mount and against ratarmount's
  ``ratar://`` over a tar of the same tree: open, walk the small records' part (every path), then
  read every small file one after the other (files/s), cold (page cache emptied, fresh index
  caches but for tfrfs's shard indexes, which a mount has too);
* ``tfrfs pack`` of the small records' folders, as ``cp -a`` copied them out of a mount, against
  ``cp -r`` of the same folder, each followed by ``sync`` (MB/s of the folder's files).

Each reader is a process of its own (``nomount_run.py``), the best of ``--repeat`` rounds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .common import WORK, progress, run
from .datasets import build_dataset, derived_paths, file_lists, make_tar
from .tools import Ratarmount

RUNNER = Path(__file__).with_name("nomount_run.py")


def _drop_caches() -> None:
    if os.geteuid() == 0:
        subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=False)


def _reader(python: str, kind: str, where: str, cache: str, lists: Path) -> dict[str, Any]:
    _drop_caches()
    proc = subprocess.run([python, str(RUNNER), kind, where, cache, str(lists)], capture_output=True, text=True,
                          timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} reader failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _timed(cmd: list[str]) -> float:
    _drop_caches()
    t0 = time.perf_counter()
    run(cmd)
    run(["sync"])
    return time.perf_counter() - t0


def measure_no_mount(args: Any) -> dict[str, Any]:
    Ratarmount.ensure_installed()
    rat_py = str(Ratarmount.VENV / "bin" / "python")
    if subprocess.run([rat_py, "-c", "import fsspec"], capture_output=True).returncode != 0:
        progress("installing fsspec into ratarmount's venv (its ratar:// needs it)")
        run([rat_py, "-m", "pip", "install", "-q", "fsspec"])
    src, meta = build_dataset(args.small, args.large, args.shards, False)
    tar, list_path = derived_paths(meta, False)
    mnt = WORK / "mnt-nomount"
    mnt.mkdir(parents=True, exist_ok=True)
    cache = WORK / "nomount-cache"
    run([sys.executable, "-m", "tfrfs", "mount", str(src), str(mnt), "--cache-dir", str(cache)])
    packed_in = WORK / "nomount-pack-in"
    try:
        lists = file_lists(mnt, meta, list_path)
        if not tar.exists():
            make_tar(mnt, tar)
        if not packed_in.exists():
            progress("cp -a of the small records' shard folders out of the mount (pack's input)")
            tmp = packed_in.with_suffix(".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            run(["cp", "-a", str(mnt / "small"), str(tmp)])
            tmp.rename(packed_in)
        out: dict[str, Any] = {"dataset": meta, "files": len(lists["small_files"]), "rounds": []}
        for r in range(args.repeat):
            progress(f"no-mount round {r + 1}/{args.repeat}: tfrfs://, the mount, ratar://")
            shutil.rmtree(WORK / "nomount-fsspec-cache", ignore_errors=True)
            shutil.copytree(cache, WORK / "nomount-fsspec-cache")   # the shard indexes, as a mount has them
            for stale in tar.parent.glob(f"{tar.name}.index.sqlite"):
                stale.unlink()   # ratar:// builds its index on open, as tfrfs's index files are kept
            rnd = {"tfrfs_fsspec": _reader(sys.executable, "tfrfs", str(src), str(WORK / "nomount-fsspec-cache"),
                                           list_path),
                   "mount": _reader(sys.executable, "files", str(mnt), "-", list_path),
                   "ratar_fsspec": _reader(rat_py, "ratar", str(tar), "-", list_path)}
            for stale in tar.parent.glob(f"{tar.name}.index.sqlite"):
                stale.unlink()
            dest = WORK / "nomount-pack-out"
            copy = WORK / "nomount-cp-out"
            shutil.rmtree(dest, ignore_errors=True)
            shutil.rmtree(copy, ignore_errors=True)
            rnd["pack_s"] = _timed([sys.executable, "-m", "tfrfs", "pack", str(packed_in), str(dest)])
            rnd["cp_s"] = _timed(["cp", "-r", str(packed_in), str(copy)])
            shutil.rmtree(dest, ignore_errors=True)
            shutil.rmtree(copy, ignore_errors=True)
            out["rounds"].append(rnd)
        out["pack_input_bytes"] = _folder_bytes(packed_in)
        return out
    finally:
        run([sys.executable, "-m", "tfrfs", "umount", str(mnt)])


def _best(rounds: list[dict], key: str, field: str | None = None) -> float:
    return min((r[key][field] if field else r[key]) for r in rounds)


def print_no_mount(res: dict[str, Any]) -> None:
    rounds = res["rounds"]
    files = res["files"]
    mb = res["pack_input_bytes"] / 1e6
    print(f"\nno mount: {res['dataset']['name']}, {files:,} small files; best of {len(rounds)} rounds, cold")
    rows = [("tool", "open s", "walk s", "read files/s", "vs mount")]
    mount_rate = files / _best(rounds, "mount", "read_s")
    for key, label in (("tfrfs_fsspec", "tfrfs:// (fsspec, one process)"), ("mount", "tfrfs mount (files)"),
                       ("ratar_fsspec", "ratar:// (ratarmount's fsspec, one process)")):
        rate = files / _best(rounds, key, "read_s")
        rows.append((label, f"{_best(rounds, key, 'open_s'):.2f}", f"{_best(rounds, key, 'walk_s'):.2f}",
                     f"{rate:,.0f}", f"{rate / mount_rate:.2f}x"))
    pack, cp = _best(rounds, "pack_s"), _best(rounds, "cp_s")
    rows.append((f"tfrfs pack of the small records' folders ({mb:,.0f} MB)", "", f"{pack:.2f}", f"{mb / pack:,.1f} MB/s",
                 f"{cp / pack:.2f}x cp"))
    rows.append(("cp -r of the same folder, + sync", "", f"{cp:.2f}", f"{mb / cp:,.1f} MB/s", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
