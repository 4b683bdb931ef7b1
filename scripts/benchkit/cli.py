"""The command line: parse_args (the flags and their defaults, --quick and --remote among them)
and main, which runs the read side (read_phases: datasets, mounts, the scheduled runs, the
tables) and then the write-back side, or with --remote the remote mode alone (remote.py), and
writes --json."""

from __future__ import annotations

import argparse
import importlib
import json
import os
from pathlib import Path
from typing import Any

from tfrfs.fuse.mounttab import fstype_holding

from .common import OUT, REPO, WORK, progress
from .datasets import build_dataset, derived_paths, file_lists, make_tar
from .report import (REF, check_entries, compare, fmt_load, machine_info, print_ceiling, print_read_notes,
                     print_table)
from .remote import remote_phases
from .schedule import measure_reads, summarize, unmount_all
from .tools import PlainFiles, Profiler, Ratarmount, Tfrfs, Tool
from .workloads import ReadInputs
from .writeback import measure_writeback, print_writeback

ABOUT = """Benchmark tfrfs against ratarmount serving the same files from a tar.

Builds (and caches in bench-out/) an Object-Detection-style dataset: N small
records (~5 KB JPEGs) in several shards plus M records of ~2 MB PNG images in
their own shards. Mounts it with tfrfs, makes a tar of the mounted tree (so
both tools serve identical files) and measures:

  index build (first mount, empty cache), remount (index cached),
  `find | wc -l` and `ls -lR` over the small part, reading every small file,
  reading the large files, random record access latency, daemon peak memory.

Every measured run is on a fresh mount (unmount + mount) after
`sync; echo 3 > /proc/sys/vm/drop_caches` (when root). The same reader code
(os.open / os.read(1 MiB) until EOF / os.close) is used for both tools. The
machine's speed drifts over minutes, so the tools are measured interleaved:
each phase runs --repeat times (3; --quick 1) as pairs of back-to-back runs,
one per tool, the tool that goes first alternating from pair to pair (ABBA).
Reading the large files takes about a second, and its samples swing most (by 2x
from run to run for either tool: the disk image's cache on the host), so that
phase runs three times as many pairs.
That phase also reads the same ~2 MB files as plain files on the local disk
(copied there once, no FUSE), in turn with the two tools: what the kernel's own
file system does with the same reader and cold caches, the ceiling against
which both tools' figures can be read.
The table shows each tool's median (peak memory: the highest of any run);
every sample is printed below it.

Then the write-back side (--rw mounts; --no-write skips it, --only-write runs it alone):

  writing a new 100 MiB feature file through the mount in 1 MiB writes (MiB/s from open to
  close returning; close is where tfrfs checks and durably stages it), and `tfrfs commit` of a
  1 GiB dataset (4 shards) with one changed label (MiB/s of the rewritten shard) against cp +
  sync of the same shard file, with the daemon's peak memory in each.

--remote runs the read side against S3 instead: moto's S3 server on loopback
behind a proxy that adds --latency-ms (20) to every request and counts them,
both running in this process. The bucket gets the shards (once bare, once with
the index files of `tfrfs index --beside` next to them) and the same tar, which
ratarmount mounts as s3://... (with s3fs, installed into its venv); a plain
s3fs copy of one large shard is the ceiling. One table: mount time without and
with a shipped index (empty caches), `ls -lR`, reading every small file by
walking the tree, the ~2 MB files, random record latency, requests and bytes
per random record, a second pass on the same mount and after a remount
(requests and files/s), and a cold copy of a large shard against the s3fs copy.
Its dataset is smaller by default (--small 5000, --large 150) and --random is
200; --repeat is 1 unless given.

--large-values measures large values instead: a 100 MiB and a 1 GiB value (--large-mib) written
over a feature file of a --rw mount, the daemon's peak memory above its baseline during the close
and the commit, in copies of the value, and their times (scripts/benchkit/largevalues.py).

--limit measures tfrfs against the limit instead: the same files as plain files on the same
disk, cold and warm (scripts/benchkit/limit.py).

--damage measures damaged shards instead (SPEC 6): the resync scan's speed over garbage, zeros
and real record data with broken headers, and `tfrfs index`, `verify` and `repair` on such shards
against a sound one (scripts/benchkit/damage.py).

--loader measures training input instead: records/s of PyTorch DataLoaders over the mount, over
a plain copy of its files and over tfrfs.open (no FUSE), beside TensorFlow's tf.data and the
tfrecord package, on a dataset TensorFlow writes, cold and warm (scripts/benchkit/loader.py).

ratarmount is installed into its own venv, bench-out/ratarmount-venv, on first use.
Progress goes to stderr; the tables to stdout; --json FILE writes all numbers.
"""

