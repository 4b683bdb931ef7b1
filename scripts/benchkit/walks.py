"""``scripts/bench --scale``, the commands that touch every record, each cold (page cache emptied):

* the schema of 10 million tiny records (``scale-10000000-100``): ``index`` (offsets and schema)
  against ``verify``, which reads the same bytes;
* ``reshard`` of that dataset, 100 -> 1,000 shards, from a SOURCE not indexed before (every
  checksum checked and every record tallied while copying) and from one indexed first, against
  ``cp -r`` of it and ``sync``;
* ``repair`` of a damaged 1 GiB shard (the 2 KB records of the C4-like dataset, one data byte and
  one header byte changed) against ``cat`` of it.

Two floors show what the disk alone allows, with no record read: the files a reshard to 1,000
shards writes (each new shard's bytes and an index file of its size, then one ``syncfs``), and
``cp`` + ``sync`` of the damaged shard (a repair writes the shard again and makes it durable).

Each step is the best of ``--scale-repeat`` runs (the disk image's cache on the host makes one
sample swing); ``cat`` is the best of as many, ``cp -r`` + ``sync`` the best of three (as
``--cluster`` measures it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from .cluster import _cp
from .common import WORK, progress
from .scale import _drop_caches
from .scaledata import scale_dataset, shard_files, text_dataset

WALK_RECORDS = 10_000_000
WALK_SHARDS = 100
RESHARD_TO = 1000
REPAIR_BYTES = 1 << 30


def _best(n: int, step: Callable[[], float]) -> float:
    return min(step() for _ in range(max(1, n)))


def floor_reshard(tiny: Path, work: Path, shards: int) -> float:
    """Seconds, cold, to write the files a reshard of ``tiny`` into ``shards`` writes, with no
    record read: each new shard an equal byte range of a source shard (read, then written whole,
    and handed to the disk at once as ``reshard`` does: ``sync_file_range`` WRITE, no wait),
    beside it an index file of its size (4 bytes a record), all in one new folder, then one
    ``syncfs``. One process, as ``cp``."""
    import ctypes
    sources = shard_files(tiny)
    per = shards // len(sources)
    index_bytes = bytes(4 * (WALK_RECORDS // shards + 1) + 256)
    libc = ctypes.CDLL(None, use_errno=True)
    out = work / "floor"
    shutil.rmtree(out, ignore_errors=True)
    _drop_caches()
    t0 = time.perf_counter()
    out.mkdir(parents=True)
    n = 0
    for src in sources:
        data = src.read_bytes()
        step = -(-len(data) // per)
        for k in range(per):
            fd = os.open(out / f"s-{n:05d}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data[k * step:(k + 1) * step])
                libc.sync_file_range(fd, ctypes.c_int64(0), ctypes.c_int64(0), 2)
            finally:
                os.close(fd)
            (out / f"s-{n:05d}.idx").write_bytes(index_bytes)
            n += 1
    fd = os.open(out, os.O_RDONLY)
    try:
        libc.syncfs(fd)
    finally:
        os.close(fd)
    took = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    return took


def cp_sync(path: Path, work: Path) -> float:
    """Seconds, cold, of ``cp`` of one file and ``sync``."""
    work.mkdir(parents=True, exist_ok=True)
    _drop_caches()
    t0 = time.perf_counter()
    subprocess.run(["cp", str(path), str(work / path.name)], check=True)
    subprocess.run(["sync"], check=True)
    took = time.perf_counter() - t0
    shutil.rmtree(work, ignore_errors=True)
    return took


def damaged_shard(base: Path, text: Path) -> Path:
    """About a GiB of the C4-like records in one shard, with a data byte changed a third of the way
    in and a header byte two thirds in (made once, kept beside the datasets)."""
    path = base / "damaged-1g" / "c4like.tfrecord"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    with open(tmp, "wb") as out:
        for shard in shard_files(text):
            if out.tell() >= REPAIR_BYTES:
                break
            with open(shard, "rb") as f:
                shutil.copyfileobj(f, out, 8 << 20)
    _damage(tmp)
    os.replace(tmp, path)
    return path


def _damage(path: Path) -> None:
    """A data byte flipped a third of the way in, and the header of the record two thirds in."""
    import struct
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(size // 3)
        b = f.read(1)
        f.seek(size // 3)
        f.write(bytes([b[0] ^ 0x55]))
        pos = 0
        while pos < 2 * size // 3:   # the header of the record at two thirds
            f.seek(pos)
            (length,) = struct.unpack("<Q", f.read(8))
            pos += 16 + length
        f.seek(pos + 3)
        b = f.read(1)
        f.seek(pos + 3)
        f.write(bytes([b[0] ^ 0x01]))


def measure_walks(args: Any, cli: Any) -> dict[str, Any]:
    """The figures of this part, for one checkout's ``cli`` (``scale.Cli``)."""
    base = Path(args.scale_data) if args.scale_data else WORK.parent
    tiny = scale_dataset(WALK_RECORDS, WALK_SHARDS, base)
    text = text_dataset(base, args.scale_text_records, args.scale_text_shards)
    shard = damaged_shard(base, text)
    repeat = args.scale_repeat
    out: dict[str, Any] = {"records": WALK_RECORDS, "shards": WALK_SHARDS,
                           "mb": sum(p.stat().st_size for p in shard_files(tiny)) / 1e6,
                           "repair_mb": shard.stat().st_size / 1e6}
    cache = WORK / "walks-cache"
    dest = WORK / "walks-dest"

    def fresh_cache() -> None:
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)

    def cold(*cmd: str, before: Callable[[], None] = fresh_cache, ok: tuple[int, ...] = (0, 1)) -> float:
        before()
        _drop_caches()
        return cli.run(*cmd, "--cache-dir", str(cache), env={"XDG_CACHE_HOME": str(cache)}, ok=ok)[0]

    progress(f"walks: verify and index of {tiny.name}, cold, best of {repeat}")
    out["verify_s"] = _best(repeat, lambda: cold("verify", str(tiny)))
    out["index_s"] = _best(repeat, lambda: cold("index", str(tiny)))
    out["index_offsets_s"] = _best(repeat, lambda: cold("index", "--no-schema", str(tiny)))

    def reshard(indexed: bool) -> float:
        def before() -> None:
            fresh_cache()
            shutil.rmtree(dest, ignore_errors=True)
            if indexed:
                cli.run("index", str(tiny), "--cache-dir", str(cache), env={"XDG_CACHE_HOME": str(cache)})
        took = cold("reshard", str(tiny), str(dest), "--shards", str(RESHARD_TO), before=before, ok=(0,))
        # ``reshard`` makes DEST durable before it exits (one syncfs): its time is that of cp + sync.
        shutil.rmtree(dest, ignore_errors=True)
        return took

    progress(f"walks: cp -r + sync of {tiny.name}, and reshard {WALK_SHARDS} -> {RESHARD_TO} shards")
    out["cp_s"] = _cp(tiny, WORK)["s"]
    out["floor_reshard_s"] = _best(3, lambda: floor_reshard(tiny, WORK, RESHARD_TO))
    out["reshard_unindexed_s"] = _best(repeat, lambda: reshard(False))
    out["reshard_indexed_s"] = _best(repeat, lambda: reshard(True))

    work = WORK / "walks-repair"

    def cat() -> float:
        _drop_caches()
        t0 = time.perf_counter()
        subprocess.run(["cat", str(shard)], stdout=subprocess.DEVNULL, check=True)
        return time.perf_counter() - t0

    def repair() -> float:
        def before() -> None:
            fresh_cache()
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            shutil.copyfile(shard, work / shard.name)
        took = cold("repair", str(work), before=before, ok=(0,))
        shutil.rmtree(work, ignore_errors=True)
        return took

    progress(f"walks: cat and repair of a damaged shard of {out['repair_mb']:.0f} MB")
    out["cat_repair_s"] = _best(repeat, cat)
    out["cp_repair_s"] = _best(repeat, lambda: cp_sync(shard, WORK / "walks-cp"))
    out["repair_s"] = _best(repeat, repair)
    shutil.rmtree(cache, ignore_errors=True)
    return out


