"""TFDS metadata kept in step with the shards it lists (``dataset_info.json``, beside them).

A TFDS split lists its shards by a file name template (``filepathTemplate``, by default
``{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}``), their record counts (``shardLengths``) and
the bytes of its records (``numBytes``: the records' data, without framing). TFDS finds a split's
files by formatting the template for shard ``0 .. len(shardLengths)-1`` (numbers of at least five
digits), and reads each file for as many records as its length says. So after a commit or a
repair, the lengths must follow the files, and the list can change length only where the files'
names say so: ``-of-NNNNN`` names the split's shard count, and a split whose files no longer form
one whole set (a shard removed from the middle, a third shard beside two ``-of-00002``) cannot be
described at all. That is reported, and the split is left as it was; files are never renamed.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Collection, Iterable

from tfrfs.storage import durable
from tfrfs.format import tfrecord
from tfrfs.index.shard_index import ShardIndex
from tfrfs.index.discovery import TMP_PREFIX

if TYPE_CHECKING:
    from tfrfs.storage.places import Place

INFO = "dataset_info.json"
DEFAULT_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
_DIGITS = 5          # TFDS pads shard numbers to at least five digits
_SHOWN = 3           # names a note spells out before "and N more"


@dataclass(frozen=True)
class ShardFigures:
    """A shard's records as a split counts them."""

    records: int
    data_bytes: int       # the records' data, without framing


def figures_of(idx: ShardIndex) -> ShardFigures:
    """What a shard's index says it holds (its gaps, if damaged, are not records)."""
    count = idx.count
    if not count:
        return ShardFigures(0, 0)
    framed = idx.offsets[-1] - idx.offsets[0]
    gaps = sum(idx.offsets[i + 1] - end for i, end in idx.ends.items()) if idx.ends else 0
    return ShardFigures(count, framed - gaps - count * tfrecord.OVERHEAD)


class FileTemplate:
    """A split's shard file names as TFDS makes them from ``filepathTemplate``."""

    def __init__(self, info: dict, split: dict) -> None:
        text = str(split.get("filepathTemplate") or DEFAULT_TEMPLATE)
        self.fixed = {"DATASET": str(info.get("name", "")), "SPLIT": str(split.get("name", "")),
                      "FILEFORMAT": str(info.get("fileFormat") or "tfrecord")}
        self.parts = re.split(r"\{([A-Z_]+)\}", text)
        fields = set(self.parts[1::2])
        # A template naming sub-folders, or with fields TFDS added later, is left to TFDS.
        self.usable = "/" not in text and fields <= {*self.fixed, "SHARD_INDEX", "NUM_SHARDS", "SHARD_X_OF_Y"}
        # Whether the names carry the split's shard count: then a set of them says how many there are.
        self.counted = bool(fields & {"NUM_SHARDS", "SHARD_X_OF_Y"})
        number = rf"\d{{{_DIGITS},}}"
        regex = {**{k: re.escape(v) for k, v in self.fixed.items()}, "SHARD_INDEX": number,
                 "NUM_SHARDS": f"(?P<n>{number})", "SHARD_X_OF_Y": f"{number}-of-(?P<n>{number})"}
        body: list[str] = []
        for k, p in enumerate(self.parts):
            piece = regex.get(p, "") if k % 2 else re.escape(p)
            if "(?P<n>" in piece and any("(?P<n>" in b for b in body):
                piece = piece.replace("(?P<n>", "(")     # the count named twice: one group for it
            body.append(piece)
        self.pattern = re.compile("".join(body)) if self.usable else None

    def name(self, i: int, n: int) -> str:
        """Shard ``i``'s file name in a split of ``n`` shards."""
        width = max(len(str(n)), _DIGITS)
        x, y = f"{i:0{width}d}", f"{n:0{width}d}"
        values = {**self.fixed, "SHARD_INDEX": x, "NUM_SHARDS": y, "SHARD_X_OF_Y": f"{x}-of-{y}"}
        return "".join(values[p] if k % 2 else p for k, p in enumerate(self.parts))

    def match(self, name: str) -> re.Match[str] | None:
        return self.pattern.fullmatch(name) if self.pattern is not None else None

    def names(self, n: int) -> list[str]:
        return [self.name(i, n) for i in range(n)]


@dataclass
class Followed:
    """What following the shards did to one ``dataset_info.json`` (in memory)."""

    changes: list[str] = field(default_factory=list)    # what was updated, a line per split
    problems: list[str] = field(default_factory=list)   # what could not be kept in step, and why


def _listed(split: dict) -> list | None:
    lengths = split.get("shardLengths")
    return lengths if isinstance(lengths, list) else None


