"""The benchmark's datasets, built once and cached in bench-out/data/: the read side's
Object-Detection-style dataset (many ~5 KB JPEG records plus ~2 MB PNG records), the lists of
its files as tfrfs shows them, the tar of the mounted tree that ratarmount serves, and the
write-back side's commit dataset and scratch dataset."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tfrfs.format import proto
from tfrfs.format.tfrecord import StreamWriter

from .common import OUT, progress, raise_error, run

DATA_VERSION = 1
CLASSES = ["person", "car", "dog", "cat", "bicycle", "bird", "boat", "bus", "chair", "cow",
           "traffic light", "horse"]


def _base_jpegs(rng: random.Random, count: int) -> list[tuple[bytes, int, int]]:
    from PIL import Image, ImageDraw
    out = []
    for _ in range(count):
        w, h = rng.choice([(192, 144), (176, 132), (200, 150), (160, 160)])
        g = Image.linear_gradient("L").resize((w, h))
        chans = [g.point(lambda v, a=rng.randint(0, 255): (v + a) % 256) for _ in range(3)]
        im = Image.merge("RGB", chans)
        d = ImageDraw.Draw(im)
        for _ in range(rng.randint(3, 8)):
            x0, y0 = rng.randrange(w), rng.randrange(h)
            box = [x0, y0, x0 + rng.randint(10, w // 2), y0 + rng.randint(10, h // 2)]
            col = tuple(rng.randrange(256) for _ in range(3))
            (d.ellipse if rng.random() < 0.5 else d.rectangle)(box, fill=col)
        noise = Image.effect_noise((w, h), 40).convert("RGB")
        im = Image.blend(im, noise, 0.15)
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=rng.choice([70, 75, 80]))
        out.append((buf.getvalue(), w, h))
    return out


def _with_comment(jpeg: bytes, text: bytes) -> bytes:
    """The same JPEG with a COM segment after SOI: distinct bytes, still a valid JPEG."""
    return jpeg[:2] + b"\xff\xfe" + struct.pack(">H", len(text) + 2) + text + jpeg[2:]


def _noise_png(rng: random.Random, side: int) -> bytes:
    from PIL import Image
    im = Image.frombytes("RGB", (side, side), rng.randbytes(side * side * 3))
    buf = io.BytesIO()
    im.save(buf, "PNG", compress_level=0)
    return buf.getvalue()


def _od_record(rng: random.Random, img: bytes, fmt: bytes, fname: str, w: int, h: int) -> bytes:
    ex = proto.Example()
    f = ex.features.feature
    f["image/encoded"].bytes_list.value.append(img)
    f["image/format"].bytes_list.value.append(fmt)
    f["image/filename"].bytes_list.value.append(fname.encode())
    f["image/height"].int64_list.value.append(h)
    f["image/width"].int64_list.value.append(w)
    n = rng.randint(1, 5)
    xs = [sorted((rng.random(), rng.random())) for _ in range(n)]
    ys = [sorted((rng.random(), rng.random())) for _ in range(n)]
    f["image/object/bbox/xmin"].float_list.value.extend(a for a, _ in xs)
    f["image/object/bbox/xmax"].float_list.value.extend(b for _, b in xs)
    f["image/object/bbox/ymin"].float_list.value.extend(a for a, _ in ys)
    f["image/object/bbox/ymax"].float_list.value.extend(b for _, b in ys)
    labels = [rng.randrange(len(CLASSES)) for _ in range(n)]
    f["image/object/class/label"].int64_list.value.extend(l + 1 for l in labels)
    f["image/object/class/text"].bytes_list.value.extend(CLASSES[l].encode() for l in labels)
    return ex.SerializeToString(deterministic=True)


def _write_shards(folder: Path, prefix: str, count: int, shards: int,
                  make: Callable[[int], bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-count // shards) if shards else 0
    i = 0
    for s in range(shards):
        with open(folder / f"{prefix}-{s:05d}-of-{shards:05d}.tfrecord", "wb") as fh:
            w = StreamWriter(fh)
            for _ in range(min(per, count - i)):
                w.write(make(i))
                i += 1
            w.close()


def _cached(name: str, what: str, rebuild: bool) -> tuple[Path, Path, dict[str, Any] | None]:
    """bench-out/data/NAME (the shards) and NAME.json (the dataset's figures, written last, so a
    build that died is not taken for a dataset), and those figures when both are there."""
    src = OUT / "data" / name
    meta_path = OUT / "data" / f"{name}.json"
    if meta_path.exists() and src.is_dir() and not rebuild:
        progress(f"{what} cached: {src}")
        return src, meta_path, json.loads(meta_path.read_text())
    return src, meta_path, None


def build_dataset(small: int, large: int, shards: int, rebuild: bool) -> tuple[Path, dict[str, Any]]:
    name = f"v{DATA_VERSION}-s{small}-l{large}-n{shards}"
    src, meta_path, cached = _cached(name, "dataset", rebuild)
    if cached is not None:
        return src, cached
    if src.exists():
        shutil.rmtree(src)
    for stale in (OUT / "data").glob(f"{name}.*"):
        stale.unlink()
    progress(f"building dataset {name} ({small} small records in {shards} shards, {large} large records)")
    t0 = time.perf_counter()
    rng = random.Random(20240601)
    bases = _base_jpegs(rng, 300)

    def small_rec(i: int) -> bytes:
        jpg, w, h = bases[i % len(bases)]
        fname = f"img_{i:07d}.jpg"
        return _od_record(rng, _with_comment(jpg, fname.encode()), b"jpeg", fname, w, h)

    _write_shards(src / "small", "small", small, shards, small_rec)
    t1 = time.perf_counter()
    progress(f"  small part written in {t1 - t0:.1f}s")
    side = 836  # 836*836*3 bytes of noise, stored PNG: ~2.0 MiB

    def large_rec(i: int) -> bytes:
        return _od_record(rng, _noise_png(rng, side), b"png", f"big_{i:05d}.png", side, side)

    large_shards = max(1, -(-large // 100)) if large else 0
    _write_shards(src / "large", "large", large, large_shards, large_rec)
    t2 = time.perf_counter()
    progress(f"  large part written in {t2 - t1:.1f}s (dataset built in {t2 - t0:.1f}s)")
    size = sum(p.stat().st_size for p in src.rglob("*.tfrecord"))
    meta = {"name": name, "small": small, "large": large, "shards": shards, "large_shards": large_shards,
            "bytes": size, "build_s": round(t2 - t0, 2)}
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    return src, meta


# --- file lists and the tar ------------------------------------------------------

def derived_paths(meta: dict[str, Any], rebuild: bool) -> tuple[Path, Path]:
    """Where the tar of a dataset's mounted tree and the lists of its files are cached (both are
    made from a tfrfs mount on first use); with ``rebuild`` the cached ones are removed."""
    tar = OUT / "data" / f"{meta['name']}.tar"
    list_path = OUT / "data" / f"{meta['name']}.files.json"
    if rebuild:
        for stale in (tar, list_path):
            if stale.exists():
                stale.unlink()
    return tar, list_path


def file_lists(mnt: Path, meta: dict[str, Any], list_path: Path) -> dict[str, list[str]]:
    if list_path.exists():
        return json.loads(list_path.read_text())
    progress("walking the tfrfs mount for the file lists")
    lists: dict[str, list[str]] = {"small_files": [], "large_files": [], "small_records": []}
    base = len(str(mnt)) + 1
    for part in ("small", "large"):
        for dirpath, dirs, files in os.walk(mnt / part, onerror=raise_error):
            dirs.sort()
            rel = dirpath[base:]
            depth = rel.count("/")
            if part == "small" and depth == 2:       # small/SHARD/RECORD
                lists["small_records"].append(rel)
            for f in sorted(files):
                if part == "small":
                    lists["small_files"].append(f"{rel}/{f}")
                elif f.startswith("encoded."):
                    lists["large_files"].append(f"{rel}/{f}")
    if len(lists["small_records"]) != meta["small"] or len(lists["large_files"]) != meta["large"]:
        raise RuntimeError(f"unexpected tree: {len(lists['small_records'])} small records, "
                           f"{len(lists['large_files'])} large files")
    list_path.write_text(json.dumps(lists))
    return lists


def make_tar(mnt: Path, tar: Path) -> float:
    progress(f"making {tar.name} from the tfrfs mount (tar -C MNT -cf ... --exclude=.tfrfs .)")
    tmp = tar.with_suffix(".tar.tmp")
    t0 = time.perf_counter()
    run(["tar", "-C", str(mnt), "--exclude=./.tfrfs", "-cf", str(tmp), "."])
    tmp.rename(tar)
    elapsed = time.perf_counter() - t0
    progress(f"  tar made in {elapsed:.1f}s ({tar.stat().st_size / 2**20:.0f} MiB)")
    return elapsed


# --- write-back: the commit dataset and the scratch dataset ------------------------

WB_VERSION = 1
SMALL_EVERY = 8           # one record in SMALL_EVERY is small (~4 KiB), the others ~1 MiB


def _blob_record(rng: random.Random, i: int, size: int) -> bytes:
    ex = proto.Example()
    f = ex.features.feature
    f["data/blob"].bytes_list.value.append(rng.randbytes(size))
    f["label"].int64_list.value.append(rng.randint(1, 8))   # 1..9 after a flip: always one varint byte
    f["id"].bytes_list.value.append(f"rec-{i:07d}".encode())
    return ex.SerializeToString(deterministic=True)


def build_commit_dataset(mib: int, shards: int, rebuild: bool) -> tuple[Path, dict[str, Any]]:
    """``mib`` MiB in ``shards`` shards; cached in bench-out/data/ like the read dataset.

    Commits change one label in place (flipped each run), so the cached copy stays valid: same
    files, sizes and record counts.
    """
    name = f"wb-v{WB_VERSION}-m{mib}-n{shards}"
    src, meta_path, cached = _cached(name, "commit dataset", rebuild)
    if cached is not None:
        return src, cached
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    progress(f"building commit dataset {name} ({mib} MiB in {shards} shards)")
    t0 = time.perf_counter()
    rng = random.Random(20240602)
    per_shard = mib * 2**20 // shards
    files, counts = [], []
    i = 0
    for s in range(shards):
        fname = f"commit-{s:05d}-of-{shards:05d}.tfrecord"
        with open(src / fname, "wb") as fh:
            w = StreamWriter(fh)
            count = 0
            while w.raw_bytes < per_shard:
                size = 4096 if count % SMALL_EVERY == SMALL_EVERY - 1 else rng.randint(1 << 19, 3 << 19)
                w.write(_blob_record(rng, i, size))
                count += 1
                i += 1
            w.close()
        files.append(fname)
        counts.append(count)
    meta = {"name": name, "mib": mib, "shards": shards, "files": files, "records": counts,
            "bytes": sum((src / f).stat().st_size for f in files),
            "build_s": round(time.perf_counter() - t0, 2)}
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    progress(f"  built in {meta['build_s']:.1f}s")
    return src, meta


def build_write_source(folder: Path) -> Path:
    """A tiny dataset to write the big feature file into, made anew each run: the commit at its
    unmount then touches nothing that matters."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with open(folder / "scratch-00000-of-00001.tfrecord", "wb") as fh:
        w = StreamWriter(fh)
        for i in range(4):
            ex = proto.Example()
            ex.features.feature["label"].int64_list.value.append(i)
            ex.features.feature["id"].bytes_list.value.append(f"rec-{i}".encode())
            w.write(ex.SerializeToString(deterministic=True))
        w.close()
    return folder