Row = tuple[str, str, Any, str, "bool | None"]


def rows(r: dict[str, Any] | None) -> list[Row]:
    """(metric, unit, (value, text), goal, met) of this part (as ``scale._rows``)."""
    if not r:
        return []
    mb, rmb = r["mb"], r["repair_mb"]

    def rate(key: str, size: float) -> tuple[float | None, None]:
        return (size / r[key] if r.get(key) else None), None

    def share(a: str, b: str, size: float, least: float) -> bool | None:
        return None if not r.get(a) or not r.get(b) else size / r[a] >= least * size / r[b]
    n = f"{r['records'] / 1e6:.0f} M"
    return [
        (f"{n} tiny records: verify, cold", "s", (r.get("verify_s"), None), "", None),
        (f"{n} tiny records: index --no-schema, cold", "s", (r.get("index_offsets_s"), None), "", None),
        (f"{n} tiny records: index (offsets and schema), cold", "s", (r.get("index_s"), None), "<= verify",
         None if not r.get("index_s") else r["index_s"] <= r["verify_s"]),
        (f"{n} tiny records: cp -r + sync", "MB/s", rate("cp_s", mb), "", None),
        (f"{RESHARD_TO} shards and index files written, nothing read (floor)", "MB/s", rate("floor_reshard_s", mb),
         "", None),
        (f"reshard {r['shards']} -> {RESHARD_TO} shards, SOURCE not indexed", "MB/s", rate("reshard_unindexed_s", mb),
         ">= 50% of cp", share("reshard_unindexed_s", "cp_s", mb, 0.5)),
        (f"reshard {r['shards']} -> {RESHARD_TO} shards, SOURCE indexed", "MB/s", rate("reshard_indexed_s", mb),
         ">= 80% of cp", share("reshard_indexed_s", "cp_s", mb, 0.8)),
        (f"damaged {rmb:,.0f} MB shard: cat, cold", "MB/s", rate("cat_repair_s", rmb), "", None),
        (f"damaged {rmb:,.0f} MB shard: cp + sync (floor)", "MB/s", rate("cp_repair_s", rmb), "", None),
        (f"damaged {rmb:,.0f} MB shard: repair, cold", "MB/s", rate("repair_s", rmb), ">= 50% of cat",
         share("repair_s", "cat_repair_s", rmb, 0.5)),
    ]
