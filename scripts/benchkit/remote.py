"""The remote mode (--remote): tfrfs and ratarmount reading the same dataset from an S3 bucket.

The bucket is moto's S3 server on loopback behind a proxy that adds a fixed latency to every
request and logs each one (tests/support/servers.py); both serve from threads of this process,
and every tool is pointed at the proxy, so that all requests pay the latency and are counted.
The bucket holds the dataset's shards twice, under plain/ (the shards alone) and indexed/ (with
tfrfs's index files beside them, written by `tfrfs index --beside`), and the tar of the mounted
tree that ratarmount serves under tar/, with ratarmount's own index beside it once its first
mount has built one. A plain s3fs copy of one large shard is the ceiling for cold sequential
reads. The phases, their order (ABBA) and the summaries are the local read side's
(schedule.py); the readers are workloads.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from tfrfs.fuse.mounttab import fstype_at

from .common import REPO, WORK, progress, run, timed_shell
from .datasets import build_dataset, derived_paths, file_lists, make_tar
from .report import fmt, print_columns, samples_of, target_cell
from .schedule import Abba, ToolRuns, drop_caches, run_phase_once, summarize, unmount_all
from .tools import Profiler, Ratarmount, Tfrfs, Tool, Unmounted, proc_cpu
from .workloads import (Phase, ReadInputs, Sample, ls_small, random_records, read_file, read_large,
                        walk_small)

BUCKET = "bench"
PLAIN, INDEXED, TARS = "plain", "indexed", "tar"   # the bucket's top-level prefixes
DEFAULT_LATENCY_MS = 20.0
TARGET_RATIO = 2.0
CEILING_SHARE = 80.0       # % of the s3fs copy's speed that tfrfs's cold copy of a shard must reach
REQUEST_LOGS = WORK / "remote-requests"


def _servers() -> Any:
    """tests/support/servers.py, the loopback servers the remote tests use too."""
    tests = str(REPO / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from support import servers
    return servers


class Bucket:
    """The S3 server, the proxy every tool reaches it through, and the sizes of the objects in
    the bucket (to count the bytes the proxy relayed)."""

    def __init__(self, latency_s: float) -> None:
        self.servers = _servers()
        self.s3 = self.servers.S3Server()
        self.proxy: Any = None     # started once the server is
        self.latency_s = latency_s
        self.sizes: dict[str, int] = {}
        self.env: dict[str, str] = {}

    def __enter__(self) -> "Bucket":
        try:
            self.s3.start()
        except ImportError as exc:
            raise SystemExit(f"scripts/bench --remote needs moto's server and s3fs ({exc}); "
                             f"pip install -e '.[test,s3]'") from exc
        self.proxy = self.servers.FaultProxy(self.s3.url)
        self.proxy.start()
        self.proxy.latency = self.latency_s
        self.s3.make_bucket(BUCKET)
        # What every tool's process gets: credentials, and the proxy as the endpoint.
        self.env = {**os.environ, **self.s3.env(self.proxy.url)}
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        self.s3.stop()

    @staticmethod
    def url(key: str) -> str:
        return f"s3://{BUCKET}/{key}"

    def upload(self, path: Path, key: str) -> None:
        """Straight to the server, not through the proxy."""
        self.s3.upload_file(path, BUCKET, key)
        self.sizes[key] = path.stat().st_size

    def refresh_sizes(self) -> None:
        """Every object's size, after a tool wrote objects of its own."""
        client = self.s3.client()
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
        self.sizes = {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}

    def server_cost(self, keys: list[str], span: int = 1 << 20, times: int = 3) -> dict[str, float]:
        """Milliseconds the server alone (no proxy) takes to answer a ranged GET of ``span`` bytes
        of each object: moto reads the whole object for every ranged GET, so the cost of a request
        grows with the size of the object it reads from, on top of the proxy's latency."""
        client = self.s3.client()
        out = {}
        for key in keys:
            n = max(1, min(span, self.sizes[key] // times))
            t0 = time.perf_counter()
            for i in range(times):
                client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={i * n}-{(i + 1) * n - 1}")["Body"].read()
            out[key] = (time.perf_counter() - t0) / times * 1000.0
        return out

    def traffic(self, key: str, tool: str) -> Sample:
        """The requests the proxy relayed since its last reset, and the object bytes they fetched
        (from each GET's Range, or the object's size for a whole-object GET; listings and other
        small answers count as requests only). Each request is also listed in
        bench-out/work/remote-requests/TOOL-KEY.log (the last run's)."""
        requests = self.proxy.requests
        REQUEST_LOGS.mkdir(parents=True, exist_ok=True)
        with open(REQUEST_LOGS / f"{tool.replace(' ', '-')}-{key}.log", "w") as log:
            log.writelines(f"{r.method} {r.status} {r.range_header or '-'} {r.path}\n" for r in requests)
        nbytes = 0
        for r in requests:
            if r.method != "GET" or r.status >= 300:
                continue
            path = urllib.parse.unquote(urllib.parse.urlsplit(r.path).path)
            size = self.sizes.get(path.removeprefix(f"/{BUCKET}/"))
            if size is None:
                continue
            span = self.servers.parse_range(r.range_header, size)
            if span is None:
                nbytes += size
            elif isinstance(span, tuple):
                nbytes += span[1] - span[0] + 1
        return {f"{key}_requests": len(requests), f"{key}_fetched_mib": nbytes / 2**20}


# --- the tools, reading from the bucket ----------------------------------------------

class RemoteTool:
    """What the remote phases ask of each tool besides mounting: which index to start from
    (built at mount time, or shipped beside the data) and forgetting fetched data."""

    def use_shipped(self, shipped: bool) -> None:
        pass

    def drop_data_cache(self) -> None:
        pass


class RemoteTfrfs(RemoteTool, Tfrfs):
    """tfrfs mounting the shards in the bucket: from plain/ (its mount scans every shard) or from
    indexed/ (it fetches the index files beside them). Its cache folder holds both the indexes
    and the fetched blocks; a cold mount starts with it empty."""

    def __init__(self, mnt: Path, bucket: Bucket, cache_dir: Path) -> None:
        super().__init__(mnt, bucket.url(INDEXED), cache_dir, env=bucket.env)
        self.bucket = bucket

    def use_shipped(self, shipped: bool) -> None:
        self.source = self.bucket.url(INDEXED if shipped else PLAIN)

    def drop_data_cache(self) -> None:
        self.reset_index()


class RemoteRatarmount(RemoteTool, Ratarmount):
    """ratarmount mounting the tar in the bucket through its fsspec support (s3fs, with s3fs's
    default read cache). It runs in the foreground, in the background of this process (it will
    not daemonize while s3fs's threads run). Its index is either built from the remote tar into
    a local file (deleted for a cold mount), or the one shipped beside the tar, which it
    downloads into a fresh temporary folder at each mount. It keeps fetched data in memory
    only, so every mount starts without it."""

    def __init__(self, mnt: Path, bucket: Bucket, tar_key: str, index: Path, fuse_opts: str) -> None:
        super().__init__(mnt, bucket.url(tar_key), index, fuse_opts)
        self.bucket = bucket
        self.index_key = tar_key + ".index.sqlite"
        self.shipped = True
        self.tmp = WORK / "ratarmount-index-tmp"
        self.out = WORK / "ratarmount.log"
        self.proc: subprocess.Popen | None = None

    @classmethod
    def ensure_installed(cls) -> str:
        """ratarmount, plus s3fs in its venv; names s3fs's default read cache, which it uses."""
        version = super().ensure_installed()
        probe = [str(cls.VENV / "bin" / "python"), "-c",
                 "import s3fs; fs = s3fs.S3FileSystem(anon=True, skip_instance_cache=True); "
                 "print(s3fs.__version__, fs.default_cache_type, fs.default_block_size)"]
        if subprocess.run(probe, capture_output=True).returncode != 0:
            progress(f"installing s3fs into {cls.VENV}")
            run([str(cls.VENV / "bin" / "pip"), "install", "-q", "s3fs"])
        s3fs_version, cache, block = run(probe).stdout.split()
        return f"{version}; s3fs {s3fs_version}, {cache} cache of {int(block) / 2**20:g} MiB"

    def use_shipped(self, shipped: bool) -> None:
        self.shipped = shipped

    def reset_index(self) -> None:
        super().reset_index()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def ship_index(self) -> None:
        """Put the index its last cold mount built beside the tar in the bucket."""
        self.bucket.upload(self.index, self.index_key)

    def _mount(self) -> None:
        index = self.bucket.url(self.index_key) if self.shipped else str(self.index)
        self.tmp.mkdir(parents=True, exist_ok=True)
        cmd = [str(self.bin), "-f", "--index-file", index]
        if self.fuse_opts:
            cmd += ["-o", self.fuse_opts]
        env = {**self.bucket.env, "RATARMOUNT_INDEX_TMPDIR": str(self.tmp)}
        with open(self.out, "ab") as log:
            self.proc = subprocess.Popen(cmd + [str(self.tar), str(self.mnt)], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, env=env, start_new_session=True)
        deadline = time.monotonic() + 600
        while not fstype_at(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.reap(timeout=0)
                tail = self.out.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"ratarmount did not mount {self.tar} at {self.mnt}; log {self.out}:\n{tail}")
            time.sleep(0.005)

    def _umount(self) -> None:
        super()._umount()
        self.reap()

    def reap(self, timeout: float = 60.0) -> None:
        """Wait for the foreground process to end (it does once unmounted); kill it after
        ``timeout`` seconds."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class S3fsCopy(RemoteTool, Unmounted):
    """The ceiling, not a competitor: a plain s3fs copy of a shard object to the local disk, in a
    process of its own (s3copy.py)."""

    name = "s3fs copy"

    def __init__(self, bucket: Bucket) -> None:
        super().__init__(WORK / "s3fs-copy")
        self.bucket = bucket

    def copy(self, key: str, dest: Path) -> float:
        out = run([sys.executable, str(Path(__file__).with_name("s3copy.py")), self.bucket.proxy.url,
                   f"{BUCKET}/{key}", str(dest)], env=self.bucket.env).stdout
        return float(json.loads(out.splitlines()[-1])["seconds"])


# --- the phases -------------------------------------------------------------------

@dataclass
class RemoteInputs(ReadInputs):
    bucket: Bucket
    shard: str        # the large shard that the ceiling phase copies, relative to the dataset


@dataclass(frozen=True)
class RemotePhase(Phase):
    fresh: bool = True    # start with an empty data cache (False: keep what the phase before left)


Work = Callable[[Tool, ReadInputs], Sample]


def with_traffic(key: str, work: Work, *, own: bool = False) -> Work:
    """``work`` plus the requests and bytes its mount cost before it started (keys
    ``KEY_mount_requests``, ``KEY_mount_fetched_mib``: a mount may fetch data before the work
    asks for it) and those of the work itself (``KEY_requests``, ``KEY_fetched_mib``), unless it
    counts its own (``own``)."""
    def measured(tool: Tool, inp: ReadInputs) -> Sample:
        assert isinstance(inp, RemoteInputs)
        mount = inp.bucket.traffic(f"{key}_mount", tool.name)   # reset before the mount
        inp.bucket.proxy.reset()
        sample = work(tool, inp)
        if not own:
            sample.update(inp.bucket.traffic(key, tool.name))
        sample.update(mount)
        return sample
    return measured


def walk_twice(tool: Tool, inp: ReadInputs) -> Sample:
    """Every small file by walking the tree on a cold mount; then, after dropping the page cache,
    again on the same mount: what its own cache kept."""
    assert isinstance(inp, RemoteInputs)
    sample: Sample = {}
    for key in ("walk", "again"):
        if key == "again":
            drop_caches()
            progress("  again, on the same mount:")
        inp.bucket.proxy.reset()
        cpu0 = proc_cpu(tool.pid)
        walked = walk_small(tool, inp)
        sample.update({f"{key}_files_per_s": walked["walk_files_per_s"], f"{key}_walk_s": walked["walk_s"],
                       f"{key}_cpu_s": proc_cpu(tool.pid) - cpu0, **inp.bucket.traffic(key, tool.name)})
        sample.setdefault("walk_files", walked["walk_files"])
    progress(f"  requests: {sample['walk_requests']:,.0f} cold, {sample['again_requests']:,.0f} again")
    return sample


def walk_remounted(tool: Tool, inp: ReadInputs) -> Sample:
    """The walk once more, on a new mount that kept the cache the walk phase filled."""
    walked = walk_small(tool, inp)
    return {"remount_files_per_s": walked["walk_files_per_s"], "remount_walk_s": walked["walk_s"]}


def _record_files(lists: dict[str, list[str]]) -> dict[str, str]:
    """One file per small record: its image where it has one, else its first file."""
    out: dict[str, str] = {}
    for rel in lists["small_files"]:
        record, _, inside = rel.rpartition("/")
        while record.count("/") > 2:            # small/SHARD/RECORD/...
            record, _, _ = record.rpartition("/")
        if record not in out or rel.startswith(record + "/image/encoded."):
            out[record] = rel
    return out


def one_file_per_record(tool: Tool, inp: ReadInputs) -> Sample:
    """Read one file (the image) of each of --random records picked at random, on a cold mount:
    the requests and bytes per record, and the time to the file's last byte.

    Records picked at random share blocks (or read-ahead windows) with records read before them
    when the sample is dense, so the requests are also counted per record: those made while it
    was read (one that made none was served from what an earlier one fetched)."""
    assert isinstance(inp, RemoteInputs)
    files = _record_files(inp.lists)
    pool = inp.lists["small_records"]
    pick = random.Random(inp.args.seed + 1).sample(pool, min(inp.args.random, len(pool)))
    proxy = inp.bucket.proxy
    proxy.reset()
    lat, counts = [], []
    for rec in pick:
        before = len(proxy.requests)
        t0 = time.perf_counter()
        read_file(str(tool.mnt / files[rec]))
        lat.append((time.perf_counter() - t0) * 1000.0)
        counts.append(len(proxy.requests) - before)
    traffic = inp.bucket.traffic("one_file", tool.name)
    n = len(pick)
    fetching = [c for c in counts if c]
    sample = {"one_file_records": n, "one_file_median_ms": statistics.median(lat),
              "requests_per_record": traffic["one_file_requests"] / n,
              "mib_per_record": traffic["one_file_fetched_mib"] / n,
              "records_fetching": len(fetching),
              "requests_per_fetching_record": sum(fetching) / len(fetching) if fetching else 0.0,
              "requests_max_one_record": max(counts), **traffic}
    progress(f"  {n} records: {sample['requests_per_record']:.2f} requests and {sample['mib_per_record']:.3f} MiB "
             f"per record; {len(fetching)} records made requests, {sample['requests_per_fetching_record']:.2f} "
             f"each (at most {max(counts)}); median {sample['one_file_median_ms']:.1f} ms")
    return sample


def copy_shard(tool: Tool, inp: ReadInputs) -> Sample:
    """Copy one large shard cold: `cp -r` of its folder from a mount, or the s3fs copy of the
    shard object; MiB/s of the shard's bytes either way."""
    assert isinstance(inp, RemoteInputs)
    dest = WORK / "shard-copy"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    key = f"{INDEXED}/{inp.shard}"
    try:
        if isinstance(tool, S3fsCopy):
            t = tool.copy(key, dest / Path(inp.shard).name)
        else:
            t, _ = timed_shell(f"cp -r {shlex.quote(str(tool.mnt / inp.shard))} {shlex.quote(str(dest))}/")
    finally:
        shutil.rmtree(dest, ignore_errors=True)
    size = inp.bucket.sizes[key]
    progress(f"  {size / 2**20:.0f} MiB in {t:.2f}s: {size / 2**20 / t:,.0f} MiB/s")
    return {"shard_copy_s": t, "shard_copy_mib_per_s": size / 2**20 / t}


@dataclass(frozen=True)
class MountPhase:
    key: str
    name: str
    shipped: bool


MOUNT_PHASES = [MountPhase("mount_cold", "mount, no index shipped", False),
                MountPhase("mount_shipped", "mount, index shipped", True)]
PHASES = [
    RemotePhase("ls -lR", with_traffic("ls", ls_small), ("ls_lR_s",)),
    RemotePhase("walk and read small files, twice", with_traffic("walk", walk_twice, own=True),
                ("walk_files_per_s", "again_files_per_s")),
    RemotePhase("walk again after a remount", with_traffic("remount", walk_remounted), ("remount_files_per_s",),
                fresh=False),   # right after the walk: the cache it filled
    RemotePhase("read large files", with_traffic("large", read_large), ("large_mib_per_s",)),
    RemotePhase("random records", with_traffic("random", random_records), ("random_median_ms", "random_p95_ms")),
    RemotePhase("one file of random records", with_traffic("one_file", one_file_per_record, own=True),
                ("requests_per_record",)),
    RemotePhase("copy a large shard", with_traffic("copy", copy_shard), ("shard_copy_mib_per_s",), ceiling=True),
]
TRAFFIC = [("mount_cold", "mount, no index shipped"), ("mount_shipped", "mount, index shipped"),
           ("ls", "ls -lR"), ("walk", "walk, cold"), ("again", "walk again, same mount"),
           ("remount", "walk again, remounted"), ("large", "large files"), ("random", "random records"),
           ("one_file", "one file of random records"), ("copy", "copy a large shard")]


def mount_once(tool: Tool, phase: MountPhase, bucket: Bucket) -> Sample:
    """A mount with empty caches, timed until it answers, with the requests it made."""
    assert isinstance(tool, RemoteTool)
    tool.use_shipped(phase.shipped)
    tool.reset_index()
    drop_caches()
    bucket.proxy.reset()
    t = tool.mount()
    sample = {f"{phase.key}_s": t, **bucket.traffic(phase.key, tool.name)}
    tool.record_mem(phase.name)
    tool.umount()
    progress(f"  mounted in {t:.2f}s: {sample[f'{phase.key}_requests']:,.0f} requests, "
             f"{sample[f'{phase.key}_fetched_mib']:.1f} MiB fetched")
    return sample


def measure(tools: list[Tool], ceiling: S3fsCopy, inp: RemoteInputs,
            profiler: Profiler | None) -> tuple[dict[str, ToolRuns], list[dict[str, Any]]]:
    runs = {tool.name: ToolRuns() for tool in tools + [ceiling]}
    order = Abba(tools, inp.args.repeat)
    for mp in MOUNT_PHASES:
        for _rep, tool, first in order.runs(mp.name):
            runs[tool.name].add(mp.name, mount_once(tool, mp, inp.bucket), first)
        if not mp.shipped:
            for tool in tools:
                if isinstance(tool, RemoteRatarmount):
                    tool.ship_index()
    for phase in PHASES:
        total = inp.args.repeat * phase.times
        for rep, tool, first in order.runs(phase.name, phase.times, [ceiling] if phase.ceiling else None):
            assert isinstance(tool, RemoteTool)
            tool.use_shipped(True)
            if phase.fresh:
                tool.drop_data_cache()
            suffix = f"-{rep + 1}" if total > 1 else ""
            inp.bucket.proxy.reset()   # the mount's requests are counted too, apart
            run_phase_once(tool, phase, inp, runs[tool.name], first,
                           profiler=profiler if isinstance(tool, Tfrfs) else None,
                           profile_as=f"remote-{tool.name}-{phase.name}{suffix}", keep=False)
    return runs, order.log


# --- setting up: the local files, the bucket ---------------------------------------

def local_lists(src: Path, meta: dict[str, Any], args: argparse.Namespace, need_tar: bool) -> tuple[dict[str, list[str]], Path]:
    """The file lists and the tar the local read side uses (made from a local tfrfs mount of the
    dataset when they are not cached yet)."""
    tar, list_path = derived_paths(meta, args.rebuild)
    if list_path.exists() and (tar.exists() or not need_tar):
        return json.loads(list_path.read_text()), tar
    tf = Tfrfs(WORK / "mnt-tfrfs", src, WORK / "tfrfs-cache")
    tf.mount()
    try:
        lists = file_lists(tf.mnt, meta, list_path)
        if need_tar and not tar.exists():
            make_tar(tf.mnt, tar)
    finally:
        tf.umount()
    return lists, tar


def fill_bucket(bucket: Bucket, src: Path, tar: Path | None) -> dict[str, Any]:
    """Upload the shards (twice) and the tar; ship tfrfs's index files beside the indexed/ copy."""
    shards = sorted(src.rglob("*.tfrecord"))
    progress(f"uploading {len(shards)} shards to s3://{BUCKET}/{PLAIN}/ and /{INDEXED}/"
             + (f", {tar.name} to /{TARS}/" if tar else ""))
    t0 = time.perf_counter()
    for path in shards:
        rel = path.relative_to(src).as_posix()
        for prefix in (PLAIN, INDEXED):
            bucket.upload(path, f"{prefix}/{rel}")
    if tar is not None:
        bucket.upload(tar, f"{TARS}/{tar.name}")
    upload_s = time.perf_counter() - t0
    progress(f"  uploaded in {upload_s:.1f}s; shipping tfrfs's indexes: tfrfs index {bucket.url(INDEXED)} --beside")
    scratch = WORK / "tfrfs-index-run"
    shutil.rmtree(scratch, ignore_errors=True)
    t0 = time.perf_counter()
    out = run([sys.executable, "-m", "tfrfs", "index", bucket.url(INDEXED), "--beside", "--cache-dir", str(scratch)],
              env=bucket.env).stdout
    index_s = time.perf_counter() - t0
    shutil.rmtree(scratch, ignore_errors=True)
    progress("  " + "; ".join(out.strip().splitlines()))
    bucket.refresh_sizes()
    shipped = [k for k in bucket.sizes if k.startswith(f"{INDEXED}/") and k.endswith(".tfrfs-idx")]
    if len(shipped) != len(shards):
        raise RuntimeError(f"tfrfs index --beside wrote {len(shipped)} index files for {len(shards)} shards")
    # What one request costs the server on the smallest and the largest shard, and on the tar.
    by_size = sorted((bucket.sizes[f"{INDEXED}/{p.relative_to(src).as_posix()}"], p) for p in shards)
    probes = [f"{INDEXED}/{p.relative_to(src).as_posix()}" for _, p in (by_size[0], by_size[-1])]
    if tar is not None:
        probes.append(f"{TARS}/{tar.name}")
    cost = bucket.server_cost(probes)
    progress("  the server alone answers a 1 MiB ranged GET in " + ", ".join(
        f"{ms:.0f} ms on {k} ({bucket.sizes[k] / 2**20:.0f} MiB)" for k, ms in cost.items()))
    return {"upload_s": round(upload_s, 2), "index_beside_s": round(index_s, 2),
            "index_files_bytes": sum(bucket.sizes[k] for k in shipped),
            "server_ms_per_get": {k: {"ms": round(ms, 1), "object_mib": round(bucket.sizes[k] / 2**20, 1)}
                                  for k, ms in cost.items()}}


# --- the table --------------------------------------------------------------------

# key, label, unit, higher is better, goal: "twice" (ratarmount's figure, twice over),
# ("at most", N) or ("at least", N) for tfrfs's own figure, or None
ROWS: list[tuple[str, str, str, bool, Any]] = [
    ("mount_cold_s", "mount, no index shipped (empty caches)", "s", False, "twice"),
    ("mount_shipped_s", "mount, index shipped beside the data (empty caches)", "s", False, "twice"),
    ("ls_lR_s", "ls -lR small > /dev/null", "s", False, "twice"),
    ("walk_files_per_s", "read every small file (walking the tree)", "files/s", True, "twice"),
    ("large_mib_per_s", "read the ~2 MB files", "MiB/s", True, "twice"),
    ("random_median_ms", "random record, median", "ms", False, "twice"),
    ("random_p95_ms", "random record, p95", "ms", False, "twice"),
    ("requests_per_record", "requests per random record (one file)", "requests", False, ("at most", 1)),
    ("requests_per_fetching_record", "  the same, per record that made any", "requests", False, ("at most", 1)),
    ("mib_per_record", "fetched per random record (one file)", "MiB", False, None),
    ("again_files_per_s", "second pass, same mount", "files/s", True, "twice"),
    ("again_requests", "second pass, same mount: requests", "requests", False, ("at most", 0)),
    ("remount_files_per_s", "second pass, remounted (same cache dir)", "files/s", True, "twice"),
    ("remount_requests", "second pass, remounted: requests", "requests", False, ("at most", 0)),
    ("shard_copy_mib_per_s", "cold copy of a large shard (cp -r)", "MiB/s", True, "twice"),
    ("shard_copy_share", "cold copy of a large shard, vs s3fs copy", "%", True, ("at least", CEILING_SHARE)),
    ("peak_mib", "daemon peak memory (VmHWM)", "MiB", False, None),
]


def compare(tf: dict[str, Any], rat: dict[str, Any] | None) -> list[dict[str, Any]]:
    rows = []
    for key, label, unit, higher, goal in ROWS:
        a = tf.get(key)
        b = rat.get(key) if rat else None
        ratio = None
        if a is not None and b is not None and a > 0 and b > 0:
            ratio = a / b if higher else b / a
        target, met = None, None
        if goal == "twice":
            target = f">= {TARGET_RATIO:g}x"
            met = None if ratio is None else ratio >= TARGET_RATIO
        elif goal is not None:
            kind, bound = goal
            target = f"{'<=' if kind == 'at most' else '>='} {bound:g}"
            met = None if a is None else (a <= bound if kind == "at most" else a >= bound)
        rows.append({"metric": key, "label": label, "unit": unit, "tfrfs": a, "ratarmount": b, "ratio": ratio,
                     "target": target, "target_met": met})
    return rows


def print_table(rows: list[dict[str, Any]], results: dict[str, Any]) -> None:
    meta, remote = results["dataset"], results["remote"]
    rat = results["ratarmount_version"]
    print(f"dataset {meta['name']}: {meta['small']:,} small records in {meta['shards']} shards + {meta['large']} "
          f"large records, {meta['bytes'] / 2**20:.0f} MiB, in S3 (moto on loopback) behind a proxy adding "
          f"{remote['latency_ms']:g} ms to every request; "
          + (f"ratarmount {rat} serves the tar of the same tree (ratio: >1 means tfrfs is better)" if rat
             else "ratarmount not measured (--no-ratarmount)"))
    head = ["metric", "unit", "tfrfs", "ratarmount", "ratio", "goal met"]
    body = [[r["label"], r["unit"], fmt(r["tfrfs"]), fmt(r["ratarmount"]),
             "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}x", target_cell(r)] for r in rows]
    print_columns(head, body)
    missed = [r["label"] for r in rows if r["target_met"] is False]
    print(f"goals met: {sum(1 for r in rows if r['target_met'])} of {sum(1 for r in rows if r['target'])}"
          + (f"; missed: {', '.join(missed)}" if missed else ""))


def print_notes(results: dict[str, Any], repeat: int) -> None:
    tools, c = results["tools"], results["ceiling"]
    tf = tools["tfrfs"]
    rat = tools.get("ratarmount")
    print(f"ceiling: a plain s3fs copy of {c['shard']} ({c['shard_mib']:.0f} MiB) in its own process: "
          f"{fmt(c['mib_per_s'])} MiB/s (samples {' '.join(fmt(v) for v in c['samples'])}); tfrfs's cp -r "
          f"{tf['shard_copy_share']:.0f}% of it (goal >= {CEILING_SHARE:g}%)"
          + (f", ratarmount's {rat['shard_copy_share']:.0f}%" if rat else ""))
    two = len(tools) > 1
    print(f"each figure: the median of {repeat} run(s) per tool, each on a fresh mount after dropping the page "
          f"cache; tfrfs mounts the shards with their shipped indexes and an empty cache folder (its second "
          f"pass after a remount keeps the cache of the walk before it), ratarmount its shipped index"
          + ("; the tools run back to back per phase, alternating which goes first (ABBA)" if two else ""))
    print("samples in repetition order" + (" (* ran first of its pair):" if two else ":"))
    labels = {key: f"{label} ({unit})" for key, label, unit, _h, _g in ROWS}
    phases: list[Any] = MOUNT_PHASES + PHASES
    for phase in phases:
        keys = (f"{phase.key}_s",) if isinstance(phase, MountPhase) else phase.shown
        for key in keys:
            print(f"  {labels[key]}: " + " | ".join(f"{name} {samples_of(r, phase.name, key, two)}"
                                                     for name, r in tools.items()))
    print("requests through the proxy / MiB fetched (medians), in the work and [by its mount before it]:")
    for key, what in TRAFFIC:
        def cell(r: dict[str, Any]) -> str:
            text = f"{fmt(r.get(f'{key}_requests'))} / {fmt(r.get(f'{key}_fetched_mib'))}"
            if f"{key}_mount_requests" in r:
                text += f" [{fmt(r[f'{key}_mount_requests'])} / {fmt(r[f'{key}_mount_fetched_mib'])}]"
            return text
        print(f"  {what}: " + " | ".join(f"{name} {cell(r)}" for name, r in tools.items()))
    for phase in PHASES:
        print(f"  daemon CPU (s), {phase.name}: "
              + " | ".join(f"{name} " + " ".join(f"{v:.2f}" for v in r["daemon_cpu_samples_s"].get(phase.name, []))
                           for name, r in tools.items()))
    print("  daemon CPU (s) of the walk's passes: " + " | ".join(
        f"{name} cold {fmt(r.get('walk_cpu_s'))}, again {fmt(r.get('again_cpu_s'))}" for name, r in tools.items()))
    cost = results["remote"]["server_ms_per_get"]
    print("  the server alone (no proxy) answers a 1 MiB ranged GET in " + ", ".join(
        f"{v['ms']:.0f} ms on {k.rsplit('/', 1)[-1]} ({v['object_mib']:.0f} MiB)" for k, v in cost.items())
          + f": moto reads the whole object for each ranged GET, so each request on a big object costs that "
            f"much besides the proxy's {results['remote']['latency_ms']:g} ms")
    loads = [run["loadavg_1min"] for run in results["read_runs"]]
    print(f"  load average (1 min) at the start of the runs: {min(loads):.2f} .. {max(loads):.2f}; set-up: "
          f"upload {results['remote']['upload_s']:.1f}s, tfrfs index --beside {results['remote']['index_beside_s']:.1f}s")


# --- the mode ----------------------------------------------------------------------

def remote_phases(args: argparse.Namespace, results: dict[str, Any], profiler: Profiler | None) -> None:
    """The remote mode: sets up the bucket, measures, prints the table."""
    if args.only_commit:
        from .remotecommit import measure_commits, print_commits
        with Bucket(args.latency_ms / 1000.0) as bucket:
            results["commit"] = measure_commits(bucket)
        print_commits(results["commit"])
        return
    rat_version = None if args.no_ratarmount else RemoteRatarmount.ensure_installed()
    src, meta = build_dataset(args.small, args.large, args.shards, args.rebuild)
    lists, tar = local_lists(src, meta, args, need_tar=not args.no_ratarmount)
    # The last large shard: the tar holds large/ first, and ratarmount's mount reads the tar's start.
    shard = sorted(p.relative_to(src).as_posix() for p in (src / "large").glob("*.tfrecord"))[-1]
    results.update({"dataset": meta, "ratarmount_version": rat_version, "ratarmount_fuse": args.ratarmount_fuse,
                    "repeat": args.repeat})
    with Bucket(args.latency_ms / 1000.0) as bucket:
        results["remote"] = {"latency_ms": args.latency_ms, "bucket": BUCKET, "proxy": "support.servers.FaultProxy",
                             **fill_bucket(bucket, src, None if args.no_ratarmount else tar)}
        tf = RemoteTfrfs(WORK / "mnt-tfrfs-remote", bucket, WORK / "tfrfs-remote-cache")
        tools: list[Tool] = [tf]
        if not args.no_ratarmount:
            tools.append(RemoteRatarmount(WORK / "mnt-ratarmount-remote", bucket, f"{TARS}/{tar.name}",
                                          WORK / "ratarmount-remote.index.sqlite", args.ratarmount_fuse))
        ceiling = S3fsCopy(bucket)
        inp = RemoteInputs(lists, meta, args, bucket, shard)
        try:
            runs, results["read_runs"] = measure(tools, ceiling, inp, profiler)
        finally:
            unmount_all(tools)
            for tool in tools:
                if isinstance(tool, RemoteRatarmount):
                    tool.reap()
        shard_mib = bucket.sizes[f"{INDEXED}/{shard}"] / 2**20
        from .remotecommit import measure_commits
        results["commit"] = measure_commits(bucket)
    for tool in tools:
        results["tools"][tool.name] = summarize(tool, runs[tool.name])
    top = summarize(ceiling, runs[ceiling.name])
    results["ceiling"] = {"what": "a plain s3fs copy (get_file) of one large shard", "shard": shard,
                          "shard_mib": shard_mib, "mib_per_s": top["shard_copy_mib_per_s"],
                          "samples": top["samples"]["shard_copy_mib_per_s"]}
    for r in results["tools"].values():
        r["shard_copy_share"] = 100.0 * r["shard_copy_mib_per_s"] / top["shard_copy_mib_per_s"]
    rows = compare(results["tools"]["tfrfs"], results["tools"].get("ratarmount"))
    results["table"] = rows
    print_table(rows, results)
    print_notes(results, args.repeat)
    from .remotecommit import print_commits
    print_commits(results["commit"])
