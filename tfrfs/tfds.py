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
from .index import TMP_PREFIX

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


def update(folder: str, shards: dict[str, ShardFigures]) -> list[str]:
    """Bring ``folder``'s ``dataset_info.json`` in step with ``shards`` (file name -> what it holds):
    their splits' ``shardLengths``, and the ``numBytes`` of a split whose counts changed, where every
    shard of it is known (a split that is in step is left as it is).
    Returns what changed, or why it could not be written, one line each; nothing when there is no
    such file, it lists none of them, or it is in step already."""
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
    by_split: dict[int, dict[int, ShardFigures]] = {}
    moved: set[int] = set()      # splits whose record counts changed
    for name, new in shards.items():
        where = place(info, name)
        if where is None:
            continue
        split, x = where
        by_split.setdefault(id(split), {})[x] = new
        old = split["shardLengths"][x]
        if str(old) != str(new.records):
            split["shardLengths"][x] = _like(old, new.records)
            moved.add(id(split))
            notes.append(f"{INFO}: split {split.get('name')!r} shard {x}: {old} -> {new.records} records")
    for split in info["splits"]:
        known = by_split.get(id(split), {})
        if id(split) in moved and "numBytes" in split and known and len(known) == len(split["shardLengths"]):
            total = sum(f.data_bytes for f in known.values())
            if str(split["numBytes"]) != str(total):
                split["numBytes"] = _like(split["numBytes"], total)
                notes.append(f"{INFO}: split {split.get('name')!r}: numBytes {total}")
    if not notes:
        return []
    try:
        # Its temporary file is named as a commit's, which a mount never shows and repair clears.
        durable.write_file(path, (json.dumps(info, indent=2, ensure_ascii=False) + "\n").encode(),
                           prefix=TMP_PREFIX)
    except OSError as exc:
        return [f"{path}: not updated: {exc.strerror or exc}"]
    return notes
