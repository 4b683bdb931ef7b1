"""``scripts/bench --loader``: training input, records/s into a training loop.

The dataset (cached in bench-out/data/) is written by TensorFlow itself (loader_run.py ``build``):
--loader-records (20,000; --quick 2,000) ``tf.train.Example`` records in --loader-shards (8)
shards, each an ``image`` (a 224x224 JPEG of ~9 KB, from ``tf.io.encode_jpeg``, every one a
different crop, tint and grain of 400 scenes) and a ``label`` (int64), with ``tfrfs index --beside``
(index files and the manifest, as a dataset shipped for training has) and, in a folder of their
own, the index files of the ``tfrecord`` package's ``tfrecord2idx``. The mounted tree is copied
once with ``cp -r`` to bench-out/work/ ("plain": the same files on the local disk, no FUSE).

Each loader reads every record: the image decoded to an RGB array, the label as an int, in batches
of --loader-batch (64). Every run is a process of its own (loader_run.py ``measure``) after
``sync; echo 3 > /proc/sys/vm/drop_caches`` (as root) and, over the mount, on a fresh mount: the
first pass is cold (timed from making the dataset object: listing the record folders, opening the
shards, starting the workers), the second, through the same objects, warm. Loaders:

  TensorFlow (the anchor)  ``tf.data.TFRecordDataset`` (num_parallel_reads AUTOTUNE), map with
                           ``parse_single_example`` + ``tf.io.decode_jpeg`` (AUTOTUNE), batch, prefetch
  record folders, mount    a map-style ``torch.utils.data.Dataset`` over the record folders (listed
                           once), ``__getitem__`` reads ``image.jpg`` and ``label.json`` (unbuffered
                           ``open``), decodes the image with Pillow; DataLoader with shuffle,
                           num_workers 0, 2, 4
  record folders, plain    the same over the plain copy
  ... Image.open(path)     both again (at the middle worker count) with the files opened as most
                           code opens them, ``Image.open(path)`` and a buffered ``open``: each of
                           those asks the file whether it is a terminal (ioctl TCGETS), which a
                           FUSE mount sends to its daemon on every open, cached or not
  tfrfs.open               a map-style Dataset reading records with ``tfrfs.open`` (no FUSE), each
                           worker opening the dataset itself; same decode
  tfrecord package         its ``MultiTFRecordDataset`` (an IterableDataset that splits every shard
                           among the workers by its index files), same decode

and ``xargs -0 -n 64 -P N cat`` of every image file (files/s; N = 1, 2, 4, 8), over the mount and
over the plain copy, each cold (fresh mount) then warm. The map-style loaders shuffle (a seeded
order), as training does; the streaming ones read their shards in order. Runs are interleaved:
each of --repeat (3; --quick 1) rounds runs every loader once, the order reversed every other
round; the table shows medians.

PyTorch (``pip install torch==2.13.0``: the CPU build) and the ``tfrecord`` package are installed
into this Python's environment on first use.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import OUT, REPO, WORK, progress, run, timed_shell
from .datasets import _cached
from .schedule import drop_caches
from .tools import Tfrfs, force_unmount, proc_cpu

DATA_VERSION = 1
RUNNER = Path(__file__).with_name("loader_run.py")
CAT_PROCS = (1, 2, 4, 8)
MOUNT_GOAL = 0.8        # DataLoader over the mount against the plain files (best worker count each)
LIBRARY_GOAL = 1.0      # DataLoader over tfrfs.open against the plain files
TORCH = "torch==2.13.0"  # the CPU build; an unpinned torch would resolve to a far larger CUDA build


@dataclass(frozen=True)
class Method:
    key: str
    label: str
    kind: str       # tf | folders | library | tfrecord | cat
    where: str      # mount | plain | source
    n: int          # DataLoader workers, or xargs -P (-1: TensorFlow's AUTOTUNE)

    @property
    def unit(self) -> str:
        return "files/s" if self.kind == "cat" else "records/s"

    @property
    def shown_n(self) -> str:
        return "AUTOTUNE" if self.n < 0 else f"-P {self.n}" if self.kind == "cat" else str(self.n)


def methods(workers: list[int]) -> list[Method]:
    out = [Method("tf", "TensorFlow tf.data (anchor)", "tf", "source", -1)]
    for w in workers:
        out += [Method(f"mount-{w}", "DataLoader, record folders, mount", "folders", "mount", w),
                Method(f"plain-{w}", "DataLoader, record folders, plain files", "folders", "plain", w),
                Method(f"library-{w}", "DataLoader, tfrfs.open (no mount)", "library", "source", w),
                Method(f"tfrecord-{w}", "DataLoader, tfrecord package", "tfrecord", "source", w)]
    w = workers[len(workers) // 2]
    out += [Method(f"mount-path-{w}", "DataLoader, record folders, mount, Image.open(path)", "folders-path",
                   "mount", w),
            Method(f"plain-path-{w}", "DataLoader, record folders, plain, Image.open(path)", "folders-path",
                   "plain", w)]
    for p in CAT_PROCS:
        out += [Method(f"cat-mount-{p}", "xargs cat image files, mount", "cat", "mount", p),
                Method(f"cat-plain-{p}", "xargs cat image files, plain files", "cat", "plain", p)]
    return out


# --- what it needs --------------------------------------------------------------------

def ensure_installed() -> dict[str, str]:
    """PyTorch and the tfrecord package in this Python's environment (installed when missing);
    their versions."""
    need = [pkg for mod, pkg in (("torch", TORCH), ("tfrecord", "tfrecord")) if importlib.util.find_spec(mod) is None]
    if need:
        progress(f"installing {' '.join(need)} into {sys.prefix} (pip)")
        run([sys.executable, "-m", "pip", "install", "-q", *need])
        importlib.invalidate_caches()
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for pkg in ("torch", "tfrecord", "tensorflow-cpu", "tensorflow", "pillow"):
        try:
            out[pkg.removesuffix("-cpu")] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def child_env() -> dict[str, str]:
    """The runs' environment: this checkout's tfrfs first on the path, TensorFlow quiet."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(REPO) + (f":{path}" if path else ""), "TF_CPP_MIN_LOG_LEVEL": "3"}


