"""Fuzzing damaged shards: single-fault mutants of real shards (mutator.py), each compared with
the reference reader (reference.py) through a real mount, ``tfrfs verify`` and ``tfrfs repair``.

The mutants are drawn once by Hypothesis from a fixed seed, after a few hand-made ones at the
edges of the contract (mutator.edge_mutants), and checked in batches: one mount of a folder
holding many mutants, each in its own sub-folder beside a healthy shard, is far cheaper than a
mount per mutant. Every record is seen through ``--records raw`` (``NNNNNN.bin`` holding the
record's bytes), so bytes compare directly.

For each mutant:
- in a folder beside a healthy shard: a shard folder exactly when the reference says it is a
  shard (else the plain file, unchanged); its compression and record count (xattrs); one entry per
  record the reference finds, named by its number, no other; every sound record's bytes, size and
  offset/index/length xattrs; a record whose data crc fails reads with EIO, never other bytes; one
  ``.tfrfs/errors`` line per problem the reference finds (shard, index, offset, plus resync_offset
  and skipped for gaps, compressed_offset for a damaged compressed stream) and no other line;
  the healthy neighbour whole; the daemon alive after, and no traceback in its log;
- ``tfrfs verify --json`` of its folder: exit 1 when the reference finds a problem, else 0, and
  the same records, compression and problems;
- ``tfrfs repair`` of a copy of every folder: exit 0; each damaged shard rewritten with exactly
  its sound records in order (framed as they were), same compression, no problem left; the
  original kept as ``.tfrfs-damaged/NAME``; sound shards and plain files untouched; then
  ``verify`` of the copy exits 0, and a mount of it reports nothing and hides ``.tfrfs-damaged``;
- alone (the hand-made ones and a sample of the rest): mounted as SOURCE itself, the same
  checks, and ``tfrfs verify`` of it (exit status, a line per problem); or exit 2 from both when
  the reference says it is no shard.

Environment: TFRFS_FUZZ_MUTANTS (mutants drawn, default 300), TFRFS_FUZZ_SEED (16),
TFRFS_FUZZ_ALONE (drawn mutants also mounted alone, besides every hand-made one: 10),
TFRFS_FUZZ_BATCH (mutants a mount, 100), TFRFS_FUZZ_KEEP (a folder to copy the failing mutants
into, each with what differs), TFRFS_FUZZ_SUMMARY (a file for the counts, as JSON).
``scripts/fuzz`` runs it longer. A summary line gives the counts: mutants, records, the sound
records salvaged beyond what a reader that stops at the first damage (as TensorFlow does) gets,
and the mutants that differ from the reference.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from conftest import REALDATA, force_unmount, is_mounted, run_tfrfs
from mutator import HEALTHY, Mutant, draw_mutants, edge_mutants, realdata_bases, tf_written_bases
from reference import FileView, Problem, frame, read_file, shard_view

pytestmark = pytest.mark.mount

MUTANTS = int(os.environ.get("TFRFS_FUZZ_MUTANTS", "300"))
SEED = int(os.environ.get("TFRFS_FUZZ_SEED", "16"))
ALONE = int(os.environ.get("TFRFS_FUZZ_ALONE", "10"))
BATCH = int(os.environ.get("TFRFS_FUZZ_BATCH", "100"))
KEEP = os.environ.get("TFRFS_FUZZ_KEEP")            # copy the failing mutants here
SUMMARY = os.environ.get("TFRFS_FUZZ_SUMMARY")      # write the counts here, as JSON
WORKERS = max(2, os.cpu_count() or 2)
HEALTHY_NAME = "healthy.tfrecord"
RAW = ("--records", "raw")


@dataclass
class Case:
    number: int
    mutant: Mutant
    view: FileView          # found in a folder
    alone: FileView         # named as SOURCE

    @property
    def folder(self) -> str:
        return f"b{self.number // BATCH:02d}/m{self.number:05d}"

    @property
    def rel(self) -> str:                 # relative to its batch folder
        return f"m{self.number:05d}/{self.mutant.name}"

    def __str__(self) -> str:
        return f"#{self.number} {self.mutant!r}"


@dataclass
class Tally:
    counts: Counter = field(default_factory=Counter)
    failures: dict[int, list[str]] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)

    def fail(self, case: Case, layer: str, problems: list[str]) -> None:
        if problems:
            self.failures.setdefault(case.number, []).extend(f"[{layer}] {p}" for p in problems)

    def report(self, cases: list[Case], layer: str) -> str:
        mine = [(n, [p for p in ps if p.startswith(f"[{layer}]")]) for n, ps in sorted(self.failures.items())]
        mine = [(n, ps) for n, ps in mine if ps]
        lines = [f"{len(mine)} mutant(s) of {len(cases)} differ from the reference ({layer}):"]
        for n, ps in mine[:25]:
            lines.append(f"  {cases[n]}")
            lines += [f"      {p}" for p in ps[:6]]
        return "\n".join(lines)

    def layer_failed(self, layer: str) -> bool:
        return any(p.startswith(f"[{layer}]") for ps in self.failures.values() for p in ps)


@dataclass
class Corpus:
    root: Path              # b00/m00000/NAME + b00/m00000/healthy.tfrecord, ...
    cases: list[Case]
    healthy: bytes
    healthy_view: FileView
    tally: Tally
    work: Path

    def batches(self) -> Iterator[tuple[Path, list[Case]]]:
        for b in range(0, len(self.cases), BATCH):
            chunk = self.cases[b:b + BATCH]
            yield self.root / f"b{b // BATCH:02d}", chunk


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, request) -> Iterator[Corpus]:
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")
    if not (REALDATA / HEALTHY).exists():
        pytest.skip(f"no real data at {REALDATA}")
    work = tmp_path_factory.mktemp("fuzz")
    t0 = time.monotonic()
    bases = realdata_bases(REALDATA) + tf_written_bases(work / "tf")
    mutants = edge_mutants(bases) + draw_mutants(bases, MUTANTS, SEED)
    cases = [Case(i, m, read_file(m.data, m.name), read_file(m.data, m.name, source=True))
             for i, m in enumerate(mutants)]
    healthy = (REALDATA / HEALTHY).read_bytes()
    root = work / "corpus"
    for c in cases:
        d = root / c.folder
        d.mkdir(parents=True)
        (d / c.mutant.name).write_bytes(c.mutant.data)
        (d / HEALTHY_NAME).write_bytes(healthy)
    tally = Tally()
    tally.times["draw"] = time.monotonic() - t0
    corpus = Corpus(root, cases, healthy, read_file(healthy, HEALTHY_NAME), tally, work)
    yield corpus
    summary = summarize(corpus)
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():    # shown whether the tests pass or not
            print("\n" + summary)
    else:
        print(summary)
    if SUMMARY:
        Path(SUMMARY).write_text(json.dumps(counts(corpus), indent=1) + "\n")
    if KEEP and tally.failures:
        keep = Path(KEEP)
        for n in tally.failures:
            c = cases[n]
            d = keep / f"m{n:05d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / c.mutant.name).write_bytes(c.mutant.data)
            (d / "what.txt").write_text(f"{c}\n" + "\n".join(tally.failures[n]) + "\n")


def counts(corpus: Corpus) -> dict:
    cases, t = corpus.cases, corpus.tally
    shards = [c for c in cases if c.view.is_shard]
    damaged = sum(1 for c in shards if c.view.problems)
    return {
        "seed": SEED, "mutants": len(cases), "hand_made": sum(1 for c in cases if c.mutant.base == "edge"),
        "damaged": damaged, "sound": len(shards) - damaged,
        "not_shards": len(cases) - len(shards),
        "records": sum(len(c.view.records) for c in shards),
        "sound_records": sum(len(c.view.sound_records) for c in shards),
        "tf_records": sum(c.view.tf_count for c in shards),
        "salvaged_beyond_tf": sum(len(c.view.sound_records) - c.view.tf_count for c in shards),
        "checked": {k: t.counts[k] for k in ("folder", "verify", "repair", "alone")},
        "failures": len(t.failures), "mismatches": sum(len(v) for v in t.failures.values()),
        "seconds": {k: round(v, 1) for k, v in t.times.items()},
    }


def summarize(corpus: Corpus) -> str:
    c = counts(corpus)
    checked = " ".join(f"{k}={v}" for k, v in c["checked"].items())
    times = " ".join(f"{k}={v}s" for k, v in c["seconds"].items())
    return (f"fuzz summary: seed={c['seed']} mutants={c['mutants']} ({c['hand_made']} hand-made; "
            f"damaged {c['damaged']}, sound {c['sound']}, "
            f"not shards {c['not_shards']}) records={c['records']} sound_records={c['sound_records']} "
            f"tf_reader_records={c['tf_records']} salvaged_beyond_tf={c['salvaged_beyond_tf']} "
            f"checked: {checked} failures={c['failures']} mismatches={c['mismatches']} [{times}]")


# --- comparing a mount with the reference ---------------------------------------------------------

def record_name(i: int, count: int) -> str:
    return f"{i:0{max(6, len(str(count - 1)))}d}.bin"


def xattr(path: Path, name: str) -> str | None:
    try:
        return os.getxattr(path, name).decode()
    except OSError:
        return None


def check_mounted(d: Path, view: FileView, data: bytes, rel: str) -> list[str]:
    """The entry ``d`` of a ``--records raw`` mount against the reference's view of its file."""
    if not view.is_shard:
        if d.is_dir():
            return [f"{rel}: a shard folder, but it is no shard (a plain file)"]
        try:
            got = d.read_bytes()
        except OSError as exc:
            return [f"{rel}: the plain file is not readable: {exc!r}"]
        return [] if got == data else [f"{rel}: the plain file's bytes differ"]
    if not d.is_dir():
        return [f"{rel}: no shard folder ({'a plain file' if d.exists() else 'missing'})"]
    out = []
    comp, count = xattr(d, "user.tfrfs.compression"), xattr(d, "user.tfrfs.count")
    if comp != view.compression:
        out.append(f"{rel}: compression {comp}, reference {view.compression}")
    if count != str(len(view.records)):
        out.append(f"{rel}: count xattr {count}, reference {len(view.records)}")
    try:
        listed = sorted(os.listdir(d))
    except OSError as exc:
        return out + [f"{rel}: listing failed: {exc!r}"]
    want = [record_name(r.number, len(view.records)) for r in view.records]
    if listed != want:
        extra, missing = sorted(set(listed) - set(want)), sorted(set(want) - set(listed))
        out.append(f"{rel}: {len(listed)} entries, reference {len(want)} records; "
                   f"extra {extra[:5]}, missing {missing[:5]}")
    for r, name in zip(view.records, want):
        p = d / name
        try:
            with open(p, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                got = f.read()
        except OSError as exc:
            if r.data_crc_ok:
                out.append(f"{rel}/{name} (offset {r.offset}): read failed: {exc!r}")
            elif exc.errno != errno.EIO:
                out.append(f"{rel}/{name}: data crc fails: errno {exc.errno}, not EIO")
        else:
            if not r.data_crc_ok:
                out.append(f"{rel}/{name} (offset {r.offset}): its data crc fails but it read "
                           f"{'its unverified' if got == r.data else 'other'} bytes ({len(got)})")
            elif got != r.data:
                out.append(f"{rel}/{name} (offset {r.offset}): {len(got)} bytes read, not the record's {len(r.data)}")
            elif size != len(r.data):
                out.append(f"{rel}/{name}: stat size {size}, {len(r.data)} bytes")
        if not r.data and not r.data_crc_ok:
            # An empty record whose data crc fails: no read reaches the daemon for an empty file,
            # so its stat fails with EIO (README, Damaged data), and so do its xattrs.
            try:
                os.stat(p)
                out.append(f"{rel}/{name}: an empty record whose data crc fails, but its stat works")
            except OSError as exc:
                if exc.errno != errno.EIO:
                    out.append(f"{rel}/{name}: empty, data crc fails: stat errno {exc.errno}, not EIO")
            continue
        got_x = tuple(xattr(p, f"user.tfrfs.{k}") for k in ("offset", "index", "length"))
        if got_x != (str(r.offset), str(r.number), str(len(r.data))):
            out.append(f"{rel}/{name}: xattrs offset, index, length {got_x}, reference "
                       f"{(r.offset, r.number, len(r.data))}")
        if len(out) > 12:
            break
    return out


EXTRA_FIELDS = {"gap": ("resync_offset", "skipped"), "stream": ("compressed_offset",)}


def field_problems(p: Problem, line: dict) -> list[str]:
    """The fields a line of this kind of problem must carry besides shard, index and offset."""
    out = []
    for key in EXTRA_FIELDS.get(p.kind, ()):
        if key not in line:
            out.append(f"lacks {key} (reference {getattr(p, key)})")
        elif line[key] != getattr(p, key):
            out.append(f"{key} {line[key]}, reference {getattr(p, key)}")
    if p.kind == "cut" and "skipped" in line and line["skipped"] != p.skipped:
        out.append(f"skipped {line['skipped']}, reference {p.skipped}")
    return out


def match_problems(problems: list[Problem], lines: list[dict], rel: str, where: str) -> list[str]:
    """One line for each problem of the reference (the same offset and index, then the same
    fields of its kind), and no other line."""
    out = [f"{rel}: {where} entry lacks {sorted({'shard', 'index', 'offset', 'reason'} - set(o))}: {o}"
           for o in lines if not {"shard", "index", "offset", "reason"} <= set(o)]
    left = list(lines)
    for p in problems:
        same = [o for o in left if o.get("offset") == p.offset and o.get("index") == p.index]
        if not same:
            out.append(f"{rel}: no {where} entry for {p.describe()}")
            continue
        best = min(same, key=lambda o: len(field_problems(p, o)))
        left.remove(best)
        out += [f"{rel}: {where} entry for {p.kind} at offset {p.offset} {f}" for f in field_problems(p, best)]
    out += [f"{rel}: {where} entry the reference does not have: {o}" for o in left]
    if out and lines:
        out.append(f"{rel}: {where} entries: {lines[:6]}")
    return out


def read_errors(mnt: Path) -> tuple[dict[str, list[dict]], list[str]]:
    by_shard: dict[str, list[dict]] = {}
    bad = []
    for line in (mnt / ".tfrfs" / "errors").read_text().splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            bad.append(line)
            continue
        if isinstance(obj, dict):
            by_shard.setdefault(str(obj.get("shard")), []).append(obj)
        else:
            bad.append(line)
    return by_shard, bad


def fail_if(tally: Tally, cases: list[Case], layer: str) -> None:
    if tally.layer_failed(layer):
        pytest.fail(tally.report(cases, layer), pytrace=False)


# --- the tests ------------------------------------------------------------------------------------

def test_mutants_in_folders_beside_a_healthy_shard(corpus, tfrfs_mount):
    t0 = time.monotonic()
    tally = corpus.tally
    for batch_dir, cases in corpus.batches():
        mnt = tfrfs_mount(batch_dir, *RAW)
        for c in cases:
            problems = check_mounted(mnt / c.rel, c.view, c.mutant.data, c.rel)
            problems += check_mounted(mnt / c.folder.split("/")[1] / HEALTHY_NAME, corpus.healthy_view,
                                      corpus.healthy, f"{c.folder}/{HEALTHY_NAME} (the healthy neighbour)")
            tally.fail(c, "folder", problems)
        errors, bad = read_errors(mnt)
        assert not bad, f".tfrfs/errors lines that are not JSON objects: {bad[:5]}"
        for c in cases:
            expected = c.view.problems if c.view.is_shard else []
            tally.fail(c, "folder", match_problems(expected, errors.pop(c.rel, []), c.rel, ".tfrfs/errors"))
            tally.counts["folder"] += 1
        assert not errors, f".tfrfs/errors lines for the healthy shards: {list(errors.items())[:5]}"
        # the daemon is alive after all of it
        assert sorted(os.listdir(mnt)) == sorted(c.folder.split("/")[1] for c in cases)
        run_tfrfs("umount", str(mnt))
    tally.times["folder"] = time.monotonic() - t0
    fail_if(tally, corpus.cases, "folder")


def verify_one(corpus: Corpus, c: Case) -> list[str]:
    folder = corpus.root / c.folder
    proc = run_tfrfs("verify", "--json", *RAW, "--cache-dir", str(corpus.work / "cache"), str(folder))
    want = 1 if c.view.is_shard and c.view.problems else 0
    out = []
    if proc.returncode != want:
        out.append(f"verify exited {proc.returncode}, expected {want}: {proc.stderr.strip()[-300:]}")
    try:
        doc = json.loads(proc.stdout)
        shards = {s["shard"]: s for s in doc["shards"]}
    except (ValueError, KeyError, TypeError) as exc:
        return out + [f"verify --json printed no document ({exc!r}): {proc.stdout[:300]!r}"]
    name = c.mutant.name
    expect = {name: c.view, HEALTHY_NAME: corpus.healthy_view} if c.view.is_shard else {HEALTHY_NAME: corpus.healthy_view}
    if sorted(shards) != sorted(expect):
        out.append(f"verify --json lists shards {sorted(shards)}, reference {sorted(expect)}")
    for rel, view in expect.items():
        s = shards.get(rel)
        if s is None:
            continue
        if s.get("records") != len(view.records) or s.get("compression") != view.compression:
            out.append(f"{rel}: verify says {s.get('records')} records, {s.get('compression')}; reference "
                       f"{len(view.records)}, {view.compression}")
        out += match_problems(view.problems, list(s.get("problems", [])), rel, "verify --json")
    total = sum(len(v.problems) for v in expect.values())
    if doc.get("problems") != total:
        out.append(f"verify --json counts {doc.get('problems')} problems, reference {total}")
    return out


def test_verify_each_mutant(corpus):
    t0 = time.monotonic()
    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(lambda c: verify_one(corpus, c), corpus.cases))
    for c, problems in zip(corpus.cases, results):
        corpus.tally.fail(c, "verify", problems)
        corpus.tally.counts["verify"] += 1
    corpus.tally.times["verify"] = time.monotonic() - t0
    fail_if(corpus.tally, corpus.cases, "verify")


