"""``scripts/bench --cluster``: the shard jobs on every core and on Ray (SPEC 8), and the Ray Data
source (SPEC 9), on the ten-million-record dataset of ``--scale`` (100 shards of 50-byte records;
``--cluster-records`` / ``--cluster-shards``; ``--cluster-text`` uses the 2 KB C4-like records
instead).

Each command runs four ways: in one process (``--workers 1``), in the local process pool (the
default), on Ray on this machine (a one-node cluster with both CPUs) and on Ray on a simulated
two-node cluster (``ray.cluster_utils.Cluster``: two raylets of one CPU each, on this machine).
The clusters are started before the runs and the start-up is reported on its own line. Every run
starts after the page cache is emptied (as root):

  index    a cold ``tfrfs index`` (a fresh cache folder): offsets and the schema
  verify   every checksum and parse
  reshard  100 -> 1,000 shards (``--shards 1000``), from the indexed source into a new folder
           (its data checksums were checked while it was indexed, so the copy reads no record);
           then, in the local pool only, the same with ``--schema`` and from a source indexed
           ``--no-schema`` (both read and check every record)

beside the same reshard by a TensorFlow script (``TFRecordDataset`` -> ``TFRecordWriter``) and
``cp -r`` + ``sync`` of the source folder (the ceiling). The TensorFlow script takes the records
in batches of 4,096 out of the graph, as a user who knows tf.data would (per record, eagerly, it
is several times slower). Worker memory is the highest peak RSS (VmHWM) of any worker process,
sampled from /proc while the command runs: the processes under the command (the pool), Ray's
task workers (``ray::`` processes), or the command itself in one process. Then ``tfrfs.ray.read`` of the dataset,
consumed whole, against ``ray.data.read_tfrecords`` of the same files, on the one-node cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .common import OUT, WORK, progress
from .scale import Cli, TimedOut, _drop_caches, _load
from .scaledata import scale_dataset, shard_files, text_dataset

RESHARD_TO = 1000

# The TensorFlow side of the reshard: every record read in order and written to RESHARD_TO shards
# of equal counts, as a user without tfrfs would do it.
_TF_RESHARD = """
import sys, os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
out, n, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
files = sys.argv[4:]
per, spare = divmod(total, n)
os.makedirs(out, exist_ok=True)
shard, left, writer = 0, 0, None
# Batches of records leave the graph as one array each: a Python step per batch, not per record.
for batch in tf.data.TFRecordDataset(files, num_parallel_reads=1).batch(4096):
    for rec in batch.numpy():
        if left == 0:
            if writer is not None:
                writer.close()
            left = per + (shard < spare)
            writer = tf.io.TFRecordWriter(os.path.join(out, f"out-{shard:05d}-of-{n:05d}.tfrecord"))
            shard += 1
        writer.write(rec)
        left -= 1
writer.close()
"""


class PeakMemory:
    """The highest VmHWM of the processes ``pick`` chooses, sampled every 50 ms until stopped."""

    def __init__(self, pick: Callable[[int, list[str], int], bool]) -> None:
        self.pick = pick
        self.peak_mib = 0.0
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for d in os.listdir("/proc"):
                if not d.isdigit():
                    continue
                try:
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        args = f.read().decode(errors="replace").split("\0")
                    with open(f"/proc/{d}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                    if not self.pick(int(d), args, ppid):
                        continue
                    with open(f"/proc/{d}/status") as f:
                        for line in f:
                            if line.startswith("VmHWM:"):
                                self.peak_mib = max(self.peak_mib, int(line.split()[1]) / 1024)
                                self.seen.add(int(d))
                except (OSError, ValueError, IndexError):
                    continue


def _ray_worker(pid: int, args: list[str], ppid: int) -> bool:
    return bool(args) and args[0].startswith("ray::") and "IDLE" not in args[0]


class _Children:
    """Processes whose parent is one of ``roots`` (the command's pool workers)."""

    def __init__(self) -> None:
        self.roots: set[int] = set()

    def __call__(self, pid: int, args: list[str], ppid: int) -> bool:
        return ppid in self.roots


def _start(nodes: int) -> tuple[Any, float]:
    from ray.cluster_utils import Cluster
    t0 = time.perf_counter()
    cpus = 2 // nodes
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "include_dashboard": False})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=cpus)
    cluster.wait_for_nodes()
    return cluster, time.perf_counter() - t0


def _run_measured(cli: Cli, args: list[str], ray: bool, alone: bool) -> tuple[float, str, float]:
    """Time, stdout and the workers' peak memory of ``tfrfs ARGS`` (``alone``: the command's own,
    when it runs its jobs itself)."""
    _drop_caches()
    if ray:
        with PeakMemory(_ray_worker) as mem:
            secs, out = cli.run(*args)
        return secs, out, mem.peak_mib
    children = _Children()
    # The command's own pid is known only once it runs: the sampler takes the children of every
    # ``python -m tfrfs`` process.
    def pick(pid: int, a: list[str], ppid: int) -> bool:
        if children(pid, a, ppid):
            return True          # a pool worker (a forked one carries the command's own cmdline)
        if len(a) > 2 and a[1:3] == ["-m", "tfrfs"]:
            children.roots.add(pid)
            return alone
        return False
    with PeakMemory(pick) as mem:
        secs, out = cli.run(*args)
    return secs, out, mem.peak_mib


