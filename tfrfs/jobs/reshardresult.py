"""What ``tfrfs reshard`` (and ``tfrfs.ray.write``) publishes once every job is done, from the
jobs' figures: the new dataset's manifest and schema (SPEC 1.2, 5), its ``dataset_info.json``
(TFDS splits followed), and what was dropped, in SOURCE's order (SPEC 6)."""

from __future__ import annotations

import json

from tfrfs.index import shardschema
from tfrfs.index.schema_summary import summarize
from tfrfs.index import tfds_info as tfds
from tfrfs.jobs.reshardplan import Plan


def manifest_body(done: list[dict], extra_files: dict[str, tuple[int, int]], source_tallies: list | None = None) -> dict:
    """The new dataset's manifest (SPEC 1.2), from the jobs' figures."""
    import time
    shards = [{"path": d["name"], "size": d["size"], "identity": d["identity"], "mtime_ns": d["mtime_ns"],
               "compression": d["compression"], "kind": d["kind"], "count": d["count"],
               "stream_size": d["stream_size"], "problems": [], "bad": d["bad"], "gaps": [],
               "index": {"file": d["index"]["file"], "size": d["index"]["size"], "crc32c": d["index"]["crc32c"]}}
              for d in done]
    files = {d["index"]["file"]: {"path": d["index"]["file"], "size": d["index"]["size"],
                                  "mtime_ns": d["index"]["mtime_ns"]} for d in done}
    for name, (size, mtime_ns) in extra_files.items():
        files[name] = {"path": name, "size": size, "mtime_ns": mtime_ns}
    return {"tfrfs_manifest": 1, "shards": shards, "files": [files[k] for k in sorted(files)],
            "dirs": [{"path": "", "mtime_ns": time.time_ns()}], "schema": schema_summary(done, source_tallies)}


def schema_summary(done: list[dict], source_tallies: list | None = None) -> dict | None:
    """The new dataset's schema (SPEC 5), merged from the jobs' tallies (else from SOURCE's shards':
    the same records); None when one is unknown."""
    tallies = [shardschema.Tally.from_json(d["tally"]) if d.get("tally") else None for d in done]
    if any(t is None for t in tallies):
        if source_tallies is None:
            return None
        tallies = source_tallies
    tables = summarize([t for t in tallies if t is not None], True)
    out: dict = {"shards": [{"shard": d["name"], "records": d["count"], "kind": d["kind"],
                             "compression": d["compression"]} for d in done],
                 "features": tables["features"]}
    if tables["feature_lists"]:
        out["feature_lists"] = tables["feature_lists"]
    return out


def new_info(plan: Plan, done: list[dict]) -> tuple[bytes | None, list[str]]:
    """The new ``dataset_info.json`` (each split's ``shardLengths`` and ``numBytes``), and notes."""
    if plan.info is None:
        return None, []
    figures = {d["name"]: tfds.ShardFigures(d["count"], d["data_bytes"]) for d in done}
    followed = tfds.follow(plan.info, figures, None)
    for g in plan.groups:   # numBytes always follows: the records may have been dropped or not
        if g.split is not None and all(n in figures for n in g.names):
            total = sum(figures[n].data_bytes for n in g.names)
            g.split["numBytes"] = tfds.number_like(g.split.get("numBytes", "0"), total)
    return (json.dumps(plan.info, indent=2, ensure_ascii=False) + "\n").encode(), followed.problems


def order_problems(plan: Plan, done: list[dict]) -> list[tuple[str, dict]]:
    """Everything dropped, once each, in SOURCE's order: what the indexes found, and the records
    whose data checksums the jobs found failing."""
    seen: dict[tuple[str, int], dict] = {}
    number = {s.relpath: n for n, s in enumerate(plan.sources)}
    for rel, p in plan.problems:
        seen.setdefault((rel, p["offset"]), p)
    for d in done:
        for p in d.get("dropped", ()):
            rel = p.get("shard") or ""
            seen.setdefault((rel, p["offset"]), p)
    return [(rel, p) for (rel, _), p in sorted(seen.items(), key=lambda kv: (number.get(kv[0][0], -1), kv[0][1]))]


def sizes(done: list[dict]) -> tuple[int, int]:
    return sum(d["count"] for d in done), sum(d["size"] for d in done)