def check_repaired(folder: Path, c: Case, healthy: bytes) -> list[str]:
    name, view = c.mutant.name, c.view
    path, backup = folder / name, folder / ".tfrfs-damaged" / name
    if not path.exists():
        return [f"repair left no {name}"]
    data = path.read_bytes()
    out = []
    if (folder / HEALTHY_NAME).read_bytes() != healthy:
        out.append("repair changed the healthy neighbour")
    if not (view.is_shard and view.problems):
        if data != c.mutant.data:
            out.append("repair changed a file that is no damaged shard")
        if (folder / ".tfrfs-damaged").exists():
            out.append(f"repair made .tfrfs-damaged/ for no damaged shard: {os.listdir(folder / '.tfrfs-damaged')}")
        return out
    if not backup.exists():
        out.append(f"no backup .tfrfs-damaged/{name}")
    elif backup.read_bytes() != c.mutant.data:
        out.append(f".tfrfs-damaged/{name} does not hold the original bytes")
    want = [r.data for r in view.sound_records]
    after = shard_view(data, name, view.compression)
    if after.problems:
        out.append(f"the repaired shard still has problems: {[p.describe() for p in after.problems][:4]}")
    got = [r.data for r in after.records]
    if got != want:
        out.append(f"the repaired shard holds {len(got)} records, the sound ones are {len(want)}"
                   + ("" if len(got) != len(want) else " (other bytes or order)"))
    if view.compression == "NONE" and data != b"".join(frame(d) for d in want):
        out.append("the repaired plain shard is not the sound records' framed bytes, in order")
    if want and read_file(data, name).compression != view.compression:
        out.append(f"the repaired shard is {read_file(data, name).compression}, was {view.compression}")
    return out