def splits_of(info: dict) -> list[dict]:
    """The splits that list shards (a ``dataset_info.json`` of another tool has none)."""
    splits = info.get("splits")
    return [s for s in splits if isinstance(s, dict) and _listed(s) is not None] if isinstance(splits, list) else []


def number_like(old: object, value: int) -> object:
    """``value`` in the type the file used (TFDS writes 64-bit counts as strings)."""
    return value if isinstance(old, int) and not isinstance(old, bool) else str(value)


def _int(value: object) -> int | None:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def _few(names: Iterable[str]) -> str:
    names = sorted(names)
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def place(info: dict, name: str) -> tuple[dict, int] | None:
    """(split, shard number) of the shard file ``name`` in ``info``, or None when no split lists it."""
    for split in splits_of(info):
        t = FileTemplate(info, split)
        names = t.names(len(_listed(split) or ())) if t.match(name) else []
        if name in names:
            return split, names.index(name)
    return None


def follow(info: dict, shards: dict[str, ShardFigures], changed: Collection[str] | None = None) -> Followed:
    """Bring ``info`` (a parsed ``dataset_info.json``) in step with ``shards``: every shard file in
    its folder, by name, with what it holds. ``changed``: the names a commit wrote, made or removed
    (None: not known, as in a repair). Problems are reported for these names only, so a folder
    holding part of a dataset, or other shards too, is not reported at every commit; lengths are
    taken from every file, so a split left stale by a crash between a commit's shards and this
    file is put right by the next commit or repair of the folder.

    Per split, the files that fit its template count. When they are one whole set (shards
    ``0 .. n-1``, named for ``n`` shards where the names carry a count), the split lists exactly
    them. When not, each file the split lists gets its length, and what does not fit is reported.
    A split with no file here is left alone (a partial copy of the dataset)."""
    out = Followed()
    splits = splits_of(info)
    if not splits:
        return out
    touched = set(changed or ())
    fitted: set[str] = set()
    for split in splits:
        t = FileTemplate(info, split)
        if not t.usable:
            continue
        fits = {name: shards[name] for name in shards if t.match(name)}
        fitted |= set(fits)
        gone = {name for name in touched - set(shards) if t.match(name)}
        # numBytes follows a split whose lengths changed, or that a commit named changed (an edit
        # keeps the count); otherwise what the file says is left alone.
        edited = changed is not None and bool(set(fits) & touched or gone)
        _follow_split(split, t, fits, touched, gone, edited, out)
    strays = touched & set(shards) - fitted
    if strays:
        out.problems.append(f"{_few(strays)}: fits no split's filepathTemplate in {INFO}, so TFDS does not "
                            "read it; name it as a split's shards are named to add it to that split")
    return out


def _follow_split(split: dict, t: FileTemplate, fits: dict[str, ShardFigures], touched: set[str], gone: set[str],
                  edited: bool, out: Followed) -> None:
    label = f"split {split.get('name')!r}"
    listed = len(_listed(split) or ())
    if not fits:
        if gone:
            out.problems.append(f"{label}: {_few(gone)} removed and no shard of it is left here; {INFO} "
                                "still lists it: left as it was")
        return
    n = _whole(t, fits, listed, gone)
    if n is not None:
        _set(split, [fits[name] for name in t.names(n)], edited, label, out)
        return
    # Not one whole set: the files the split lists follow; the others cannot be named in its terms.
    names = t.names(listed)
    if set(fits) & set(names):
        _set(split, [fits.get(name) for name in names], edited, label, out)
    odd = set(fits) & touched - set(names)
    lost = gone & set(names)
    if odd or lost:
        what = "; ".join(filter(None, [f"{_few(odd)} not listed" if odd else "",
                                       f"{_few(lost)} removed but still listed" if lost else ""]))
        k = len(fits)
        fitting = t.name(0, k) + (f" .. {t.name(k - 1, k)}" if k > 1 else "")
        out.problems.append(f"{label}: {what}: TFDS finds a split's shards by their names, numbered from 0"
                            f"{' and naming their count' if t.counted else ''}, so these {k} shards must be "
                            f"named {fitting} to be listed: rename them, then commit again")


def _whole(t: FileTemplate, fits: dict[str, ShardFigures], listed: int, gone: set[str]) -> int | None:
    """n when ``fits`` are exactly shards 0..n-1 of a split of n, named as TFDS names them."""
    if t.counted:
        counts = {int(m.group("n")) for m in map(t.match, fits) if m is not None}
        if len(counts) != 1:
            return None
        n = counts.pop()
    else:
        n = len(fits)
        # Names without a count cannot tell a shard removed from one never copied here: the
        # list gets shorter by the shards this commit removed only.
        if n < listed and not set(t.names(listed)[n:]) <= gone:
            return None
    return n if n and set(fits) == set(t.names(n)) else None


