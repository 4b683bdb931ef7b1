"""``scripts/bench --scale``: datasets at scale (``scaledata``), as a user meets them.

Index building, for 100 million 50-byte records (1,000 shards) and for 2 KB C4-like records, each
step after emptying the page cache: ``cat`` of the shards (the disk's ceiling: the best of three),
``verify``, a cold ``index --no-schema`` and a cold ``index`` (a fresh cache folder), and for the
tiny records tfd-utils' index prebuild (its own venv) as the anchor.

The billion-record tree (ten folders of hard links to the same shards and their shipped indexes,
plus the manifest of ``index --beside`` where the code writes one), mounted read-only: mount time
(cold: page cache emptied and a fresh cache folder; then warm), the daemon's RSS after it, after
touching 100 shards and after listing every shard folder of one copy (``os.scandir``: nothing
sorted), the first ``ls`` of an untouched shard and a second ``ls`` of it, and index bytes a record.

``--code DIR`` measures the tfrfs of another checkout the same way, as the "before" column (what
it lacks, such as ``index --no-schema`` or the manifest, is left out); ``--scale-before FILE``
takes that column from an earlier run's ``--json``. ``--scale-edits`` adds the steps of the
first edits (``measure_edits``). A step that outlasts ``--scale-timeout`` is stopped and shown as
``> N s``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from .common import OUT, WORK, progress, run
from .scaledata import IDX, linked_tree, scale_dataset, shard_files, text_dataset
from .tools import find_pids, fstype_at, force_unmount, proc_mem


class TimedOut(Exception):
    def __init__(self, seconds: float) -> None:
        super().__init__(f"> {seconds:.0f} s")
        self.seconds = seconds


def _drop_caches() -> None:
    if os.geteuid() == 0:
        subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=False)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


class Cli:
    """``python -m tfrfs`` of one checkout."""

    def __init__(self, code: Path | None, timeout: float = 900.0) -> None:
        self.env = dict(os.environ)
        if code is not None:
            self.env["PYTHONPATH"] = str(code)
        self.code = code
        self.timeout = timeout

    def run(self, *args: str, ok: tuple[int, ...] = (0, 1), env: dict[str, str] | None = None,
            limit: bool = True) -> tuple[float, str]:
        t0 = time.perf_counter()
        # Run from the checkout measured: ``python -m`` looks in the current folder first.
        try:
            proc = subprocess.run([sys.executable, "-m", "tfrfs", *args], capture_output=True, text=True,
                                  env=dict(self.env, **(env or {})), timeout=self.timeout if limit else None,
                                  cwd=str(self.code) if self.code is not None else None)
        except subprocess.TimeoutExpired:
            raise TimedOut(self.timeout) from None
        elapsed = time.perf_counter() - t0
        if proc.returncode not in ok or "Traceback" in proc.stderr:
            raise RuntimeError(f"tfrfs {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return elapsed, proc.stdout

    def knows(self, option: str, command: str) -> bool:
        _, out = self.run(command, "--help", ok=(0,))
        return option in out

    def has_module(self, name: str) -> bool:
        """Whether the checkout has a module ``NAME.py`` anywhere in ``tfrfs/`` (the manifest, for one,
        is new; the package is grouped in sub-packages since)."""
        code = self.code if self.code is not None else Path(__file__).resolve().parents[2]
        return any((code / "tfrfs").rglob(f"{name}.py"))

    @property
    def name(self) -> str:
        return str(self.code) if self.code is not None else "this checkout"


def _files_mb(files: list[Path]) -> float:
    return sum(p.stat().st_size for p in files) / 1e6


# --- index building -------------------------------------------------------------------------------

TFD_VENV = OUT / "tfd-utils-venv"

# tfd-utils' ``tfd prebuild``, with the key feature of these records (its CLI reads ``key`` only)
# and the index written to a file of ours instead of beside the shards.
_TFD_PREBUILD = """
import multiprocessing, sys
from tfd_utils import TFRecordRandomAccess
files = sys.argv[3:]
workers = max(multiprocessing.cpu_count() * 2, 32)   # tfd prebuild's default
reader = TFRecordRandomAccess(files, key_feature_name=sys.argv[1], index_file=sys.argv[2], max_workers=workers)
print(len(reader.index))
"""


def ensure_tfd_utils() -> Path:
    """tfd-utils in a venv of its own: it wants protobuf < 6, which tfrfs's venv must not get."""
    py = TFD_VENV / "bin" / "python"
    if not (TFD_VENV / ".complete").exists():
        progress(f"installing tfd-utils into {TFD_VENV}")
        run(["python3", "-m", "venv", str(TFD_VENV)])
        run([str(TFD_VENV / "bin" / "pip"), "install", "-q", "tfd-utils"])
        (TFD_VENV / ".complete").touch()
    return py