# The modes that measure one thing instead of the read and write sides: flag -> its module
MODES = {"cluster": "cluster", "scale": "scale", "limit": "limit", "loader": "loader", "damage": "damage",
         "large_values": "largevalues", "no_mount": "nomount"}

# --remote's defaults: a run of about six minutes on two cores
REMOTE_SMALL, REMOTE_LARGE, REMOTE_RANDOM = 5000, 150, 200


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/bench", description=ABOUT,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", type=int, default=None,
                   help=f"small records (default 20000, --quick 2000, --remote {REMOTE_SMALL})")
    p.add_argument("--large", type=int, default=None,
                   help=f"~2 MB records, 100 to a shard (default 200, --quick 20, --remote {REMOTE_LARGE})")
    p.add_argument("--shards", type=int, default=8, help="shards of the small part (default 8)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 2000 small, 20 large records")
    p.add_argument("--random", type=int, default=None,
                   help=f"records for the random-access phase (default 500, --remote {REMOTE_RANDOM})")
    p.add_argument("--seed", type=int, default=1, help="seed for the random-access sample")
    p.add_argument("--repeat", type=int, default=None, metavar="N",
                   help="runs of each read phase per tool, interleaved with the other tool's; the table "
                        "shows medians (default 3, --quick or --remote 1)")
    p.add_argument("--no-ratarmount", action="store_true", help="measure tfrfs only (ratios vs reference figures)")
    p.add_argument("--ratarmount-fuse", default="", metavar="OPTS",
                   help="extra FUSE options for ratarmount's -o (default: none, its defaults)")
    p.add_argument("--rebuild", action="store_true", help="rebuild the dataset (and its tar)")
    p.add_argument("--json", metavar="FILE", help="write every number as JSON")
    p.add_argument("--keep", action="store_true", help="leave the last mounts in place")
    p.add_argument("--profile", action="store_true",
                   help="attach py-spy (installed into bench-out/tools-venv) to the tfrfs daemon in every "
                        "phase; raw stacks and summaries go to bench-out/profile/ (timings then suffer)")
    p.add_argument("--no-write", action="store_true", help="skip the write-back phases (write, commit)")
    p.add_argument("--only-write", action="store_true",
                   help="run only the write-back phases (no read phases, no ratarmount)")
    p.add_argument("--write-mib", type=int, default=None,
                   help="size of the feature file written through the mount (default 100, --quick 20)")
    p.add_argument("--commit-mib", type=int, default=None,
                   help="size of the commit dataset (default 1024, --quick 100)")
    p.add_argument("--commit-shards", type=int, default=4, help="shards of the commit dataset (default 4)")
    p.add_argument("--stall-mib", type=int, default=None,
                   help="size of the one shard committed while the stall probe reads and lists the mount "
                        "(default 600, --quick 100)")
    p.add_argument("--only-stall", action="store_true",
                   help="run only the stall probe of the write-back phases (implies --only-write)")
    p.add_argument("--remote", action="store_true",
                   help="read the dataset from a loopback S3 server with injected latency instead (see above)")
    p.add_argument("--only-commit", action="store_true",
                   help="with --remote: only the commit figures of a --rw mount of the bucket (one record in a "
                        "100 MB shard; one in each of ten shards) against s3fs put of the same new shards")
    p.add_argument("--limit", action="store_true",
                   help="measure tfrfs against the same files as plain files on the same disk instead: find, "
                        "ls -lR, small files with 1 and 4 readers, large files, random reads, cold and warm "
                        "(see scripts/benchkit/limit.py)")
    p.add_argument("--no-mount", action="store_true",
                   help="measure the ways without a mount instead: tfrfs:// (fsspec) against the mount and "
                        "ratarmount's ratar:// on the same small files, and tfrfs pack against cp -r (see "
                        "scripts/benchkit/nomount.py)")
    p.add_argument("--damage", action="store_true",
                   help="measure damaged shards instead: the resync scan, index, verify and repair (see "
                        "scripts/benchkit/damage.py)")
    p.add_argument("--damage-mib", type=int, default=256, metavar="MIB",
                   help="with --damage: MiB of damage in each damaged shard (default 256)")
    p.add_argument("--scale", action="store_true",
                   help="measure datasets at scale instead: index building against cat, verify and tfd-utils, "
                        "and a billion-record tree of hard links mounted (see scripts/benchkit/scale.py)")
    p.add_argument("--scale-records", type=int, default=100_000_000, metavar="N",
                   help="with --scale: 50-byte records in the dataset (default 100,000,000)")
    p.add_argument("--scale-shards", type=int, default=1000, metavar="N",
                   help="with --scale: shards of that dataset (default 1,000)")
    p.add_argument("--scale-copies", type=int, default=10, metavar="N",
                   help="with --scale: copies of that dataset in the tree of hard links (default 10)")
    p.add_argument("--scale-text-records", type=int, default=1_000_000, metavar="N",
                   help="with --scale: 2 KB records of the C4-like dataset (default 1,000,000: about 2 GB)")
    p.add_argument("--scale-text-shards", type=int, default=16, metavar="N",
                   help="with --scale: shards of the C4-like dataset (default 16)")
    p.add_argument("--tfd-records", type=int, default=5_000_000, metavar="N",
                   help="with --scale: records tfd-utils' prebuild indexes (the first shards holding them; "
                        "default 5,000,000: it keeps about 300 bytes a record in memory; 0: skip it)")
    p.add_argument("--scale-data", type=Path, metavar="DIR",
                   help="with --scale: where the datasets are made and kept (default bench-out/)")
    p.add_argument("--scale-timeout", type=float, default=900.0, metavar="S",
                   help="with --scale: stop a step after S seconds and show it as '> S s' (default 900)")
    p.add_argument("--scale-before", type=Path, metavar="FILE",
                   help="with --scale: the 'before' column from the --json FILE of an earlier --scale run")
    p.add_argument("--scale-no-after", action="store_true",
                   help="with --scale --code DIR: measure DIR only (no run of this checkout)")
    p.add_argument("--scale-parts", type=lambda v: v.split(","), default=["tree", "text", "tiny", "walks"],
                   metavar="PART,...",
                   help="with --scale: which parts to measure, of tree (the billion-record mount), text (2 KB "
                        "records: cat, verify, index), tiny (the 50-byte records: the same), walks (10 M tiny "
                        "records: index against verify, reshard against cp -r; repair of a damaged 1 GiB shard "
                        "against cat: see scripts/benchkit/walks.py); default all")
    p.add_argument("--scale-repeat", type=int, default=2, metavar="N",
                   help="with --scale: runs of each walks step, the best shown (default 2)")
    p.add_argument("--scale-edits", action="store_true",
                   help="with --scale: also the first edits of a key new to the dataset in a --rw mount, and inspect")
    p.add_argument("--code", type=Path, metavar="DIR",
                   help="with --scale: also measure the tfrfs of another checkout DIR (e.g. an older commit), "
                        "shown as the 'before' column")
    p.add_argument("--cluster", action="store_true",
                   help="measure the shard jobs instead: index, verify and reshard 100 -> 1,000 shards in one "
                        "process, the local pool, Ray on this machine and on two simulated nodes, beside a "
                        "TensorFlow script and cp; and tfrfs.ray.read against ray.data.read_tfrecords "
                        "(see scripts/benchkit/cluster.py)")
    p.add_argument("--cluster-records", type=int, default=10_000_000, metavar="N",
                   help="with --cluster: records of its dataset (default 10,000,000; made as --scale makes them)")
    p.add_argument("--cluster-shards", type=int, default=100, metavar="N",
                   help="with --cluster: shards of its dataset (default 100)")
    p.add_argument("--cluster-text", action="store_true",
                   help="with --cluster: 2 KB C4-like records instead of 50-byte ones")
    p.add_argument("--cluster-no-raydata", action="store_true", help="with --cluster: skip the Ray Data read")
    p.add_argument("--large-values", action="store_true",
                   help="measure large values written through a --rw mount instead (see above)")
    p.add_argument("--large-mib", default="100,1024", metavar="MIB,...",
                   help="with --large-values: the values' sizes in MiB (default 100,1024)")
    p.add_argument("--loader", action="store_true",
                   help="measure training input instead: DataLoaders over the mount, plain files and tfrfs.open, "
                        "TensorFlow, the tfrecord package (see scripts/benchkit/loader.py)")
    p.add_argument("--loader-records", type=int, default=None, metavar="N",
                   help="with --loader: records of its dataset (default 20,000, --quick 2,000)")
    p.add_argument("--loader-shards", type=int, default=8, metavar="N",
                   help="with --loader: shards of its dataset (default 8)")
    p.add_argument("--loader-workers", default="0,2,4", metavar="N,...",
                   help="with --loader: DataLoader num_workers to measure (default 0,2,4)")
    p.add_argument("--loader-batch", type=int, default=64, metavar="N", help="with --loader: batch size (default 64)")
    p.add_argument("--latency-ms", type=float, default=20.0, metavar="MS",
                   help="with --remote: latency the proxy adds to every request (default 20)")
    a = p.parse_args(argv)
    if a.small is None:
        a.small = REMOTE_SMALL if a.remote else 2000 if a.quick else 20000
    if a.large is None:
        a.large = REMOTE_LARGE if a.remote else 20 if a.quick else 200
    if a.random is None:
        a.random = REMOTE_RANDOM if a.remote else 500
    if a.write_mib is None:
        a.write_mib = 20 if a.quick else 100
    if a.stall_mib is None:
        a.stall_mib = 100 if a.quick else 600
    if a.only_stall:
        a.only_write = True
    if a.commit_mib is None:
        a.commit_mib = 100 if a.quick else 1024
    if a.repeat is None:
        a.repeat = 1 if a.quick or a.remote else 3
    if a.repeat < 1:
        p.error("--repeat must be at least 1")
    if a.small < 1 or a.large < 1 or a.shards < 1:
        p.error("--small, --large and --shards must be at least 1")
    if a.write_mib < 1 or a.commit_mib < 1 or a.commit_shards < 1:
        p.error("--write-mib, --commit-mib and --commit-shards must be at least 1")
    if min(a.scale_records, a.scale_shards, a.scale_copies, a.scale_text_records, a.scale_text_shards) < 1 \
            or a.tfd_records < 0 or a.scale_timeout <= 0:
        p.error("--scale-* sizes must be at least 1, --tfd-records not negative and --scale-timeout positive")
    if not set(a.scale_parts) <= {"tree", "text", "tiny", "walks"} or a.scale_repeat < 1:
        p.error("--scale-parts: a list of tree, text, tiny, walks; --scale-repeat at least 1")
    if a.scale_no_after and a.code is None:
        p.error("--scale-no-after measures --code DIR only: give --code DIR")
    if a.code is not None and a.scale_before is not None:
        p.error("--code DIR and --scale-before FILE both give the 'before' column: give one")
    if a.no_write and a.only_write:
        p.error("--no-write and --only-write exclude each other")
    if a.remote and (a.only_write or a.keep):
        p.error("--remote measures the read side only, and its mounts end with its servers (no --only-write, "
                "no --keep)")
    try:
        a.large_mib = [int(x) for x in a.large_mib.split(",")]
    except ValueError:
        p.error("--large-mib takes sizes in MiB separated by commas, e.g. 100,1024")
    if not a.large_mib or min(a.large_mib) < 1:
        p.error("--large-mib sizes must be at least 1")
    if a.loader_records is None:
        a.loader_records = 2000 if a.quick else 20000
    try:
        a.loader_workers = sorted({int(x) for x in a.loader_workers.split(",")})
    except ValueError:
        p.error("--loader-workers takes worker counts separated by commas, e.g. 0,2,4")
    if a.loader_records < 1 or a.loader_shards < 1 or a.loader_batch < 1 or not a.loader_workers \
            or min(a.loader_workers) < 0:
        p.error("--loader-records, --loader-shards and --loader-batch must be at least 1, --loader-workers not negative")
    if a.random < 1 or a.latency_ms < 0:
        p.error("--random must be at least 1 and --latency-ms not negative")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        progress("warning: not root; page caches are not dropped between phases")
    OUT.mkdir(exist_ok=True)
    WORK.mkdir(exist_ok=True)
    import hashlib
    src_sha = hashlib.sha256(b"".join(p.read_bytes() for p in sorted((REPO / "tfrfs").glob("*.py"))))
    machine = machine_info()
    results: dict[str, Any] = {"tools": {}, "tfrfs_sources_sha256": src_sha.hexdigest()[:16],
                               "loadavg_start": os.getloadavg(), "cpus": machine["cpus"], "machine": machine,
                               "profiled": bool(args.profile), "reference": REF}
    usable = "" if machine["cpus_usable"] == machine["cpus"] else f" ({machine['cpus_usable']} usable)"
    print(f"machine: {machine['kernel']}, {machine['cpus']} CPUs{usable} {machine['cpu_model']}; load average "
          f"{fmt_load(results['loadavg_start'])} (1, 5, 15 min) at start", flush=True)
    if results["loadavg_start"][0] > 0.5:
        progress(f"warning: load average {results['loadavg_start'][0]:.2f} before starting; other work on this "
                 f"machine skews the numbers")
    profiler = Profiler(OUT / "profile") if args.profile else None
    mode = next((m for m in MODES if getattr(args, m)), None)
    if mode is not None:
        # A mode of its own: its module's measure_MODE(args) and print_MODE(result)
        module = importlib.import_module(f".{MODES[mode]}", __package__)
        results[mode] = getattr(module, f"measure_{mode}")(args)
        getattr(module, f"print_{mode}")(results[mode])
    elif args.remote:
        remote_phases(args, results, profiler)
    else:
        if not args.only_write:
            read_phases(args, results, profiler)
        if not args.no_write:
            results["writeback"] = measure_writeback(args, profiler)
            print_writeback(results["writeback"])
    results["loadavg_end"] = os.getloadavg()
    wb_load = ""
    if results["tools"] and "writeback" in results:
        wb_load = f", {results['writeback']['loadavg_start'][0]:.2f} when the write-back phases started"
    print(f"load average {fmt_load(results['loadavg_start'])} at start{wb_load}, {fmt_load(results['loadavg_end'])} "
          f"at end (1, 5, 15 min; {results['cpus']} CPUs)"
          + ("; PROFILED run: timings include py-spy's overhead" if args.profile else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
        progress(f"wrote {args.json}")
    return 0


def read_phases(args: argparse.Namespace, results: dict[str, Any], profiler: Profiler | None) -> None:
    """The read side, tfrfs against ratarmount: measures, then prints the main table."""
    rat_version = None
    if not args.no_ratarmount:
        rat_version = Ratarmount.ensure_installed()
    src, meta = build_dataset(args.small, args.large, args.shards, args.rebuild)
    tar, list_path = derived_paths(meta, args.rebuild)

    tf = Tfrfs(WORK / "mnt-tfrfs", src, WORK / "tfrfs-cache")
    rat = Ratarmount(WORK / "mnt-ratarmount", tar, WORK / "ratarmount.index.sqlite", args.ratarmount_fuse)
    tools: list[Tool] = [tf] if args.no_ratarmount else [tf, rat]
    plain = PlainFiles(WORK / f"plain-{meta['name']}")
    results.update({"dataset": meta, "ratarmount_version": rat_version, "ratarmount_fuse": args.ratarmount_fuse,
                    "repeat": args.repeat})
    inp = ReadInputs({}, meta, args)

    def prepare() -> None:
        inp.lists.update(file_lists(tf.mnt, meta, list_path))
        if not args.no_ratarmount and not tar.exists():
            results["tar_from_tfrfs_s"] = make_tar(tf.mnt, tar)
        plain.fill(tf.mnt, inp.lists["large_files"])

    try:
        runs, results["read_runs"] = measure_reads(tools, inp, profiler, {tf.name: prepare}, plain)
    finally:
        if not args.keep:
            unmount_all(tools)
        else:
            progress("kept mounts: " + ", ".join(str(tool.mnt) for tool in tools))
    for tool in tools:
        results["tools"][tool.name] = summarize(tool, runs[tool.name])
    check_entries(results["tools"])

    ceiling = summarize(plain, runs[plain.name])
    results["ceiling"] = {"what": "the ~2 MB files as plain files, no FUSE", "fs": fstype_holding(plain.mnt),
                          "large_mib_per_s": ceiling["large_mib_per_s"],
                          "samples": ceiling["samples"]["large_mib_per_s"]}
    rows = compare(results["tools"]["tfrfs"], results["tools"].get("ratarmount"), meta)
    results["table"] = rows
    print_table(rows, meta)
    print_ceiling(results)
    print_read_notes(results, args.repeat)