def _set(split: dict, figures: list[ShardFigures | None], edited: bool, label: str, out: Followed) -> None:
    """List ``figures`` as the split's shards (None: a shard not here, whose length stays), and
    its ``numBytes`` when every shard is here and the split changed (``edited``, or its lengths)."""
    old = list(split["shardLengths"])
    sample = old[0] if old else "0"
    new = [old[i] if f is None else number_like(old[i] if i < len(old) else sample, f.records)
           for i, f in enumerate(figures)]
    what = []
    differ = sum(1 for a, b in zip(old, new) if _int(a) != _int(b))
    if differ or len(new) != len(old):
        split["shardLengths"] = new
        what.append(f"{len(old)} -> {len(new)} shards" if len(new) != len(old)
                    else f"{differ} shard length{'s' if differ != 1 else ''} changed")
        what.append(f"{sum(_int(v) or 0 for v in old)} -> {sum(_int(v) or 0 for v in new)} records")
        if "numShards" in split:
            split["numShards"] = number_like(split["numShards"], len(new))
    if (edited or what) and all(f is not None for f in figures):
        total = sum(f.data_bytes for f in figures if f is not None)
        if _int(split.get("numBytes")) != total:
            what.append(f"numBytes {split.get('numBytes', 0)} -> {total}")
            split["numBytes"] = number_like(split.get("numBytes", "0"), total)
    if what:
        out.changes.append(f"{label}: {', '.join(what)}")


def update(folder: str, shards: dict[str, ShardFigures], changed: Collection[str] | None = None,
           label: str | None = None, place: "Place | None" = None) -> list[str]:
    """Bring ``folder``'s ``dataset_info.json`` in step with ``shards`` (see ``follow``) and write
    it like a shard: a temporary file, fsync, rename, fsync of the folder, so a crash leaves the
    old file or the new one (in a bucket, ``place``: one PUT, which replaces the object whole).
    Returns what changed and what could not be kept in step, one line each, naming the file as
    ``label`` (default: its path); nothing when there is no such file."""
    path = os.path.join(folder, INFO)
    label = label or path
    mode = None
    try:
        if place is not None:
            data = place.read(path)
        else:
            with open(path, "rb") as f:
                mode = os.fstat(f.fileno()).st_mode & 0o7777
                data = f.read()
        info = json.loads(data)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return [f"{label}: not updated: cannot read it ({reason})"]
    if not isinstance(info, dict):
        return []
    done = follow(info, shards, changed)
    lines = [f"{label}: {line}" for line in done.changes + done.problems]
    if not done.changes:
        return lines
    text = (json.dumps(info, indent=2, ensure_ascii=False) + "\n").encode()
    try:
        if place is not None:
            place.write(path, text)
        else:
            # Its temporary file is named as a commit's, which a mount never shows and repair clears.
            durable.write_file(path, text, prefix=TMP_PREFIX, mode=mode)
    except OSError as exc:
        return [f"{label}: not updated ({exc.strerror or exc}): the shards are committed; the next commit "
                "or tfrfs repair of this folder updates it"]
    return lines


def after_commit(root: str, indexes: Iterable[ShardIndex], committed: Collection[str]) -> list[str]:
    """After a commit of the shards ``committed`` (paths relative to ``root``), the
    ``dataset_info.json`` of each of their folders follows every shard file there, as ``indexes``
    (the mount's, reloaded from the new files) count them. Runs after the shards are in place: a
    crash between leaves the file stale until the folder's next commit or ``tfrfs repair``."""
    notes = []
    for folder in sorted({os.path.dirname(rel) for rel in committed}):
        if not os.path.exists(os.path.join(root, folder, INFO)):
            continue   # not a TFDS folder: no file to keep in step, and no stat of every shard
        here: dict[str, ShardFigures] = {}
        for idx in indexes:
            name = os.path.basename(idx.shard.relpath)
            # A shard removed earlier in this mount stays among the indexes, hidden: ask the disk.
            if os.path.dirname(idx.shard.relpath) == folder and name not in here and os.path.exists(idx.shard.path):
                here[name] = figures_of(idx)
        changed = {os.path.basename(rel) for rel in committed if os.path.dirname(rel) == folder}
        notes += update(os.path.join(root, folder), here, changed, label=os.path.join(folder, INFO))
    return notes