# --- the dataset and its plain copy -----------------------------------------------------

def build(records: int, shards: int, rebuild: bool) -> tuple[Path, Path, dict[str, Any]]:
    """The shards (with tfrfs's index files and manifest beside them), the folder of the tfrecord
    package's index files, and the dataset's figures; built once."""
    name = f"loader-v{DATA_VERSION}-r{records}-n{shards}"
    src, meta_path, cached = _cached(name, "loader dataset", rebuild)
    idx = OUT / "data" / f"{name}.tfrecord-idx"
    if cached is not None:
        return src, idx, cached
    for stale in (src, idx):
        shutil.rmtree(stale, ignore_errors=True)
    progress(f"writing dataset {name} with TensorFlow ({records:,} records in {shards} shards)")
    t0 = time.perf_counter()
    made = json.loads(run([sys.executable, str(RUNNER), "build", str(src), str(records), str(shards)],
                          env=child_env()).stdout.splitlines()[-1])
    t1 = time.perf_counter()
    progress(f"  written in {t1 - t0:.1f}s; tfrfs index --beside, and tfrecord2idx into {idx.name}/")
    run([sys.executable, "-m", "tfrfs", "index", str(src), "--beside"], env=child_env())
    idx.mkdir(parents=True)
    files = sorted(src.glob("*.tfrecord"))
    for f in files:
        run([sys.executable, "-m", "tfrecord.tools.tfrecord2idx", str(f), str(idx / f"{f.stem}.idx")])
    meta = {"name": name, "shards": shards, **made, "bytes": sum(f.stat().st_size for f in files),
            "build_s": round(time.perf_counter() - t0, 1)}
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    return src, idx, meta