def test_repair_a_copy(corpus, tfrfs_mount):
    """Repair every folder at once (a copy), then check each shard, verify the whole copy, and
    mount it: no problem left, ``.tfrfs-damaged/`` not shown."""
    t0 = time.monotonic()
    copy = corpus.work / "repaired"
    shutil.copytree(corpus.root, copy)
    proc = run_tfrfs("repair", str(copy), timeout=600)
    assert proc.returncode == 0, f"repair exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    for c in corpus.cases:
        problems = check_repaired(copy / c.folder, c, corpus.healthy)
        if c.view.is_shard and c.view.problems and f"{c.folder}/{c.mutant.name}" not in proc.stdout:
            problems.append("repair's output does not name the shard")
        corpus.tally.fail(c, "repair", problems)
        corpus.tally.counts["repair"] += 1
    verified = run_tfrfs("verify", *RAW, "--cache-dir", str(corpus.work / "cache"), str(copy), timeout=600)
    mnt = tfrfs_mount(copy, *RAW)
    for c in corpus.cases:
        d = mnt / c.folder
        listed = sorted(os.listdir(d))
        problems = [f"the mount of the repaired copy shows {listed}"] if ".tfrfs-damaged" in listed else []
        after = read_file((copy / c.folder / c.mutant.name).read_bytes(), c.mutant.name)
        if after.is_shard:
            count = xattr(d / c.mutant.name, "user.tfrfs.count")
            if count != str(len(c.view.sound_records if c.view.is_shard else after.records)):
                problems.append(f"the mount of the repaired copy shows {count} records")
        corpus.tally.fail(c, "repair", problems)
    errors = (mnt / ".tfrfs" / "errors").read_text()
    corpus.tally.times["repair"] = time.monotonic() - t0
    fail_if(corpus.tally, corpus.cases, "repair")
    assert verified.returncode == 0, f"verify after repair exited {verified.returncode}:\n{verified.stdout[-3000:]}"
    assert errors == "", f"the mount of the repaired copy reports problems:\n{errors[:3000]}"