def measure_cluster(args: Any) -> dict[str, Any]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    base = args.scale_data or OUT
    if args.cluster_text:
        data = text_dataset(base, args.cluster_records, args.cluster_shards)
    else:
        data = scale_dataset(args.cluster_records, args.cluster_shards, base)
    files = shard_files(data)
    size = sum(p.stat().st_size for p in files)
    cli = Cli(None, args.scale_timeout)
    work = WORK / "cluster"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    res: dict[str, Any] = {"dataset": str(data), "records": args.cluster_records, "shards": len(files),
                           "bytes": size, "load_before": _load(), "runs": {}}
    progress(f"--cluster: {len(files)} shards, {args.cluster_records:,} records, {size / 1e6:,.0f} MB")

    clusters: dict[str, tuple[Any, float]] = {}
    for label, nodes in (("Ray, this machine", 1), ("Ray, 2 nodes", 2)):
        cluster, secs = _start(nodes)
        clusters[label] = (cluster, secs)
        progress(f"{label}: cluster up in {secs:.1f}s at {cluster.address}")
    res["cluster_start_s"] = {k: v[1] for k, v in clusters.items()}
    ways: list[tuple[str, list[str], bool]] = [("one process", ["--workers", "1"], False),
                                               ("local pool", [], False)]
    ways += [(label, ["--ray", c.address], True) for label, (c, _) in clusters.items()]
    warm_cache = work / "cache-warm"
    try:
        cli.run("index", str(data), "--cache-dir", str(warm_cache))   # the reshard's source index
        for label, extra, ray in ways:
            row: dict[str, Any] = {}
            for step in ("index", "verify", "reshard"):
                dest = work / "resharded"
                shutil.rmtree(dest, ignore_errors=True)
                cache = work / f"cache-{len(res['runs'])}-{step}"
                cmd = {"index": ["index", str(data), "--cache-dir", str(cache)],
                       "verify": ["verify", str(data)],
                       "reshard": ["reshard", str(data), str(dest), "--shards", str(RESHARD_TO),
                                   "--cache-dir", str(warm_cache)]}[step] + extra
                progress(f"{label}: {step}")
                try:
                    secs, out, mem = _run_measured(cli, cmd, ray, alone=extra == ["--workers", "1"])
                    row[step] = {"s": secs, "mb_s": size / 1e6 / secs, "worker_mib": mem}
                    progress(f"  {secs:.2f}s, {size / 1e6 / secs:,.0f} MB/s, workers' peak {mem:.0f} MiB")
                except (TimedOut, RuntimeError) as exc:
                    row[step] = {"error": str(exc)[:300]}
                    progress(f"  failed: {str(exc)[:300]}")
                shutil.rmtree(cache, ignore_errors=True)
            res["runs"][label] = row
        # The reshard in the local pool when records must be read: for each new shard's part of the
        # schema (--schema), and from a source indexed without its schema (so its data checksums
        # were not checked then, and the copy checks each record).
        plain_cache = work / "cache-plain"
        cli.run("index", str(data), "--no-schema", "--cache-dir", str(plain_cache))
        for key, extra_args, cache_dir in (("reshard_schema", ["--schema"], warm_cache),
                                           ("reshard_checked", [], plain_cache)):
            dest = work / "resharded"
            shutil.rmtree(dest, ignore_errors=True)
            progress(f"local pool: reshard ({key})")
            try:
                secs, _, mem = _run_measured(cli, ["reshard", str(data), str(dest), "--shards", str(RESHARD_TO),
                                                   "--cache-dir", str(cache_dir), *extra_args], False, alone=False)
                res[key] = {"s": secs, "mb_s": size / 1e6 / secs, "worker_mib": mem}
                progress(f"  {secs:.2f}s, {size / 1e6 / secs:,.0f} MB/s")
            except (TimedOut, RuntimeError) as exc:
                res[key] = {"error": str(exc)[:300]}
        res["tf_reshard"] = _tf_reshard(files, work, args.cluster_records, args.scale_timeout)
        res["cp"] = _cp(data, work)
        if not args.cluster_no_raydata:
            res["raydata"] = _raydata(data, clusters["Ray, this machine"][0].address, args.scale_timeout)
    finally:
        for cluster, _ in clusters.values():
            cluster.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    res["load_after"] = _load()
    return res


def _tf_reshard(files: list[Path], work: Path, records: int, timeout: float) -> dict[str, Any]:
    dest = work / "tf-resharded"
    _drop_caches()
    progress("TensorFlow script: reshard")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", _TF_RESHARD, str(dest), str(RESHARD_TO), str(records),
                               *map(str, files)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"> {timeout:.0f} s", "s": timeout}
    secs = time.perf_counter() - t0
    shutil.rmtree(dest, ignore_errors=True)
    if proc.returncode != 0:
        return {"error": proc.stderr[-300:]}
    progress(f"  {secs:.1f}s")
    return {"s": secs}