def plain_copy(mnt: Path, dest: Path) -> float | None:
    """``cp -r`` of the mounted tree to ``dest``, once (None: an earlier run's complete copy)."""
    if (dest / ".complete").exists():
        progress(f"plain copy cached: {dest}")
        return None
    tmp = dest.with_name(dest.name + ".tmp")
    for stale in (tmp, dest):
        shutil.rmtree(stale, ignore_errors=True)
    progress(f"copying the mounted tree to {dest} (cp -r: the plain files)")
    seconds, _ = timed_shell(f"cp -r {mnt} {tmp}")
    os.sync()
    tmp.rename(dest)
    (dest / ".complete").touch()
    progress(f"  copied in {seconds:.1f}s")
    return seconds


# --- the runs ---------------------------------------------------------------------------

@dataclass
class Context:
    src: Path
    idx: Path
    plain: Path
    tool: Tfrfs
    images: Path         # NUL-separated image paths relative to the tree's root, for xargs
    meta: dict[str, Any]
    batch: int
    cache: Path


def _loader_run(m: Method, root: Path, ctx: Context, seed: int) -> dict[str, Any]:
    spec = {"kind": m.kind, "root": str(root), "workers": m.n, "batch": ctx.batch, "seed": seed,
            "index_dir": str(ctx.idx), "cache_dir": str(ctx.cache),
            "daemon_pid": ctx.tool.pid if m.where == "mount" else None}
    out = json.loads(run([sys.executable, str(RUNNER), "measure", json.dumps(spec)], env=child_env(),
                         timeout=3600).stdout.splitlines()[-1])
    want = [ctx.meta["records"], ctx.meta["label_sum"]]
    for p in ("cold", "warm"):
        if out[p] != want:
            raise RuntimeError(f"{m.key}: the {p} pass read {out[p][0]} records with label sum {out[p][1]}, "
                               f"expected {want[0]} and {want[1]}")
    n = want[0]
    return {"cold": n / out["cold_s"], "warm": n / out["warm_s"], "make_s": out["make_s"],
            "cold_cpu_ms": out["cold_cpu_s"] / n * 1000, "warm_cpu_ms": out["warm_cpu_s"] / n * 1000}


def _cat_run(m: Method, root: Path, ctx: Context) -> dict[str, Any]:
    cmd = f"cd {root} && xargs -0 -n 64 -P {m.n} cat < {ctx.images} > /dev/null"
    n = ctx.meta["records"]
    r: dict[str, Any] = {}
    for p in ("cold", "warm"):
        cpu0 = _children_cpu() + proc_cpu(ctx.tool.pid if m.where == "mount" else None)
        seconds, _ = timed_shell(cmd)
        cpu = _children_cpu() + proc_cpu(ctx.tool.pid if m.where == "mount" else None) - cpu0
        r[p], r[f"{p}_cpu_ms"] = n / seconds, cpu / n * 1000
    return r


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_once(m: Method, ctx: Context, seed: int) -> dict[str, Any]:
    """One cold and one warm pass of ``m``, after dropping the caches (and on a fresh mount)."""
    root = {"mount": ctx.tool.mnt, "plain": ctx.plain, "source": ctx.src}[m.where]
    if m.where == "mount":
        ctx.tool.umount()
        drop_caches()
        ctx.tool.mount()
    drop_caches()
    if m.where != "mount":
        return _cat_run(m, root, ctx) if m.kind == "cat" else _loader_run(m, root, ctx, seed)
    cpu0 = proc_cpu(ctx.tool.pid)
    try:
        r = _cat_run(m, root, ctx) if m.kind == "cat" else _loader_run(m, root, ctx, seed)
        r["daemon_cpu_s"] = proc_cpu(ctx.tool.pid) - cpu0
    finally:
        ctx.tool.umount()
    return r