def verify_lines(stdout: str, problems: list[Problem], name: str) -> list[str]:
    """``tfrfs verify`` prints a line per problem naming the shard, the index and the offset."""
    lines = [line for line in stdout.splitlines() if name in line]
    out = []
    for p in problems:
        words = [str(p.offset)] + ([str(p.index)] if p.index is not None else [])
        hit = next((line for line in lines if all(re.search(rf"\b{w}\b", line) for w in words)), None)
        if hit is None:
            out.append(f"verify prints no line for {p.describe()}: {stdout.strip()[-400:]!r}")
        else:
            lines.remove(hit)
    return out


def alone_sample(cases: list[Case]) -> list[Case]:
    """Every hand-made mutant, and ALONE drawn ones spread over the rest."""
    edges = [c for c in cases if c.mutant.base == "edge"]
    drawn = [c for c in cases if c.mutant.base != "edge"]
    if ALONE <= 0 or not drawn:
        return edges
    return edges + drawn[::max(1, len(drawn) // ALONE)][:ALONE]


def test_mutants_alone_as_source(corpus, tfrfs_mount, tmp_path):
    t0 = time.monotonic()
    for c in alone_sample(corpus.cases):
        src = tmp_path / f"src{c.number}" / c.mutant.name
        src.parent.mkdir()
        src.write_bytes(c.mutant.data)
        view, name = c.alone, c.mutant.name
        problems = []
        proc = run_tfrfs("verify", *RAW, "--cache-dir", str(corpus.work / "cache"), str(src))
        want = 2 if not view.is_shard else 1 if view.problems else 0
        if proc.returncode != want:
            problems.append(f"verify of it alone exited {proc.returncode}, expected {want}: "
                            f"{(proc.stdout + proc.stderr).strip()[-300:]}")
        if view.is_shard:
            problems += verify_lines(proc.stdout, view.problems, name)
        if view.is_shard:
            mnt = tfrfs_mount(src, *RAW)
            problems += check_mounted(mnt / name, view, c.mutant.data, name)
            errors, bad = read_errors(mnt)
            problems += [f".tfrfs/errors line not a JSON object: {b}" for b in bad]
            problems += match_problems(view.problems, errors.pop(name, []), name, ".tfrfs/errors")
            problems += [f".tfrfs/errors lines for shard {k!r}: {v[:3]}" for k, v in errors.items()]
            if os.listdir(mnt) != [name]:
                problems.append(f"the mount shows {os.listdir(mnt)}")
            run_tfrfs("umount", str(mnt))
        else:
            mnt = tmp_path / f"mnt{c.number}"
            mnt.mkdir()
            proc = run_tfrfs("mount", str(src), str(mnt), *RAW, "--cache-dir", str(corpus.work / "cache"),
                             "--log", str(tmp_path / f"alone{c.number}.log"))
            if proc.returncode != 2 or is_mounted(mnt):
                problems.append(f"no shard alone: mount exited {proc.returncode} (expected 2): {proc.stderr.strip()}")
            force_unmount(mnt)
            log = tmp_path / f"alone{c.number}.log"
            if log.exists() and "Traceback" in log.read_text(errors="replace"):
                problems.append(f"a traceback in {log}")
        corpus.tally.fail(c, "alone", problems)
        corpus.tally.counts["alone"] += 1
    corpus.tally.times["alone"] = time.monotonic() - t0
    fail_if(corpus.tally, corpus.cases, "alone")
