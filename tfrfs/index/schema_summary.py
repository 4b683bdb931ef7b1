"""The dataset's schema (SPEC 5 ``schema.json``: its ``features`` and ``feature_lists``) from its
shards' tallies (``shardschema.Tally``): summed, never read from the records again."""

from __future__ import annotations

from typing import Iterable

from tfrfs.index.shardschema import RAW_SHOWN, TABLES, Tally


def summarize(tallies: Iterable[Tally], decode_raw: bool) -> dict[str, dict]:
    """``features`` and ``feature_lists`` of ``schema.json`` (SPEC 5), from the shards' tallies."""
    acc: dict[str, dict[str, dict]] = {t: {} for t in TABLES}
    for tally in tallies:
        for table, keys in tally.tables.items():
            out = acc[table]
            for key, rows in keys.items():
                e = out.get(key)
                if e is None:
                    e = out[key] = {"kinds": {}, "records": 0, "min": None, "max": None, "shown": {}, "newline": 0}
                for (kind, count, suffix, newline, raw), n in rows.items():
                    shown = RAW_SHOWN if raw and decode_raw else suffix
                    e["records"] += n
                    e["kinds"][kind] = e["kinds"].get(kind, 0) + n
                    e["shown"][shown] = e["shown"].get(shown, 0) + n
                    e["newline"] += n if newline else 0
                    e["min"] = count if e["min"] is None else min(e["min"], count)
                    e["max"] = count if e["max"] is None else max(e["max"], count)
    # Keys in order: the same summary whether a tally was read just now or loaded from a file.
    return {table: {key: _finish(e) for key, e in sorted(keys.items())} for table, keys in acc.items()}


def _finish(e: dict) -> dict:
    kinds = sorted(e["kinds"], key=lambda k: (-e["kinds"][k], k))
    return {"kind": kinds[0] if len(kinds) == 1 else kinds, "records": e["records"],
            "min_values": e["min"], "max_values": e["max"],
            "shown_as": sorted(e["shown"], key=lambda s: (-e["shown"][s], s)),
            # records holding a value that ends in a newline (SPEC 7 "Text" asks)
            "ending_in_newline": e["newline"]}


def raw_counts(tally: Tally, key: str) -> tuple[int, int]:
    """(records showing ``key`` as raw pixels, records holding it as another one bytes value)."""
    raw = plain = 0
    for (kind, count, _, _, is_raw), n in tally.tables["features"].get(key, {}).items():
        if kind == "bytes_list" and count == 1:
            if is_raw:
                raw += n
            else:
                plain += n
    return raw, plain
