"""The read side's tables: the main table (each figure's median per tool and the ratio, against
ratarmount or, with --no-ratarmount, against reference figures), the ceiling line of the plain
files, and the notes below it (every sample, daemon CPU, load, peak memory by phase); the machine
line, and the number format the write-back table shares."""

from __future__ import annotations

import os
from typing import Any

from .common import progress
from .workloads import INDEX, READ_PHASES

# Reference figures for ratarmount on the machine (used when --no-ratarmount).
# ("ls -lR of 20,000 files in ~4 s": scaled by the number of small files listed.)
REF = {"small_files_per_s": 3000.0, "large_mib_per_s": 370.0, "ls_lR_s_per_20k_files": 4.0}
TARGET_RATIO = 2.0

# key, label, unit, higher is better, target
ROWS = [
    ("index_s", "index build (first mount)", "s", False, False),
    ("index_records_per_s", "index build rate", "records/s", True, False),
    ("remount_s", "remount, index cached (median)", "s", False, False),
    ("find_s", "find small | wc -l", "s", False, False),
    ("ls_lR_s", "ls -lR small > /dev/null", "s", False, True),
    ("small_files_per_s", "read every small file (from a list)", "files/s", True, True),
    ("walk_files_per_s", "read every small file (walking the tree)", "files/s", True, True),
    ("large_mib_per_s", "read the ~2 MB files", "MiB/s", True, True),
    ("random_median_ms", "random record, median", "ms", False, False),
    ("random_p95_ms", "random record, p95", "ms", False, False),
    ("peak_mib", "daemon peak memory (VmHWM)", "MiB", False, False),
]


def fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def compare(tf: dict[str, Any], rat: dict[str, Any] | None, meta: dict[str, Any]) -> list[dict[str, Any]]:
    ref = {"small_files_per_s": REF["small_files_per_s"], "walk_files_per_s": REF["small_files_per_s"],
           "large_mib_per_s": REF["large_mib_per_s"],
           "ls_lR_s": REF["ls_lR_s_per_20k_files"] * tf.get("small_files", 20000) / 20000}
    rows = []
    for key, label, unit, higher, target in ROWS:
        a = tf.get(key)
        b = rat.get(key) if rat else None
        against = "ratarmount"
        if b is None and key in ref:
            b, against = ref[key], "reference"
        ratio = None
        if a is not None and b is not None and a > 0 and b > 0:
            ratio = a / b if higher else b / a
        met = None
        if target and ratio is not None:
            met = ratio >= TARGET_RATIO
        rows.append({"metric": key, "label": label, "unit": unit, "tfrfs": a, "ratarmount": b,
                     "against": against, "ratio": ratio, "target": f">= {TARGET_RATIO:g}x" if target else None,
                     "target_met": met})
    return rows


def target_cell(row: dict[str, Any]) -> str:
    """The "target met" column: empty without a target, else yes, NO or n/a and the target."""
    if row["target"] is None:
        return ""
    met = "n/a" if row["target_met"] is None else "yes" if row["target_met"] else "NO"
    return f"{met} ({row['target']})"