def measure_loader(args: argparse.Namespace) -> dict[str, Any]:
    versions = ensure_installed()
    src, idx, meta = build(args.loader_records, args.loader_shards, args.rebuild)
    cache = WORK / "loader-cache"
    tool = Tfrfs(WORK / "mnt-loader", src, cache)
    plain = WORK / f"plain-{meta['name']}"
    images = WORK / f"{meta['name']}.images"
    force_unmount(tool.mnt)
    results: dict[str, Any] = {"dataset": meta, "versions": versions, "repeat": args.repeat, "batch": args.loader_batch,
                               "workers": args.loader_workers, "nproc": os.cpu_count()}
    tool.mount()
    try:
        results["plain_copy_s"] = plain_copy(tool.mnt, plain)
        rels = sorted(str(p.relative_to(plain)) for p in plain.glob("*.tfrecord/*/image.jpg"))
        if len(rels) != meta["records"]:
            raise RuntimeError(f"{plain}: {len(rels)} image files, expected {meta['records']}")
        images.write_bytes(b"".join(r.encode() + b"\0" for r in rels))
    finally:
        tool.umount()
    ctx = Context(src, idx, plain, tool, images, meta, args.loader_batch, cache)
    todo = methods(args.loader_workers)
    samples: dict[str, list[dict[str, Any]]] = {m.key: [] for m in todo}
    log = []
    t0 = time.monotonic()
    try:
        for rep in range(args.repeat):
            for m in (todo if rep % 2 == 0 else todo[::-1]):
                progress(f"{m.label} ({m.shown_n}): round {rep + 1}/{args.repeat}")
                log.append({"key": m.key, "round": rep + 1, "start_s": round(time.monotonic() - t0, 1),
                            "loadavg_1min": round(os.getloadavg()[0], 2)})
                r = run_once(m, ctx, seed=rep)
                samples[m.key].append(r)
                progress(f"  cold {r['cold']:,.0f}, warm {r['warm']:,.0f} {m.unit}"
                         + (f"; daemon CPU {r['daemon_cpu_s']:.1f}s" if "daemon_cpu_s" in r else ""))
    finally:
        tool.umount()
        force_unmount(tool.mnt)
    results["runs"] = log
    results["methods"] = {}
    for m in todo:
        s = samples[m.key]
        row: dict[str, Any] = {"label": m.label, "kind": m.kind, "where": m.where, "n": m.n, "unit": m.unit}
        for k in s[0]:
            row[f"{k}_samples"] = [round(x[k], 3) for x in s]
            row[k] = statistics.median(x[k] for x in s)
        results["methods"][m.key] = row
    results["goals"] = goals(results["methods"], args.loader_workers)
    return results


def _best(rows: dict[str, Any], prefix: str, workers: list[int], pass_: str) -> tuple[float, int]:
    return max((rows[f"{prefix}-{w}"][pass_], w) for w in workers)


