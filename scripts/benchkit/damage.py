"""--damage: how fast tfrfs gets past damage (SPEC 6), measured on shards made for it.

Four shards of the same sound records (~2 KB Examples, 64 MiB of them) are written with a
different damage in the middle: RANDOM garbage, ZEROS, and RECORDS whose every header is broken
(the built-in sample's Examples and SequenceExamples: JPEG/PNG images, raw pixels, labels,
boxes; one bit of each length checksum flipped: the worst case for the resync, which must test
every candidate in real record data), each DAMAGE MiB long (default 256), plus the SOUND shard with none. For each:

  scan MB/s   the resync alone (salvage.find_sound over the damaged bytes, page cache warm):
              the issue's target is at least 50 MB/s of garbage;
  index s     `tfrfs index` with an empty cache (page cache dropped when root), end to end;
  verify s    `tfrfs verify` (every checksum and parse);
  repair s    `tfrfs repair --no-backup` on a copy.

The sound shard's columns are the baseline the damage adds to.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tfrfs.format import proto
from tfrfs.format import salvage
from tfrfs.format import tfrecord

from .common import OUT, progress

CASES = ("sound", "random", "zeros", "records")


def _record(rng: random.Random, size: int) -> bytes:
    ex = proto.Example()
    ex.features.feature["image/encoded"].bytes_list.value.append(rng.randbytes(size))
    ex.features.feature["label"].int64_list.value.append(rng.randrange(1000))
    return ex.SerializeToString()


def _damage(kind: str, size: int, rng: random.Random) -> bytes:
    if kind == "random":
        return b"".join(rng.randbytes(min(1 << 20, size - i)) for i in range(0, size, 1 << 20))
    if kind == "zeros":
        return bytes(size)
    # Real records with every header broken: the built-in sample's (JPEG and PNG images, raw
    # pixel arrays, labels, boxes, sequences), one bit of each length checksum flipped, so the
    # resync tests every candidate in real record data all the way.
    import tempfile

    from tfrfs.sample import write_sample
    with tempfile.TemporaryDirectory() as tmp:
        records = [r for p in write_sample(Path(tmp)) if p.name.endswith(".tfrecord")
                   for r in tfrecord.iter_records(p)]
    out = bytearray()
    while len(out) < size:
        framed = bytearray(tfrecord.frame(rng.choice(records)))
        framed[9] ^= 0x01
        out += framed
    return bytes(out[:size])


def build(folder: Path, sound_mib: int, damage_mib: int) -> dict[str, tuple[Path, int]]:
    """One shard per case: half the sound records, the damage, the other half."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(5)
    half = b"".join(tfrecord.frame(_record(rng, 2000)) for _ in range(sound_mib * 2**20 // 2 // 2040))
    made = {}
    for kind in CASES:
        path = folder / f"{kind}.tfrecord"
        dmg = b"" if kind == "sound" else _damage(kind, damage_mib * 2**20, random.Random(9))
        if not path.exists() or path.stat().st_size != 2 * len(half) + len(dmg):
            path.write_bytes(half + dmg + half)
        made[kind] = (path, len(dmg))
    return made


def _drop_caches() -> None:
    if os.geteuid() == 0:
        subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=False)


def _timed_cli(*args: str) -> float:
    _drop_caches()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tfrfs", *args], capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode not in (0, 1) or "Traceback" in proc.stderr:
        raise RuntimeError(f"tfrfs {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed


def _scan_mb_s(path: Path, start: int, damaged: int) -> float | None:
    """MB/s of the resync alone over the damaged bytes that start at ``start``."""
    if not damaged:
        return None
    with open(path, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        f.read()   # warm: the scan, not the disk
        t0 = time.perf_counter()
        found = salvage.find_sound(lambda n, off: os.pread(fd, n, off), size, start + 1)
        elapsed = time.perf_counter() - t0
    if found is None or found < start + damaged:
        raise RuntimeError(f"{path}: resync found {found}, expected the records after {start + damaged}")
    return (found - start) / elapsed / 1e6


def measure_damage(args: argparse.Namespace) -> dict[str, Any]:
    work = OUT / "damage"
    progress(f"building the damaged shards ({args.damage_mib} MiB of damage each) in {work}")
    shards = build(work / "src", 64, args.damage_mib)
    rows: dict[str, Any] = {}
    for kind, (path, damaged) in shards.items():
        progress(f"{kind}: scan, index, verify, repair")
        half = (path.stat().st_size - damaged) // 2
        row: dict[str, Any] = {"damage_bytes": damaged, "shard_bytes": path.stat().st_size,
                               "scan_mb_s": _scan_mb_s(path, half, damaged)}
        cache = work / "cache"
        shutil.rmtree(cache, ignore_errors=True)
        row["index_s"] = _timed_cli("index", str(path), "--cache-dir", str(cache))
        row["verify_s"] = _timed_cli("verify", str(path))
        copy = work / "repair" / path.name
        copy.parent.mkdir(exist_ok=True)
        shutil.copyfile(path, copy)
        row["repair_s"] = _timed_cli("repair", "--no-backup", str(copy))
        copy.unlink()
        with open(path, "rb") as f:
            head = f.read(12)
        (first_len,) = struct.unpack_from("<Q", head)
        row["records_each_side"] = half // (first_len + tfrecord.OVERHEAD)
        rows[kind] = row
    return rows


def print_damage(rows: dict[str, Any]) -> None:
    print("\nDamaged shards (SPEC 6): 64 MiB of sound ~2 KB records around the damage")
    head = ("case", "damage", "resync scan", "index (cold)", "verify", "repair")
    table = [head]
    for kind, r in rows.items():
        scan = "-" if r["scan_mb_s"] is None else f"{r['scan_mb_s']:,.0f} MB/s"
        table.append((kind, f"{r['damage_bytes'] / 2**20:,.0f} MiB", scan, f"{r['index_s']:.2f} s",
                      f"{r['verify_s']:.2f} s", f"{r['repair_s']:.2f} s"))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for n, row in enumerate(table):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print("random: garbage; zeros: a zeroed range; records: real record data whose every header is broken "
          "(nothing to skip fast).\nTarget: a resync of at least 50 MB/s of garbage.")