def print_columns(head: list[str], body: list[list[str]]) -> None:
    """Rows under a ruled header: the first two columns (label, unit) to the left, the figures
    to the right, the last column (target) as it is."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    for i, row in enumerate([head] + body):
        print("  ".join(str(c).ljust(w) if j < 2 else str(c).rjust(w) if j < 5 else str(c)
                        for j, (c, w) in enumerate(zip(row, widths))).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def print_table(rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    head = ["metric", "unit", "tfrfs", "ratarmount", "ratio", "target met"]
    body = []
    for r in rows:
        rat = fmt(r["ratarmount"]) + (" (ref)" if r["against"] == "reference" and r["ratarmount"] is not None else "")
        body.append([r["label"], r["unit"], fmt(r["tfrfs"]), rat,
                     "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}x", target_cell(r)])
    print(f"dataset {meta['name']}: {meta['small']:,} small records in {meta['shards']} shards + "
          f"{meta['large']} large records, {meta['bytes'] / 2**20:.0f} MiB "
          f"(ratio: >1 means tfrfs is better)")
    print_columns(head, body)


def print_ceiling(results: dict[str, Any]) -> None:
    """The large files' figures as shares of what the kernel's own file system does."""
    c = results["ceiling"]
    top = c["large_mib_per_s"]
    shares = [f"{name} {r['large_mib_per_s'] / top:.0%} of it" for name, r in results["tools"].items()]
    if "ratarmount" in results["tools"]:
        shares.append(f"twice ratarmount would be {2 * results['tools']['ratarmount']['large_mib_per_s'] / top:.0%}")
    print(f"ceiling for the ~2 MB files: the same files as plain files on the local disk ({c['fs']}, no FUSE), "
          f"same reader, caches dropped: {fmt(top)} MiB/s (median; samples {' '.join(fmt(v) for v in c['samples'])}); "
          + ", ".join(shares))


def check_entries(tools: dict[str, dict[str, Any]]) -> None:
    """Every find, of either tool, must have seen the same tree."""
    seen = {name: sorted(set(r["samples"]["find_entries"])) for name, r in tools.items()}
    if len({n for counts in seen.values() for n in counts}) > 1:
        progress(f"warning: find saw different numbers of entries: {seen}")


def samples_of(r: dict[str, Any], phase: str, key: str, mark: bool) -> str:
    """The samples of one figure (measured in ``phase``) in repetition order; with ``mark``, '*'
    on those that ran first of their pair."""
    firsts = r["first_in_pair"].get(phase, [])
    return " ".join(fmt(v) + ("*" if mark and f else "") for v, f in zip(r["samples"].get(key, []), firsts))


def print_read_notes(results: dict[str, Any], repeat: int) -> None:
    tools = results["tools"]
    labels = {key: f"{label} ({unit})" for key, label, unit, _h, _t in ROWS}
    two = len(tools) > 1
    more = "".join(f" ({repeat * p.times} for {p.name})" for p in READ_PHASES if p.times > 1)
    print(f"each figure: the median of {repeat} run(s) per tool{more}, each on a fresh mount after dropping caches"
          + ("; the two tools run back to back per phase, alternating which goes first (ABBA); "
             "ratio = median / median" if two else "")
          + "; daemon peak memory: the highest VmHWM of any run")
    print("samples in repetition order" + (" (* ran first of its pair):" if two else ":"))
    for phase in [INDEX] + READ_PHASES:
        for key in phase.shown:
            print(f"  {labels[key]}: " + " | ".join(f"{name} {samples_of(r, phase.name, key, two)}" for name, r in tools.items()))
    for phase in READ_PHASES:
        print(f"  daemon CPU (s), {phase.name}: "
              + " | ".join(f"{name} " + " ".join(f"{v:.2f}" for v in r["daemon_cpu_samples_s"].get(phase.name, []))
                           for name, r in tools.items()))
    loads = [run["loadavg_1min"] for run in results["read_runs"]]
    print(f"  load average (1 min) at the start of the runs: {min(loads):.2f} .. {max(loads):.2f}")
    for name, r in tools.items():
        print(f"{name}: peak memory in phase '{r['peak_phase']}' (VmHWM MiB, highest per phase: "
              + ", ".join(f"{p} {v:.0f}" for p, v in r["peak_mib_by_phase"].items())
              + f"); find saw {int(r['find_entries']):,} entries; remount samples "
              + ", ".join(f"{s:.2f}" for s in r["remount_samples_s"]) + " s; daemon CPU s (median): "
              + ", ".join(f"{k} {v:.2f}" for k, v in r["daemon_cpu_s"].items()))


def machine_info() -> dict[str, Any]:
    """What the figures depend on besides tfrfs: kernel, CPUs, and how busy the machine is."""
    u = os.uname()
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    return {"kernel": f"{u.sysname} {u.release} {u.machine}", "cpus": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)), "cpu_model": model}


def fmt_load(load: tuple[float, float, float] | list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in load)