def tfd_prebuild(files: list[Path], key: str, timeout: float) -> dict[str, Any]:
    py = ensure_tfd_utils()
    index = WORK / "tfd-utils.index"
    index.unlink(missing_ok=True)
    _drop_caches()
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([str(py), "-c", _TFD_PREBUILD, key, str(index), *map(str, files)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TimedOut(timeout) from None
    finally:
        index.unlink(missing_ok=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"tfd-utils prebuild failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {"s": elapsed, "records": int(proc.stdout.split()[-1]), "shards": len(files), "mb": _files_mb(files)}


def _attempt(out: dict[str, Any], key: str, step: Callable[[], Any]) -> None:
    """``out[key] = step()``, or the time limit it hit (``out[key + "_timeout"]``)."""
    out.setdefault("load", {})[key] = _load()
    try:
        out[key] = step()
    except TimedOut as exc:
        progress(f"  {key}: stopped after {exc.seconds:.0f} s")
        out[key + "_timeout"] = exc.seconds


def measure_build(data: Path, cli: Cli, tfd_records: int = 0) -> dict[str, Any]:
    """Cold ``cat``, ``verify``, ``index --no-schema`` and ``index`` of one dataset (seconds), and
    tfd-utils' prebuild of its first shards holding ``tfd_records`` records (0: none)."""
    files = shard_files(data)
    out: dict[str, Any] = {"mb": _files_mb(files), "shards": len(files)}
    cache = WORK / "scale-cache-build"

    def cat() -> float:
        # The best of three: the disk image's cache on the host makes a single sample swing.
        best = float("inf")
        for _ in range(3):
            _drop_caches()
            t0 = time.perf_counter()
            subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True, timeout=cli.timeout)
            best = min(best, time.perf_counter() - t0)
        return best

    def fresh(*args: str) -> Callable[[], float]:
        def step() -> float:
            shutil.rmtree(cache, ignore_errors=True)
            cache.mkdir(parents=True)
            _drop_caches()
            try:
                return cli.run(*args, str(data), "--cache-dir", str(cache), env={"XDG_CACHE_HOME": str(cache)})[0]
            finally:
                shutil.rmtree(cache, ignore_errors=True)
        return step

    progress(f"scale: cat of {data.name}")
    _attempt(out, "cat_s", cat)
    progress(f"scale: verify of {data.name}")
    _attempt(out, "verify_s", fresh("verify"))
    if cli.knows("--no-schema", "index"):
        progress(f"scale: cold index --no-schema of {data.name}")
        _attempt(out, "index_offsets_s", fresh("index", "--no-schema"))
    progress(f"scale: cold index of {data.name}")
    _attempt(out, "index_s", fresh("index"))
    if tfd_records:
        per = max(1, out_count(data) // max(1, len(files)))
        some = files[:max(1, min(len(files), tfd_records // per))]
        progress(f"scale: tfd-utils prebuild of {len(some)} shards of {data.name}")
        _attempt(out, "tfd", lambda: tfd_prebuild(some, "id", cli.timeout))
    return out


def out_count(data: Path) -> int:
    """Records of a dataset made by scaledata (its .complete says)."""
    return int((data / ".complete").read_text().split()[0])


# --- the billion-record tree ------------------------------------------------------------------------

def _scan(folders: list[Path], timeout: float) -> tuple[float, int]:
    """Lists every folder with os.scandir (nothing sorted) in a child process: (seconds, names)."""
    code = "import os, sys\nn = 0\nfor d in sys.argv[1:]:\n    with os.scandir(d) as it:\n" \
           "        for _ in it:\n            n += 1\nprint(n)\n"
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", code, *map(str, folders)], capture_output=True, text=True,
                              timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        raise TimedOut(timeout) from None
    return time.perf_counter() - t0, int(proc.stdout.split()[-1])


def _ls(folder: Path, timeout: float) -> float:
    t0 = time.perf_counter()
    try:
        subprocess.run(["ls", "-f", str(folder)], stdout=subprocess.DEVNULL, check=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TimedOut(timeout) from None
    return time.perf_counter() - t0


class TreeMount:
    """A read-only mount of the tree by one checkout's tfrfs, its daemon found after it answers."""

    def __init__(self, cli: Cli, tree: Path, cache: Path) -> None:
        self.cli, self.tree, self.cache = cli, tree, cache
        self.mnt = WORK / "scale-tree-mnt"
        self.pid: int | None = None

    def mount(self) -> float:
        force_unmount(self.mnt)
        self.mnt.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        try:
            self.cli.run("mount", str(self.tree), str(self.mnt), "--cache-dir", str(self.cache),
                         "--log", str(WORK / "scale-tree.log"), ok=(0,))
        except TimedOut:
            self.kill()
            raise
        os.listdir(self.mnt)
        elapsed = time.perf_counter() - t0
        pids = find_pids(self.mnt, "--daemon")
        self.pid = pids[-1] if pids else None
        return elapsed

    def rss(self) -> float | None:
        return proc_mem(self.pid).get("VmRSS") if self.pid is not None else None

    def kill(self) -> None:
        for pid in find_pids(self.mnt, "--daemon"):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        subprocess.run(["fusermount3", "-uz", str(self.mnt)], capture_output=True)

    def umount(self) -> None:
        try:
            self.cli.run("umount", str(self.mnt), ok=(0,))
        except (TimedOut, RuntimeError) as exc:
            progress(f"  umount failed ({exc}); killing the daemon")
            self.kill()
        deadline = time.monotonic() + 60
        while fstype_at(self.mnt) and time.monotonic() < deadline:
            time.sleep(0.05)


def measure_tree(data: Path, copies: int, cli: Cli) -> dict[str, Any]:
    records = out_count(data)
    shards = shard_files(data)
    per = records // len(shards)
    width = max(6, len(str(per - 1)))
    cache = WORK / "scale-cache-tree"
    tmp_cache = WORK / "scale-cache-beside"

    def index_beside(folder: Path) -> float:
        # Making the tree's data, not a figure of the table: never stopped.
        shutil.rmtree(tmp_cache, ignore_errors=True)
        try:
            return cli.run("index", str(folder), "--beside", "--cache-dir", str(tmp_cache),
                           env={"XDG_CACHE_HOME": str(tmp_cache)}, limit=False)[0]
        finally:
            shutil.rmtree(tmp_cache, ignore_errors=True)

    tree, took = linked_tree(data, copies, index_beside)
    out: dict[str, Any] = {"records": records * copies, "shards": len(shards) * copies, "tree": str(tree)}
    if took is not None:
        out["index_beside_s"] = took
    idx_bytes = sum((tree / "part-00" / (p.name + IDX)).stat().st_size for p in shards)
    out["index_bytes_per_record"] = idx_bytes / records
    manifest = tree / ".tfrfs-manifest"
    if cli.has_module("manifest") and not manifest.exists():
        progress(f"scale: index {tree.name} --beside (the manifest)")
        _attempt(out, "manifest_s", lambda: index_beside(tree))
    if manifest.exists():
        out["manifest_bytes"] = manifest.stat().st_size
    out["manifest"] = manifest.exists() and cli.has_module("manifest")

    m = TreeMount(cli, tree, cache)
    shutil.rmtree(cache, ignore_errors=True)
    _drop_caches()
    progress(f"scale: cold mount of {tree.name} ({out['records']:,} records)")
    _attempt(out, "mount_cold_s", m.mount)
    if "mount_cold_s" not in out:
        shutil.rmtree(cache, ignore_errors=True)
        return out
    try:
        out["rss_mount_mib"] = m.rss()
        touched = set()
        for k in range(100):
            touched.add((k % copies, (k * len(shards)) // 100 + (k % copies) % max(1, len(shards) // 100)))

        def touch() -> float:
            t0 = time.perf_counter()
            for n, (part, s) in enumerate(sorted(touched)):
                os.listdir(tree_path(m.mnt, part, shards[s % len(shards)].name) / f"{(n * 7919) % per:0{width}d}")
            return time.perf_counter() - t0

        progress(f"scale: touch {len(touched)} shards")
        _attempt(out, "touch_100_s", touch)
        out["rss_touched_mib"] = m.rss()
        part, s = next((p, i) for p in range(copies - 1, -1, -1) for i in range(len(shards) - 1, -1, -1)
                       if (p, i) not in touched)
        one = tree_path(m.mnt, part, shards[s].name)
        progress(f"scale: first ls of the untouched shard {part}/{shards[s].name}")
        _attempt(out, "ls_first_s", lambda: _ls(one, cli.timeout))
        _attempt(out, "ls_again_s", lambda: _ls(one, cli.timeout))
        sub = 1 if copies > 1 else 0
        progress(f"scale: list every shard folder of part-{sub:02d} ({per * len(shards):,} names)")

        def scan() -> float:
            took_s, names = _scan([tree_path(m.mnt, sub, p.name) for p in shards], cli.timeout)
            out["scan_names"] = names
            return took_s

        _attempt(out, "scan_copy_s", scan)
        out["rss_scan_mib"] = m.rss()
    finally:
        m.umount()
    progress("scale: warm mount (page cache and tfrfs cache as the cold mount left them)")
    _attempt(out, "mount_warm_s", m.mount)
    if "mount_warm_s" in out:
        out["rss_warm_mib"] = m.rss()
        m.umount()
    shutil.rmtree(cache, ignore_errors=True)
    return out


def tree_path(mnt: Path, part: int, shard: str) -> Path:
    return mnt / f"part-{part:02d}" / shard


def measure_all(args: Any, cli: Cli) -> dict[str, Any]:
    base = Path(args.scale_data) if args.scale_data else OUT
    base.mkdir(parents=True, exist_ok=True)
    tiny = scale_dataset(args.scale_records, args.scale_shards, base) \
        if {"tree", "tiny"} & set(args.scale_parts) or args.scale_edits else base
    text = text_dataset(base, args.scale_text_records, args.scale_text_shards) if "text" in args.scale_parts else base
    out: dict[str, Any] = {"code": cli.name, "loadavg_start": os.getloadavg()}
    parts = args.scale_parts
    # The tree first: its figures are the ones a slow old checkout must not run out of time for.
    if "tree" in parts:
        out["tree"] = measure_tree(tiny, args.scale_copies, cli)
    if "text" in parts:
        out["text"] = measure_build(text, cli)
    if "tiny" in parts:
        out["tiny"] = measure_build(tiny, cli, args.tfd_records)
    if "walks" in parts:
        from .walks import measure_walks
        out["walks"] = measure_walks(args, cli)
    if args.scale_edits:
        out["edits"] = measure_edits(tiny, cli)
    out["loadavg_end"] = os.getloadavg()
    return out


def measure_scale(args: Any) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if args.code is not None:
        res["before"] = measure_all(args, Cli(args.code, args.scale_timeout))
    elif args.scale_before:
        saved = json.loads(Path(args.scale_before).read_text())["scale"]
        res["before"] = saved.get("after") or saved["before"]
    if not args.scale_no_after:
        res["after"] = measure_all(args, Cli(None, args.scale_timeout))
    return res


def _create_ms(path: Path) -> float:
    t0 = time.perf_counter()
    with open(path, "w") as f:
        f.write("[1]\n")
    return (time.perf_counter() - t0) * 1000


def measure_edits(data: Path, cli: Cli) -> dict[str, Any]:
    """The first edits of a key new to the dataset, in a ``--rw`` mount (and ``inspect``)."""
    records, shards = out_count(data), len(shard_files(data))
    code = cli.code
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


def print_edits(r: dict[str, Any]) -> None:
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


# --- the table ---------------------------------------------------------------------------------------

# (value, text): text is None for a measured figure; for a step that was stopped, the value is a
# bound and the text says which ("> 600 s" of a time, "< 8.3" of a rate).
Figure = tuple[float | None, str | None]


def _get(r: dict[str, Any], *path: str) -> Any:
    for p in path:
        if not isinstance(r, dict) or p not in r:
            return None
        r = r[p]
    return r




def _rate(r: dict[str, Any], ds: str, key: str) -> Figure:
    s, mb = _get(r, ds, key), _get(r, ds, "mb")
    if key == "tfd" and s is not None:
        s, mb = s["s"], s["mb"]
    if s is not None and mb is not None:
        return mb / s, None
    t = _get(r, ds, key + "_timeout")
    return (None, None) if t is None or mb is None else (mb / t, f"< {mb / t:.1f}")


def _plain(r: dict[str, Any], *path: str, scale: float = 1.0) -> Figure:
    v = _get(r, *path)
    if v is not None:
        return v * scale, None
    t = _get(r, *path[:-1], path[-1] + "_timeout")
    return (None, None) if t is None else (t * scale, f"> {t:.0f} s")


def _all(*checks: bool | None) -> bool | None:
    """Missed if any check is missed; met if every one is met; else unknown."""
    if False in checks:
        return False
    return None if None in checks else True


def _rows(r: dict[str, Any]) -> list[tuple[str, str, Figure, str, bool | None]]:
    """(metric, unit, figure, goal, met) of one run."""
    rows: list[tuple[str, str, Figure, str, bool | None]] = []

    def ge(a: Figure, b: Figure, share: float = 1.0) -> bool | None:
        if a[0] is None or b[0] is None:
            return None
        holds = a[0] >= share * b[0]
        # A stopped step's rate is an upper bound: it decides only what the bound decides.
        if (a[1] is not None and holds) or (b[1] is not None and not holds):
            return None
        return holds

    for ds, what in (("tiny", "50-byte records"), ("text", "2 KB records")):
        cat, verify = _rate(r, ds, "cat_s"), _rate(r, ds, "verify_s")
        offsets, index = _rate(r, ds, "index_offsets_s"), _rate(r, ds, "index_s")
        rows += [(f"{what}: cat of the shards, cold", "MB/s", cat, "", None),
                 (f"{what}: verify, cold", "MB/s", verify, "", None),
                 (f"{what}: index --no-schema, cold", "MB/s", offsets, "", None)]
        if ds == "tiny":
            tfd = _rate(r, ds, "tfd")
            shards = _get(r, ds, "tfd", "shards")
            rows.append((f"{what}: tfd-utils prebuild, cold" + (f" ({shards} shards)" if shards else ""),
                         "MB/s", tfd, "", None))
            rows[-3] = rows[-3][:3] + (">= 50% of cat", ge(verify, cat, 0.5))
            met = _all(ge(index, verify), ge(index, tfd), ge(index, cat, 0.5))
            rows.append((f"{what}: index, cold", "MB/s", index, ">= verify, tfd-utils, 50% of cat", met))
        else:
            met = _all(ge(index, verify), ge(index, cat, 0.8))
            rows.append((f"{what}: index, cold", "MB/s", index, ">= verify, 80% of cat", met))
    t = r.get("tree", {})
    n = t.get("records")
    tree = "tree"

    def le(f: Figure, limit: float) -> bool | None:
        # A stopped step's time is a lower bound: past the limit, the goal is missed.
        return None if f[0] is None or (f[1] is not None and f[0] <= limit) else f[0] <= limit

    bpr = _plain(t, "index_bytes_per_record")
    rows.append(("index per record (shipped files)", "B", bpr, "<= 4.5", le(bpr, 4.5)))
    rows.append(("manifest (.tfrfs-manifest)", "MB", _plain(t, "manifest_bytes", scale=1e-6), "", None))
    for key, label in (("mount_cold_s", "mount, cold (caches empty)"), ("mount_warm_s", "mount, warm (remount)")):
        f = _plain(t, key)
        rows.append((f"{tree}: {label}", "s", f, "<= 2", le(f, 2.0)))
    for key, label, limit in (("rss_mount_mib", "RSS after mount", 200.0),
                              ("rss_touched_mib", "RSS after touching 100 shards", 300.0),
                              ("rss_scan_mib", "RSS after listing 1,000 shards", None),
                              ("rss_warm_mib", "RSS after the warm mount", 200.0)):
        f = _plain(t, key)
        rows.append((f"{tree}: {label}", "MiB", f, f"<= {limit:.0f}" if limit else "",
                     le(f, limit) if limit else None))
    rows.append((f"{tree}: touching 100 shards (one record each)", "s", _plain(t, "touch_100_s"), "", None))
    first, again = _plain(t, "ls_first_s", scale=1000), _plain(t, "ls_again_s")
    rows.append((f"{tree}: first ls of an untouched shard", "ms", first, "<= 50 + listing",
                 None if first[0] is None or again[0] is None or first[1] or again[1]
                 else first[0] - 1000 * again[0] <= 50))
    rows.append((f"{tree}: ls of it again ({(n or 0) // max(1, t.get('shards', 1)):,} records)", "s", again,
                 "<= 0.3", le(again, 0.3)))
    names = t.get("scan_names")
    rows.append((f"{tree}: list every shard of one copy" + (f" ({names:,} names)" if names else ""), "s",
                 _plain(t, "scan_copy_s"), "", None))
    from .walks import rows as walk_rows
    return rows + walk_rows(r.get("walks"))


def _cell(f: Figure) -> str:
    from .report import fmt
    return f[1] if f[1] is not None else fmt(f[0])


def print_scale(res: dict[str, Any]) -> None:
    from .report import print_columns
    before, after = res.get("before"), res.get("after")
    runs = [r for r in (before, after) if r is not None]
    cols = ["before" if r is before else "after" for r in runs]
    per_run = [_rows(r) for r in runs]
    head = ["metric", "unit", *cols, "goal", "met"]
    body = []
    for i, (label, unit, _f, goal, _m) in enumerate(per_run[-1]):
        if all(rows[i][2][0] is None for rows in per_run):
            continue   # a part not measured (--scale-parts)
        met = per_run[-1][i][4]
        body.append([label, unit, *(_cell(rows[i][2]) for rows in per_run), goal,
                     "" if not goal else "n/a" if met is None else "yes" if met else "NO"])
    if len(runs) == 1:   # print_columns right-aligns the columns 2..4
        head.insert(3, "")
        for row in body:
            row.insert(3, "")
    last = runs[-1]
    sizes = []
    if _get(last, "tree", "records"):
        sizes.append(f"{_get(last, 'tree', 'records'):,} records in the tree ({_get(last, 'tree', 'shards'):,} shards)")
    if _get(last, "tiny", "mb"):
        sizes.append(f"50-byte dataset {_get(last, 'tiny', 'mb'):,.0f} MB")
    if _get(last, "text", "mb"):
        sizes.append(f"2 KB dataset {_get(last, 'text', 'mb'):,.0f} MB")
    if _get(last, "walks", "mb"):
        sizes.append(f"walks: {_get(last, 'walks', 'mb'):,.0f} MB of tiny records, a {_get(last, 'walks', 'repair_mb'):,.0f} MB "
                     "damaged shard")
    print("\nscale: " + "; ".join(sizes + [f"{c}: tfrfs of {r['code']}" for c, r in zip(cols, runs)]))
    print_columns(head, body)
    for c, r in zip(cols, runs):
        loads = {f"{part} {k}": v for part in ("tiny", "text", "tree") for k, v in r.get(part, {}).get("load", {}).items()}
        print(f"{c}: load average (1 min) at the start of each step: "
              + ", ".join(f"{k} {v:.2f}" for k, v in loads.items())
              + ("" if r.get("tree", {}).get("manifest", True) else "; mounted without a manifest"))
        if "index_beside_s" in r.get("tree", {}):
            print(f"{c}: tfrfs index --beside of one copy (made for the tree) took {r['tree']['index_beside_s']:.0f} s")
        if "manifest_s" in r.get("tree", {}):
            print(f"{c}: tfrfs index --beside of the tree (the manifest) took {r['tree']['manifest_s']:.1f} s")
        if "edits" in r:
            print_edits(r["edits"])
