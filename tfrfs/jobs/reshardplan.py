"""What ``tfrfs reshard`` writes where, decided on the driver before any byte is copied: the
global order of the records (shards in order, records in order; or one deterministic shuffle of
it), where it is cut into new shards, and the new shards' names; then each new shard's task,
what its job reads (``Task``, made when the runner asks for it).

The shuffle (``--shuffle SEED``) is a keyed permutation of ``[0, N)``: a balanced Feistel network
over the smallest even power of two that holds N (so a domain under 4N), walked again while it
lands past N (cycle walking: at most a few steps on average). Output position ``i`` takes the
record at ``permutation(i)`` in the global order. It needs no memory per record (a billion
records are shuffled with six 64-bit keys), the same SEED gives the same order on every machine
and Python, and every record appears exactly once.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tfrfs.errors import UsageError
from tfrfs.format import bulk, tfrecord
from tfrfs.format.tfrecord import Problem
from tfrfs.index import idxfile
from tfrfs.index import tfds_info as tfds
from tfrfs.index.discovery import INDEX_SUFFIXES
from tfrfs.index.shard_index import ShardIndex
from tfrfs.jobs.publish import Dest

_M64 = (1 << 64) - 1
ROUNDS = 6


class Permutation:
    """A keyed permutation of ``range(n)``: ``p(i)`` for ``i`` in ``range(n)`` is every number of
    ``range(n)`` once."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        bits = max(2, (max(n - 1, 1)).bit_length())
        self.half = (bits + 1) // 2
        self.mask = (1 << self.half) - 1
        digest = hashlib.sha256(f"tfrfs-shuffle:{seed}".encode()).digest()
        self.keys = [int.from_bytes(digest[4 * k:4 * k + 8], "little") for k in range(ROUNDS)]

    def _round(self, right: int, key: int) -> int:
        # splitmix64's finalizer over (half, key): a strong 64-bit mix, cut to the half's width.
        x = (right * 0x9E3779B97F4A7C15 + key) & _M64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
        return (x ^ (x >> 31)) & self.mask

    def _encrypt(self, x: int) -> int:
        left, right, half, mask = x >> self.half, x & self.mask, self.half, self.mask
        for key in self.keys:
            left, right = right, left ^ self._round(right, key)
        return ((left & mask) << half) | right

    def __call__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        x = self._encrypt(i)
        while x >= self.n:   # cycle walking: stays within [0, n) and stays a permutation
            x = self._encrypt(x)
        return x