def _cp(data: Path, work: Path) -> dict[str, Any]:
    best = None
    for _ in range(3):
        dest = work / "cp"
        shutil.rmtree(dest, ignore_errors=True)
        _drop_caches()
        t0 = time.perf_counter()
        subprocess.run(["cp", "-r", str(data), str(dest)], check=True)
        subprocess.run(["sync"], check=True)
        secs = time.perf_counter() - t0
        best = secs if best is None else min(best, secs)
        shutil.rmtree(dest, ignore_errors=True)
    progress(f"cp -r + sync: best of 3 {best:.2f}s")
    return {"s": best}


def _raydata(data: Path, address: str, timeout: float) -> dict[str, Any]:
    """``benchkit.raydata.read_figures`` in processes of their own, attached to the one-node
    cluster: ours on the whole dataset, then both readers on its first tenth of shards
    (``ray.data.read_tfrecords`` parses each record through TensorFlow and takes minutes a
    million records here)."""
    files = shard_files(data)
    part = files[:max(1, len(files) // 10)]
    subset = str(data / (part[0].name[:-len("00000-of-00100")] + "0000[0-9]-of-*")) if len(files) == 100 else str(part[0])
    out: dict[str, Any] = {}
    for key, path, mode in (("whole dataset, tfrfs", str(data), "ours"), (f"{len(part)} shards, both", subset, "both")):
        progress(f"Ray Data: {key}")
        code = ("import json, sys; sys.path.insert(0, sys.argv[2]); from benchkit.raydata import read_figures; "
                "print(json.dumps(read_figures(sys.argv[1], theirs=sys.argv[3] != 'ours')))")
        env = dict(os.environ, RAY_ADDRESS=address)
        _drop_caches()
        try:
            proc = subprocess.run([sys.executable, "-c", code, path, str(Path(__file__).resolve().parents[1]), mode],
                                  capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            out[key] = {"error": f"> {timeout:.0f} s"}
            continue
        out[key] = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else \
            {"error": proc.stderr[-600:]}
    return out


def print_cluster(res: dict[str, Any]) -> None:
    mb = res["bytes"] / 1e6
    print(f"\n== shard jobs: {res['shards']} shards, {res['records']:,} records, {mb:,.0f} MB "
          f"(load {res['load_before']} before, {res['load_after']} after) ==")
    starts = ", ".join(f"{k}: {v:.1f} s" for k, v in res["cluster_start_s"].items())
    print(f"Ray cluster start-up (not in the figures below): {starts}")
    head = ["", "index (cold, with schema)", "verify", f"reshard -> {RESHARD_TO}", "workers' peak RSS"]
    rows = []
    for label, row in res["runs"].items():
        cells = [label]
        for step in ("index", "verify", "reshard"):
            r = row.get(step, {})
            cells.append(f"{r['s']:.2f} s ({r['mb_s']:,.0f} MB/s)" if "s" in r else "failed")
        cells.append(" / ".join(f"{row[s]['worker_mib']:.0f}" for s in ("index", "verify", "reshard")
                                if "worker_mib" in row.get(s, {})) + " MiB")
        rows.append(cells)
    for key, what in (("reshard_checked", "local pool, reshard reading every record (source indexed --no-schema)"),
                      ("reshard_schema", "local pool, reshard --schema (each new shard's schema part)")):
        r = res.get(key, {})
        rows.append([what, "", "", f"{r['s']:.2f} s ({r['mb_s']:,.0f} MB/s)" if "s" in r else r.get("error", "")[:40],
                     f"{r.get('worker_mib', 0):.0f} MiB" if "s" in r else ""])
    tf, cp = res.get("tf_reshard", {}), res.get("cp", {})
    rows.append(["TensorFlow script", "", "", f"{tf['s']:.1f} s" if "s" in tf else tf.get("error", ""), ""])
    rows.append(["cp -r + sync (ceiling)", "", "", f"{cp['s']:.2f} s ({mb / cp['s']:,.0f} MB/s)" if "s" in cp else "", ""])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    pool = res["runs"].get("local pool", {}).get("reshard", {})
    ray = res["runs"].get("Ray, this machine", {}).get("reshard", {})
    if "s" in pool and "s" in cp:
        print(f"reshard, local pool: {cp['s'] / pool['s']:.0%} of cp (goal >= 80%)"
              + (f"; {tf['s'] / pool['s']:.1f}x the TensorFlow script (goal >= 10x)" if "s" in tf else ""))
    if "s" in pool and "s" in ray:
        print(f"reshard, Ray on this machine: {ray['s'] / pool['s'] - 1:+.0%} against the local pool (goal within 20%)")
    rd = res.get("raydata")
    if rd:
        print("\nRay Data reads (rows fully consumed):")
        for what, figures in rd.items():
            print(f"  {what}:")
            for k, v in figures.items():
                print(f"    {k}: {v}")