def goals(rows: dict[str, Any], workers: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, prefix, goal in (("mount", "mount", MOUNT_GOAL), ("library", "library", LIBRARY_GOAL)):
        for p in ("cold", "warm"):
            ours, ow = _best(rows, prefix, workers, p)
            plain, pw = _best(rows, "plain", workers, p)
            out[f"{name}_{p}"] = {"ours": ours, "ours_workers": ow, "plain": plain, "plain_workers": pw,
                                  "ratio": ours / plain, "goal": goal, "met": ours / plain >= goal}
    return out


# --- the table ----------------------------------------------------------------------------

def _rate(v: float) -> str:
    return f"{v:,.0f}"


def print_loader(r: dict[str, Any]) -> None:
    meta, rows = r["dataset"], r["methods"]
    v = r["versions"]
    print(f"\nTraining input (--loader): {meta['records']:,} records in {meta['shards']} shards, "
          f"{meta['bytes'] / 2**20:.0f} MiB, written by TensorFlow {meta['tensorflow']} (image: "
          f"{meta['side']}x{meta['side']} JPEG, {meta['jpeg_mean_bytes'] / 1000:.1f} KB mean; label: int64); "
          f"batch {r['batch']}; torch {v['torch']}, tfrecord {v['tfrecord']}, Pillow {v['pillow']}; {r['nproc']} CPUs")
    head = ("method", "workers", "unit", "cold", "warm", "cold vs plain", "warm vs plain", "CPU ms/rec cold", "warm")
    table = [head]
    best_plain = {p: max(rows[f"plain-{w}"][p] for w in r["workers"]) for p in ("cold", "warm")}
    for key, row in rows.items():
        if row["kind"] == "cat":
            other = rows.get(f"cat-plain-{row['n']}") if row["where"] == "mount" else None
        elif row["kind"] == "tf":
            other = None
        elif row["kind"] == "folders-path":
            other = rows.get(f"plain-path-{row['n']}") if row["where"] == "mount" else None
        else:
            other = rows.get(f"plain-{row['n']}") if row["where"] != "plain" else None
        if row["kind"] == "tf":
            ratios = [f"{row[p] / best_plain[p]:.2f}x (best)" for p in ("cold", "warm")]
        else:
            ratios = [f"{row[p] / other[p]:.2f}x" if other else "" for p in ("cold", "warm")]
        n = "AUTOTUNE" if row["n"] < 0 else f"-P {row['n']}" if row["kind"] == "cat" else str(row["n"])
        table.append((row["label"], n, row["unit"], _rate(row["cold"]), _rate(row["warm"]), *ratios,
                      f"{row['cold_cpu_ms']:.2f}", f"{row['warm_cpu_ms']:.2f}"))
    widths = [max(len(t[i]) for t in table) for i in range(len(head))]
    for i, t in enumerate(table):
        print("  ".join(c.ljust(w) if j in (0, 2) else c.rjust(w) for j, (c, w) in enumerate(zip(t, widths))).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    g = r["goals"]
    for name, what in (("mount", "DataLoader over the mount"), ("library", "DataLoader over tfrfs.open")):
        cells = []
        for p in ("cold", "warm"):
            x = g[f"{name}_{p}"]
            cells.append(f"{p} {_rate(x['ours'])} ({x['ours_workers']} workers) / {_rate(x['plain'])} "
                         f"({x['plain_workers']} workers) = {x['ratio']:.2f}x {'yes' if x['met'] else 'NO'}")
        print(f"goal: {what} >= {g[f'{name}_cold']['goal']:g}x the plain files' DataLoader (best worker count "
              f"each): " + "; ".join(cells))
    print(f"each figure: the median of {r['repeat']} run(s), interleaved; cold: caches dropped (and a fresh mount), "
          f"timed from making the dataset object to the last batch; warm: a second pass through the same objects. "
          f"vs plain: against the plain files' DataLoader with as many workers (xargs: as many processes; "
          f"TensorFlow: the best of them). DataLoaders over record folders and tfrfs.open shuffle. "
          f"CPU ms/rec: CPU time of the loader's processes (workers, cat) and, over the mount, of its daemon, "
          f"a record (file) each: less swayed than the rates by other work on the machine.")
    print("samples (cold | warm):")
    for key, row in rows.items():
        extra = ""
        if "daemon_cpu_s_samples" in row:
            extra = "; daemon CPU s " + " ".join(f"{x:.1f}" for x in row["daemon_cpu_s_samples"])
        print(f"  {key}: " + " ".join(_rate(x) for x in row["cold_samples"]) + " | "
              + " ".join(_rate(x) for x in row["warm_samples"]) + extra)
    loads = [x["loadavg_1min"] for x in r["runs"]]
    print(f"  load average (1 min) at the start of the runs: {min(loads):.2f} .. {max(loads):.2f}")
