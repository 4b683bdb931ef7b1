"""The dataset's schema (SPEC 5 ``.tfrfs/schema.json``, ``tfrfs inspect``) and what it tells the
editors: the kind a key already has across the dataset (SPEC 7), and whether a key is shown as raw
pixels near a given shard.

Both are computed by reading records through the record store, once, and kept until a commit.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Iterator, Mapping

from . import codec
from .records import RecordStore

log = logging.getLogger("tfrfs")


class Schema:
    """Per feature key across the dataset: kind, records holding it, value counts, how shown."""

    def __init__(self, store: RecordStore) -> None:
        self.store = store
        self._summary: dict | None = None
        self._raw_tallies: dict[tuple[int, str], dict[str, tuple[int, int]]] = {}
        self._lock = threading.Lock()

    def forget(self) -> None:
        """The shards changed (a commit): compute again when next asked."""
        with self._lock:
            self._summary = None
            self._raw_tallies.clear()

    def summary(self) -> dict:
        with self._lock:
            if self._summary is None:
                self._summary = self._compute()
            return self._summary

    def as_json(self) -> bytes:
        return (json.dumps(self.summary(), ensure_ascii=False, indent=2, sort_keys=True) + "\n").encode()

    def _compute(self) -> dict:
        store = self.store
        started = time.monotonic()
        total = sum(idx.count for idx in store.shards)
        # It reads every record: say so, as the mount answers nothing else meanwhile.
        log.info("reading all %d records for the dataset's schema (.tfrfs/schema.json, kinds of keys)", total)
        features: dict[str, dict] = {}
        lists: dict[str, dict] = {}
        shards = []
        for n, idx in enumerate(store.shards):
            kind = store.kinds[n]
            shards.append({"shard": idx.shard.relpath, "records": idx.count, "kind": kind,
                           "compression": idx.shard.compression})
            for msg in self._messages(n):
                if kind == "sequence":
                    _tally(features, msg.context.feature, store.decode_raw)
                    _tally_lists(lists, msg.feature_lists.feature_list)
                else:
                    _tally(features, msg.features.feature, store.decode_raw)
        log.info("schema of %d records read in %.1fs", total, time.monotonic() - started)
        out: dict = {"shards": shards, "features": _finish(features)}
        if lists:
            out["feature_lists"] = _finish(lists)
        return out

    def _messages(self, shard: int) -> Iterator[Any]:
        """The shard's original records, parsed (those that do not parse are skipped: they are
        reported when opened); nothing for a raw shard."""
        store = self.store
        if store.kinds[shard] == "raw":
            return
        idx = store.shards[shard]
        for i in range(idx.count):
            if i in idx.bad:
                continue
            data, _ = store.original(shard, i)
            try:
                yield store.parse(shard, data)
            except Exception:  # noqa: BLE001 - protobuf raises several types
                continue

    # -- what the editors ask -------------------------------------------------------

    def dataset_kind(self, key: str, section: str) -> tuple[str | None, bool]:
        """(kind, shown as raw pixels) of ``key`` across the dataset, or (None, False) if it is new."""
        table = self.summary().get("feature_lists" if section == "feature_lists" else "features", {})
        entry = table.get(key)
        if not entry:
            return None, False
        kind = entry["kind"] if isinstance(entry["kind"], str) else entry["kind"][0]
        raw = any("raw" in s for s in entry.get("shown_as", ()))
        return (None if kind in ("mixed", "empty", "feature_list") else kind), raw

    def raw_nearby(self, shard: int, key: str, section: str) -> bool | None:
        """Whether the records nearest to ``shard`` show ``key`` as raw pixels: its own shard's
        records if any hold the key as one bytes value, else those of the shards in its folder;
        None if none of them hold it.

        One key can be raw pixels in one shard and an encoded PNG in another (the sample's
        ``image/encoded``). The dataset-wide answer would decode every PNG copied into a new
        record, so ``cp -r`` of an Object Detection record would store raw pixels where its PNG
        bytes were. A record copied in arrives a file at a time, height and width perhaps after
        the image, so its neighbours are the only evidence at hand.
        """
        shards = self.store.shards
        folder = os.path.dirname(shards[shard].shard.relpath)
        tiers = ([shard], [n for n, idx in enumerate(shards) if os.path.dirname(idx.shard.relpath) == folder])
        for tier in tiers:
            raw = plain = 0
            for n in tier:
                r, p = self._raw_tally(n, section).get(key, (0, 0))
                raw, plain = raw + r, plain + p
            if raw or plain:
                return raw >= plain
        return None

    def _raw_tally(self, shard: int, section: str) -> dict[str, tuple[int, int]]:
        """Per key: (records showing it as raw pixels, records holding it as another one bytes value),
        over the shard's original records (computed once per shard; a commit forgets them)."""
        cache_key = (shard, section)
        tally = self._raw_tallies.get(cache_key)
        if tally is not None:
            return tally
        tally = {}
        store = self.store
        kind = store.kinds[shard]
        if store.decode_raw and store.reader(shard) is not None:
            for msg in self._messages(shard):
                if kind == "sequence":
                    feats = msg.context.feature if section == "context" else {}
                else:
                    feats = msg.features.feature
                values = {k: codec.value_from_proto(f) for k, f in feats.items()}
                shapes = codec.raw_shapes(values)
                for k, v in values.items():
                    if v.kind == "bytes_list" and len(v.values) == 1:
                        r, p = tally.get(k, (0, 0))
                        tally[k] = (r + 1, p) if k in shapes else (r, p + 1)
        self._raw_tallies[cache_key] = tally
        return tally


def _tally(acc: dict[str, dict], features: Mapping, decode_raw: bool) -> None:
    values = {key: codec.value_from_proto(feat) for key, feat in features.items()}
    shapes = codec.raw_shapes(values) if decode_raw else {}
    for key, value in values.items():
        shown = "raw pixels .png" if key in shapes else codec.suffix_of(value)
        _count(_entry(acc, key), value.kind, len(value.values), shown)


def _tally_lists(acc: dict[str, dict], lists: Mapping[str, Any]) -> None:
    for key, flist in lists.items():
        steps = [codec.value_from_proto(f) for f in flist.feature]
        kinds = {s.kind for s in steps}
        _count(_entry(acc, key), kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "empty"), len(steps),
               codec.render_feature_list(steps).suffix)


def _entry(acc: dict[str, dict], key: str) -> dict:
    return acc.setdefault(key, {"kinds": {}, "records": 0, "min_values": None, "max_values": None, "shown": {}})


def _count(entry: dict, kind: str, n: int, suffix: str) -> None:
    entry["records"] += 1
    entry["kinds"][kind] = entry["kinds"].get(kind, 0) + 1
    entry["shown"][suffix] = entry["shown"].get(suffix, 0) + 1
    entry["min_values"] = n if entry["min_values"] is None else min(entry["min_values"], n)
    entry["max_values"] = n if entry["max_values"] is None else max(entry["max_values"], n)


def _finish(acc: dict[str, dict]) -> dict[str, dict]:
    out = {}
    for key, e in acc.items():
        kinds = sorted(e["kinds"], key=lambda k: -e["kinds"][k])
        out[key] = {"kind": kinds[0] if len(kinds) == 1 else kinds, "records": e["records"],
                    "min_values": e["min_values"], "max_values": e["max_values"],
                    "shown_as": sorted(e["shown"], key=lambda s: -e["shown"][s])}
    return out
