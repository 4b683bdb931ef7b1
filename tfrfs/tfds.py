"""TFDS metadata kept in step with the shards it lists (``dataset_info.json``, beside them).

A TFDS split lists its shards by a file name template (``filepathTemplate``, by default
``{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}``), their record counts (``shardLengths``) and
the bytes of its records (``numBytes``: the records' data, without framing). When a shard is
rewritten with another number of records, both must follow, or TFDS reads the split wrong.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from . import durable

INFO = "dataset_info.json"
DEFAULT_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"


@dataclass(frozen=True)
class ShardFigures:
    """A shard's records as a split counts them."""

    records: int
    data_bytes: int       # the records' data, without framing


def _pattern(info: dict, split: dict) -> re.Pattern[str]:
    template = split.get("filepathTemplate") or DEFAULT_TEMPLATE
    fields = {"{DATASET}": re.escape(str(info.get("name", ""))), "{SPLIT}": re.escape(str(split.get("name", ""))),
              "{FILEFORMAT}": re.escape(str(info.get("fileFormat") or "tfrecord")),
              "{SHARD_X_OF_Y}": r"(?P<x>\d+)-of-(?P<y>\d+)", "{SHARD_INDEX}": r"(?P<x>\d+)"}
    parts = re.split(r"(\{[A-Z_]+\})", template)
    return re.compile("".join(fields.get(p, re.escape(p)) for p in parts))


def place(info: dict, name: str) -> tuple[dict, int] | None:
    """(split, shard number) of the shard file ``name`` in ``info``, or None when no split lists it."""
    for split in info.get("splits") or ():
        lengths = split.get("shardLengths")
        if not isinstance(split, dict) or not isinstance(lengths, list):
            continue
        m = _pattern(info, split).fullmatch(name)
        if m is None:
            continue
        x = int(m.group("x"))
        y = int(m.group("y")) if "y" in m.groupdict() and m.group("y") else len(lengths)
        if x < len(lengths) and y == len(lengths):
            return split, x
    return None


def _like(old: object, value: int) -> object:
    """``value`` in the type the file used (TFDS writes counts as strings)."""
    return str(value) if isinstance(old, str) else value


def update(folder: str, changed: dict[str, ShardFigures], known: dict[str, ShardFigures]) -> list[str]:
    """Bring ``folder``'s ``dataset_info.json`` in step with the shards in ``changed`` (file name ->
    new figures). ``known``: figures of other shards in the folder, so a split's ``numBytes`` can be
    counted anew when all its shards are known (else it moves by the change). Returns what was done,
    or why it could not be, one line each; nothing when there is no such file or it lists none."""
    path = os.path.join(folder, INFO)
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        return [f"{path}: not updated: cannot read it ({exc})"]
    if not isinstance(info, dict):
        return []
    notes = []
    touched: set[int] = set()
    for name, new in changed.items():
        where = place(info, name)
        if where is None:
            continue
        split, x = where
        old = split["shardLengths"][x]
        try:
            old_records = int(old)
        except (TypeError, ValueError):
            old_records = None
        split["shardLengths"][x] = _like(old, new.records)
        touched.add(id(split))
        notes.append(f"{INFO}: split {split.get('name')!r} shard {x}: {old_records} -> {new.records} records")
    if not touched:
        return []
    for split in info["splits"]:
        if id(split) not in touched or "numBytes" not in split:
            continue
        figures = {**known, **changed}
        shards = {}
        for name, fig in figures.items():
            where = place(info, name)
            if where is not None and where[0] is split:
                shards[where[1]] = fig
        if len(shards) == len(split["shardLengths"]):
            split["numBytes"] = _like(split["numBytes"], sum(f.data_bytes for f in shards.values()))
    try:
        durable.write_file(path, (json.dumps(info, indent=2, ensure_ascii=False) + "\n").encode())
    except OSError as exc:
        return [f"{path}: not updated: {exc.strerror or exc}"]
    return notes
