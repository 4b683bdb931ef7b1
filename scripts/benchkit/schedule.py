"""The run order of the read phases: every measured run on a fresh mount after dropping the page
cache, each phase repeated --repeat times as pairs of back-to-back runs, one per tool, the tool
that goes first alternating from pair to pair (ABBA); what the runs measured, per tool, and its
summary (medians, every sample, peak memory)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tfrfs.fuse.mounttab import fstype_at

from .common import progress
from .tools import PlainFiles, Profiler, Tfrfs, Tool, force_unmount, proc_cpu
from .workloads import INDEX, READ_PHASES, Phase, ReadInputs, Sample


def drop_caches() -> None:
    os.sync()
    if os.geteuid() == 0:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        except OSError as exc:
            progress(f"warning: cannot drop caches: {exc}")


@dataclass
class ToolRuns:
    """Every run of one tool in the read phases, per phase in repetition order."""
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    first: dict[str, list[bool]] = field(default_factory=dict)     # ran first of its pair
    cpu_s: dict[str, list[float]] = field(default_factory=dict)
    remount_s: list[float] = field(default_factory=list)

    def add(self, phase: str, sample: Sample, first: bool, cpu_s: float | None = None) -> None:
        self.samples.setdefault(phase, []).append(sample)
        self.first.setdefault(phase, []).append(first)
        if cpu_s is not None:
            self.cpu_s.setdefault(phase, []).append(round(cpu_s, 3))


class Abba:
    """The run order. Each repetition of a phase is a pair of runs, one per tool, back to back;
    which tool goes first alternates from pair to pair over the whole benchmark (ABBA), so the
    machine's drift and any after-effect of the previous run weigh on both tools alike."""

    def __init__(self, tools: list[Tool], repeat: int) -> None:
        self.tools, self.repeat = tools, repeat
        self.pairs = 0
        self.t0 = time.monotonic()
        self.log: list[dict[str, Any]] = []   # every run, for judging drift afterwards

    def runs(self, phase: str, times: int = 1, extra: list[Tool] | None = None) -> Iterator[tuple[int, Tool, bool]]:
        """(repetition, tool, first of its pair) for each run of ``phase`` (``times`` pairs per
        repetition), in run order; ``extra`` tools take their turn after the others (before them
        when the order is reversed)."""
        total = self.repeat * times
        tools = self.tools + (extra or [])
        for rep in range(total):
            order = tools if self.pairs % 2 == 0 else tools[::-1]
            self.pairs += 1
            lead = next(t for t in order if t in self.tools)   # first of the pair proper
            for tool in order:
                self.log.append({"phase": phase, "rep": rep + 1, "tool": tool.name, "first": tool is lead,
                                 "start_s": round(time.monotonic() - self.t0, 1),
                                 "loadavg_1min": round(os.getloadavg()[0], 2)})
                progress(f"{tool.name}: {phase} ({rep + 1}/{total})")
                yield rep, tool, tool is lead


def build_index_once(tool: Tool, runs: ToolRuns, records: int, first: bool,
                     hook: Callable[[], None] | None) -> None:
    """A first mount with an empty index cache, timed until the mount answers."""
    tool.reset_index()
    drop_caches()
    t = tool.mount()
    progress(f"  index of {records} records: {t:.2f}s, {records / t:,.0f} records/s")
    # Before the hook: the file lists and the tar walk this mount, which must not count in its memory.
    tool.record_mem(INDEX.name)
    if hook:
        hook()
    tool.umount()
    runs.add(INDEX.name, {"index_s": t, "index_records_per_s": records / t}, first)


def run_phase_once(tool: Tool, phase: Phase, inp: ReadInputs, runs: ToolRuns, first: bool, *,
                   profiler: Profiler | None, profile_as: str, keep: bool) -> None:
    """A fresh mount with cold caches, then the phase's work (timed by itself); the daemon's CPU
    time in the work and its peak memory over the mount are noted."""
    assert phase.work is not None
    drop_caches()
    runs.remount_s.append(round(tool.mount(), 4))
    if profiler:
        profiler.start(tool.pid, profile_as)
    drop_caches()
    cpu0 = proc_cpu(tool.pid)
    try:
        sample = phase.work(tool, inp)
    finally:
        cpu = proc_cpu(tool.pid) - cpu0
        if profiler:
            profiler.stop()
    runs.add(phase.name, sample, first, cpu)
    tool.record_mem(phase.name)
    if not keep:
        tool.umount()


def measure_reads(tools: list[Tool], inp: ReadInputs, profiler: Profiler | None,
                  hooks: dict[str, Callable[[], None]],
                  plain: PlainFiles | None = None) -> tuple[dict[str, ToolRuns], list[dict[str, Any]]]:
    """Every phase, each tool ``--repeat`` times, interleaved; ``hooks[tool name]`` runs once, on
    that tool's first mount (tools[0] goes first, so its hook can make what the others mount).
    ``plain`` takes its turn in the phases marked ``ceiling``."""
    args = inp.args
    records = inp.meta["small"] + inp.meta["large"]
    runs = {tool.name: ToolRuns() for tool in tools + ([plain] if plain else [])}
    order = Abba(tools, args.repeat)
    for _rep, tool, first in order.runs(INDEX.name):
        build_index_once(tool, runs[tool.name], records, first, hooks.pop(tool.name, None))
    for phase in READ_PHASES:
        total = args.repeat * phase.times
        extra: list[Tool] | None = [plain] if plain and phase.ceiling else None
        for rep, tool, first in order.runs(phase.name, phase.times, extra):
            # --keep leaves the mounts of the very last pair in place.
            keep = args.keep and phase is READ_PHASES[-1] and rep == total - 1
            suffix = f"-{rep + 1}" if total > 1 else ""
            run_phase_once(tool, phase, inp, runs[tool.name], first,
                           profiler=profiler if isinstance(tool, Tfrfs) else None,
                           profile_as=f"{tool.name}-{phase.name}{suffix}", keep=keep)
    return runs, order.log


def summarize(tool: Tool, runs: ToolRuns) -> dict[str, Any]:
    """The median of each figure over the repetitions (the table's value), with every sample;
    daemon CPU as the median, peak memory as the highest of any run."""
    r: dict[str, Any] = {"samples": {}, "first_in_pair": runs.first}
    for samples in runs.samples.values():
        for key in samples[0]:
            values = [s[key] for s in samples]
            r["samples"][key] = [round(v, 4) for v in values]
            r[key] = statistics.median(values)
    r["daemon_cpu_samples_s"] = runs.cpu_s
    r["daemon_cpu_s"] = {phase: round(statistics.median(v), 3) for phase, v in runs.cpu_s.items()}
    r["remount_samples_s"] = runs.remount_s
    r["remount_s"] = statistics.median(runs.remount_s) if runs.remount_s else None
    r["memory_by_phase"] = tool.mem
    r["peak_mib_by_phase"] = {phase: max(m.get("VmHWM", 0.0) for m in ms) for phase, ms in tool.mem.items()}
    r["peak_mib"], r["peak_phase"] = max(((v, p) for p, v in r["peak_mib_by_phase"].items()), default=(0.0, ""))
    return r


def unmount_all(tools: list[Tool]) -> None:
    """What a failed run left mounted."""
    for tool in tools:
        try:
            if tool.pid is not None or fstype_at(tool.mnt):
                tool.umount()
        except Exception as exc:  # keep unmounting the others
            progress(f"warning: unmounting {tool.mnt}: {exc}")
            force_unmount(tool.mnt)