def cut_by_count(total: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` ranges ``[start, stop)`` over ``total`` records, of equal counts (the first ones
    one longer when it does not divide)."""
    base, extra = divmod(total, shards)
    out, start = [], 0
    for k in range(shards):
        stop = start + base + (1 if k < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def cut_by_size(shard_offsets: Sequence[Sequence[int]], limit: int) -> list[tuple[int, int]]:
    """Ranges of global record numbers over shards of these record offsets (each: every record's
    start, then the end of the last), in order: a new shard starts where the next record would take
    the current one past ``limit`` framed bytes (a shard holds at least one record). One bisection
    per cut, not a step per record."""
    out: list[tuple[int, int]] = []
    start = used = base = 0
    for offsets in shard_offsets:
        count = len(offsets) - 1
        r = 0
        while r < count:
            k = max(r, bisect.bisect_right(offsets, offsets[r] + (limit - used), r, count + 1) - 1)
            if k == r:
                if used == 0:
                    k = r + 1          # one record larger than the limit: a shard of its own
                else:
                    out.append((start, base + r))
                    start, used = base + r, 0
                    continue
            used += offsets[k] - offsets[r]
            r = k
        base += count
    if base > start or not out:
        out.append((start, base))
    return out


class Order:
    """The global order of a dataset's records: shard after shard, record after record."""

    def __init__(self, counts: Sequence[int]) -> None:
        self.starts = [0]
        for c in counts:
            self.starts.append(self.starts[-1] + c)

    @property
    def total(self) -> int:
        return self.starts[-1]

    def locate(self, g: int) -> tuple[int, int]:
        """(shard number, record number) of global record ``g``."""
        s = bisect.bisect_right(self.starts, g) - 1
        return s, g - self.starts[s]


# --- names ------------------------------------------------------------------------------------

_DIGITS = 5
_FIELD = re.compile(r"\{([A-Z_]+)\}")
PLAIN_TEMPLATE = "{PREFIX}-{SHARD_X_OF_Y}.tfrecord"
NUMBERED = ("SHARD_INDEX", "SHARD_X_OF_Y")


def check_template(template: str, fields: Sequence[str]) -> None:
    """Raises UsageError when ``template`` names unknown fields, a folder, or no shard number."""
    named = set(_FIELD.findall(template))
    unknown = named - set(fields) - {"SHARD_INDEX", "NUM_SHARDS", "SHARD_X_OF_Y"}
    if unknown:
        raise UsageError(f"--name {template}: unknown field(s) {', '.join(sorted(unknown))}; use "
                         f"{', '.join('{' + f + '}' for f in [*fields, 'SHARD_INDEX', 'NUM_SHARDS', 'SHARD_X_OF_Y'])}")
    if not named & set(NUMBERED):
        raise UsageError(f"--name {template}: give {{SHARD_INDEX}} or {{SHARD_X_OF_Y}}, so each shard has its own name")
    if "/" in template or template.startswith("."):
        raise UsageError(f"--name {template}: a file name, not a path or a hidden name")


def shard_name(template: str, i: int, n: int, fixed: dict[str, str]) -> str:
    """Shard ``i``'s name of ``n`` (numbers of at least five digits, as TFDS writes them)."""
    width = max(len(str(n)), _DIGITS)
    x, y = f"{i:0{width}d}", f"{n:0{width}d}"
    values = {**fixed, "SHARD_INDEX": x, "NUM_SHARDS": y, "SHARD_X_OF_Y": f"{x}-of-{y}"}
    return _FIELD.sub(lambda m: values[m.group(1)], template)


_NUMBERING = re.compile(r"(?:-\d+-of-\d+|[-_.]?\d+)\Z")
_SUFFIX = re.compile(r"(?:\.(?:tfrecords?|tfrec|records?)(?:-\d+(?:-of-\d+)?)?)?(?:\.gz|\.gzip|\.zlib)?\Z")


def stem(name: str) -> str:
    """A shard name less its TFRecord suffix and its shard numbering: ``train-00003-of-00010.tfrecord``
    and ``train.tfrecord-00003`` give ``train``."""
    base = _SUFFIX.sub("", name, count=1)
    return _NUMBERING.sub("", base, count=1)


def prefix_of(shard_names: Sequence[str], dest_name: str) -> str:
    """PREFIX of the new names: the source shards' common stem, else DEST's name."""
    stems = {stem(n) for n in shard_names}
    if len(stems) == 1 and (only := stems.pop()) and not only.startswith("."):
        return only
    return dest_name.strip(".") or "shard"


PICK = struct.Struct("<IQQ")   # a shuffled record: source shard, offset, length


# --- what a job gets ----------------------------------------------------------------------------

@dataclass(frozen=True)
class SourceShard:
    """How a job reads one shard's uncompressed stream."""

    path: str
    relpath: str
    compression: str
    data_path: str          # the driver's inflated copy of a compressed shard (used when here)
    stream_size: int


@dataclass(frozen=True)
class Task:
    """One new shard: its number, name, and the records it takes, in order: contiguous ``runs``
    of source streams ``(source, start byte, end byte, records)``, or ``picks`` (packed
    ``PICK``s) under a shuffle."""

    n: int
    name: str
    count: int
    sources: tuple[SourceShard, ...]
    runs: tuple[tuple[int, int, int, int], ...] = ()
    picks: bytes | None = None
    unchecked: bool = False          # runs copied as byte ranges, no record read (``_copy_unchecked``)
    starts: tuple[bytes, ...] = ()   # ... each run's record offsets in SOURCE (packed u64)
    dropped: tuple[dict, ...] = ()   # ... and the records left out for a data checksum indexing saw fail


# --- the plan: the groups, their cuts and names, and the jobs' tasks -----------------------------------------------------------------------------------

@dataclass
class Group:
    """Source shards resharded together (a TFDS split, or the whole dataset) and the new names."""

    split: dict | None              # the TFDS split, or None
    indexes: list[ShardIndex]
    numbers: list[int]              # the shards' numbers in SOURCE
    cuts: list[tuple[int, int]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)


@dataclass
class Plan:
    key: str
    groups: list[Group]
    sources: tuple[SourceShard, ...]
    compression: str
    kind: str
    shuffle: int | None
    info: dict | None                    # the source's dataset_info.json, parsed
    copies: list[str]                    # TFDS plain files copied as they are (relative paths)
    problems: list[tuple[str, dict]]     # what SOURCE's indexes already say is lost
    total: int = 0
    schema: bool = True                  # the jobs tally their shards' records (SPEC 5)
    unchecked: bool = False              # --no-check: runs copied without reading their records
    source_tallies: list | None = None   # else SOURCE's own, when all are known (the same records)

    @property
    def names(self) -> list[str]:
        return [n for g in self.groups for n in g.names]


def _group_cuts(g: Group, shards: int | None, shard_size: int | None, shuffled: bool) -> list[tuple[int, int]]:
    total = sum(i.count for i in g.indexes)
    if shards is not None:
        return cut_by_count(total, shards)
    assert shard_size is not None
    if shuffled:
        # Shuffled records are spread at random, so their sizes even out: equal counts.
        stream = sum((i.offsets[-1] - i.offsets[0]) if i.count else 0 for i in g.indexes)
        return cut_by_count(total, max(1, math.ceil(stream / shard_size)))
    return cut_by_size([i.offsets for i in g.indexes], shard_size)


def _runs(g: Group, order: Order, lo: int, hi: int, starts: list[bytes] | None = None,
          drops: list[dict] | None = None, *, pack: bool = True) -> list[tuple[int, int, int, int]]:
    """Contiguous byte ranges holding global records [lo, hi) of a group, split at gaps; with
    ``starts``, each run's record offsets (packed u64; unless not ``pack``) are appended to it, and the records whose
    data checksums indexing found failing (``ShardIndex.checked``) are left out, each one a
    problem appended to ``drops`` as a job that read it would report it."""
    out: list[tuple[int, int, int, int]] = []

    def run(k: int, first: int, start: int, end: int, count: int) -> None:
        if count <= 0:
            return
        out.append((g.numbers[k], start, end, count))
        if starts is not None and pack:
            starts.append(idxfile.as_u64(g.indexes[k].offsets[first:first + count]))
    # Only the shards holding records [lo, hi): a shard's first record at most hi - 1, its end past lo.
    first_shard = bisect.bisect_right(order.starts, lo) - 1
    last_shard = bisect.bisect_left(order.starts, hi, lo=first_shard)
    for k in range(max(0, first_shard), min(len(g.indexes), last_shard)):
        idx = g.indexes[k]
        a, b = max(lo, order.starts[k]) - order.starts[k], min(hi, order.starts[k + 1]) - order.starts[k]
        if a >= b:
            continue
        offsets, ends = idx.offsets, idx.ends
        cuts = {i: "gap" for i in ends if a <= i < b - 1} if ends else {}
        if starts is not None and idx.checked:
            cuts.update((i, "failed") for i in idx.checked if a <= i < b)
        first = a
        for i in sorted(cuts):
            if cuts[i] == "failed":
                run(k, first, offsets[first], offsets[i], i - first)
                if drops is not None:
                    at = offsets[i]
                    drops.append(dict(Problem(at, f"data checksum failed for the record at offset {at}").fields(),
                                      shard=idx.shard.relpath))
            else:
                run(k, first, offsets[first], ends[i], i + 1 - first)
            first = i + 1
        if first < b:
            last = ends.get(b - 1) if ends else None
            run(k, first, offsets[first], offsets[b] if last is None else last, b - first)
    return out


def _picks(g: Group, order: Order, perm: Permutation, lo: int, hi: int) -> bytes:
    packed = bytearray()
    pack = PICK.pack
    for i in range(lo, hi):
        k, r = order.locate(perm(i))
        start, length = g.indexes[k].span(r)
        packed += pack(g.numbers[k], start, length)
    return bytes(packed)


class Tasks(Sequence):
    """The jobs of a plan, made when the runner asks for them (a shuffle's picks are computed one
    shard at a time, while earlier shards are written), less those an earlier run finished."""

    def __init__(self, plan: Plan, skip: set[int]) -> None:
        self.plan = plan
        self.todo: list[tuple[Group, int, int]] = []    # (group, cut number, job number)
        n = 0
        for g in plan.groups:
            for c in range(len(g.cuts)):
                if n not in skip:
                    self.todo.append((g, c, n))
                n += 1
        self._orders = {id(g): Order([i.count for i in g.indexes]) for g in plan.groups}
        self._perms = {id(g): Permutation(self._orders[id(g)].total, plan.shuffle)
                       for g in plan.groups} if plan.shuffle is not None else {}

    def __len__(self) -> int:
        return len(self.todo)

    def task(self, k: int) -> Task:
        g, c, n = self.todo[k]
        lo, hi = g.cuts[c]
        order = self._orders[id(g)]
        if self.plan.shuffle is None:
            starts: list[bytes] | None = [] if self.plan.unchecked else None
            drops: list[dict] = []
            # The offsets of an unchecked copy go with the job only where its headers cannot be
            # walked in C (sending them costs more than finding them again).
            runs = _runs(g, order, lo, hi, starts, drops, pack=not bulk.available())
            # The job gets the source shards it reads, numbered in its runs.
            used = sorted({run[0] for run in runs})
            mine = {src: k for k, src in enumerate(used)}
            return Task(n, g.names[c], hi - lo, tuple(self.plan.sources[k] for k in used),
                        runs=tuple((mine[src], a, b, count) for src, a, b, count in runs),
                        unchecked=self.plan.unchecked, starts=tuple(starts or ()), dropped=tuple(drops))
        return Task(n, g.names[c], hi - lo, self.plan.sources, picks=_picks(g, order, self._perms[id(g)], lo, hi))

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        return self.task(k)


def tfds_info(path: str, files: Any) -> dict | None:
    """SOURCE's ``dataset_info.json`` at ``path`` when it is a TFDS dataset folder (its splits
    list shards)."""
    try:
        info = json.loads(files.read_bytes(path))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and tfds.splits_of(info) else None


def make_plan(src: Any, indexes: list[ShardIndex], dest: Dest, *, shards: int | None, shard_size: int | None,
              compression: str, shuffle: int | None, template: str | None, schema: bool | None = None,
              check: bool = True) -> Plan:
    """Everything the jobs and the publishing need, from SOURCE's indexes. Raises UsageError."""
    disc = src.discovery
    info = tfds_info(src.storage.join(disc.root, tfds.INFO), disc.access) \
        if disc.mirrors_dir and tfds.INFO in disc.plain_files else None
    sources = tuple(SourceShard(i.shard.path, i.shard.relpath, i.shard.compression, i.data_path,
                                _stream_size(i)) for i in indexes)
    groups: list[Group] = []
    copies: list[str] = []
    if info is not None:
        by_split: dict[str, Group] = {}
        if template is not None:
            check_template(template, ("DATASET", "SPLIT", "FILEFORMAT"))
        for n, idx in enumerate(indexes):
            found = tfds.place(info, idx.shard.relpath) if os.sep not in idx.shard.relpath else None
            if found is None:
                raise UsageError(f"{idx.shard.relpath}: a shard that no split of {tfds.INFO} lists; "
                                 "reshard the split's shards alone, or fix dataset_info.json")
            split = found[0]
            g = by_split.setdefault(str(split.get("name")), Group(split, [], []))
            g.indexes.append(idx)
            g.numbers.append(n)
        # Shards in their split's order (TFDS reads them so), splits in the file's order.
        for split in tfds.splits_of(info):
            g2 = by_split.get(str(split.get("name")))
            if g2 is None:
                continue
            t = tfds.FileTemplate(info, split)
            names = t.names(len(split["shardLengths"]))
            pairs = sorted(zip(g2.indexes, g2.numbers), key=lambda p: names.index(p[0].shard.relpath))
            g2.indexes, g2.numbers = [p[0] for p in pairs], [p[1] for p in pairs]
            groups.append(g2)
        copies = [rel for rel in disc.plain_files if os.sep not in rel and "/" not in rel
                  and rel != tfds.INFO and not rel.endswith(INDEX_SUFFIXES)]
        info = json.loads(json.dumps(info))
    else:
        if template is not None:
            check_template(template, ("PREFIX",))
        groups.append(Group(None, list(indexes), list(range(len(indexes)))))
    fixed = {"PREFIX": prefix_of([os.path.basename(i.shard.relpath) for i in indexes], dest.name)}
    for g in groups:
        g.cuts = _group_cuts(g, shards, shard_size, shuffle is not None)
        if g.split is not None:
            assert info is not None
            if template is not None:
                g.split["filepathTemplate"] = template
            g.names = tfds.FileTemplate(info, g.split).names(len(g.cuts))
        else:
            g.names = [shard_name(template or PLAIN_TEMPLATE, i, len(g.cuts), fixed)
                       for i in range(len(g.cuts))]
    names = [n for g in groups for n in g.names]
    if len(set(names)) != len(names):
        raise UsageError(f"--name {template}: gives two shards the same name")
    kinds = {i.detected_kind for i in indexes}
    kind = kinds.pop() if len(kinds) == 1 else "raw"
    problems = [(i.shard.relpath, p.fields()) for i in indexes for p in i.problems]
    key = hashlib.sha256(json.dumps({
        "source": src.storage.absolute(src.name),
        "shards": [[i.shard.relpath, i.shard.size, i.shard.identity] for i in indexes],
        "cut": [shards, shard_size], "compression": compression, "shuffle": shuffle, "names": names,
    }, sort_keys=True).encode()).hexdigest()
    # Splits are rewritten in ``info``'s own dicts (the groups hold them).
    # The new dataset's schema is SOURCE's when every record is copied and SOURCE's is known (the
    # same records): the jobs then tally nothing (``schema=None``), unless asked to (True).
    tallies = [i.tally for i in indexes] if not problems and not any(i.checked for i in indexes) else []
    known = bool(tallies) and all(t is not None and t.kind == kind for t in tallies)
    if schema is None:
        schema = not known
    plan = Plan(key, groups, sources, compression, kind, shuffle, info, copies, problems, schema=schema)
    if not schema and known:
        plan.source_tallies = [t for t in tallies if t is not None]
    # A record need not be looked at when its data checksum was checked while SOURCE was indexed
    # (or the user says not to check): a plain copy without a tally is then made of byte ranges.
    checked = all(i.checked is not None for i in indexes)
    plan.unchecked = (not check or checked) and not schema and shuffle is None and compression == tfrecord.NONE
    plan.total = sum(i.count for i in indexes)
    return plan


def _stream_size(idx: ShardIndex) -> int:
    if idx.shard.compression == tfrecord.NONE:
        return idx.shard.size
    try:
        return os.path.getsize(idx.data_path)
    except OSError:
        return -1
