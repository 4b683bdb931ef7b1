"""The dataset's schema (SPEC 5 ``.tfrfs/schema.json``, ``tfrfs inspect``) and what it tells the
editors: the kind a key already has across the dataset (SPEC 7), whether a value of a key ends in a
newline (SPEC 7 "Text"), the keys a shortened name may stand for (SPEC 3.1), and whether a key is
shown as raw pixels near a given shard.

All are computed by reading records through the record store, once, and kept until a commit. In a
writable mount "the dataset" is the shards plus what is staged: the keys and kinds of staged
records are learned once from the journal and then from each change as it is staged, and are kept
(even when the value that taught them is removed again) until the next commit, so a key made in
the mount keeps its kind through an editor's rename-away-and-write save as a shard's key does.
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
        self._staged: dict[tuple[str, str], _Learned] = {}   # (table, key) -> what staged values tell
        self._staged_read = False      # whether the journal's records were read into ``_staged``
        self._lock = threading.Lock()

    def forget(self) -> None:
        """The shards changed (a commit): compute again when next asked."""
        with self._lock:
            self._summary = None
            self._raw_tallies.clear()
            self._staged.clear()
            self._staged_read = False

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
        """(kind, shown as raw pixels) of ``key`` across the dataset, or (None, False) if it is new.
        A key no shard holds has the kind its staged values have (one kind, or none known)."""
        entry = self.summary().get(_table(section), {}).get(key)
        if not entry:
            learned = self._learned().get((_table(section), key))
            kind = next(iter(learned.kinds)) if learned is not None and len(learned.kinds) == 1 else None
            return (None if kind in (None, "mixed", "empty", "feature_list") else kind), False
        kind = entry["kind"] if isinstance(entry["kind"], str) else entry["kind"][0]
        raw = any("raw" in s for s in entry.get("shown_as", ()))
        return (None if kind in ("mixed", "empty", "feature_list") else kind), raw

    def ends_in_newline(self, key: str, section: str) -> bool:
        """Whether a value of ``key`` in the dataset (shards or staged) ends in a newline."""
        entry = self.summary().get(_table(section), {}).get(key)
        if entry and entry.get("ending_in_newline"):
            return True
        learned = self._learned().get((_table(section), key))
        return learned is not None and learned.newline

    def keys(self, section: str) -> set[str]:
        """Every key of ``section`` the dataset holds (shards or staged)."""
        table = _table(section)
        return set(self.summary().get(table, {})) | {k for t, k in self._learned() if t == table}

    def learn(self, msg: Any, section: str, key: str) -> None:
        """Take note of ``key``'s value in ``msg``, a record just staged (a key it no longer holds
        stays known, with what it had)."""
        if section == "feature_lists":
            lists = msg.feature_lists.feature_list
            steps = [codec.value_from_proto(f) for f in lists[key].feature] if key in lists else None
            with self._lock:
                if steps is not None:
                    _learn_steps(self._staged, key, steps)
            return
        feats = msg.context.feature if section == "context" else msg.features.feature
        if key in feats:
            value = codec.value_from_proto(feats[key])
            with self._lock:
                _learn_value(self._staged, "features", key, value)

    def _learned(self) -> dict[tuple[str, str], "_Learned"]:
        """What the staged records tell, read from the journal once (after that, ``learn`` keeps
        it up to date)."""
        with self._lock:
            if not self._staged_read:
                self._read_staged()
                self._staged_read = True
            return self._staged

    def _read_staged(self) -> None:
        store = self.store
        for n in range(len(store.shards)):
            ch = store.changes(n)
            if ch is None or ch.removed or store.kinds[n] == "raw":
                continue
            rids: list[int | str] = [*sorted(ch.edited - ch.deleted), *ch.added_names()]
            for rid in rids:
                try:
                    msg = store.parse(n, store.record_bytes(n, rid)[0])
                except Exception:  # noqa: BLE001 - a record that does not parse teaches nothing
                    continue
                if store.kinds[n] == "sequence":
                    feats = msg.context.feature
                    for key, flist in msg.feature_lists.feature_list.items():
                        _learn_steps(self._staged, key, [codec.value_from_proto(f) for f in flist.feature])
                else:
                    feats = msg.features.feature
                for key, feat in feats.items():
                    _learn_value(self._staged, "features", key, codec.value_from_proto(feat))

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


class _Learned:
    """What the staged values of one key tell: their kinds, and whether one ends in a newline."""

    __slots__ = ("kinds", "newline")

    def __init__(self) -> None:
        self.kinds: set[str] = set()
        self.newline = False


def _table(section: str) -> str:
    return "feature_lists" if section == "feature_lists" else "features"


def _ends_in_newline(value: codec.Value) -> bool:
    return value.kind == "bytes_list" and any(v.endswith(b"\n") for v in value.values)


def _learn_value(acc: dict[tuple[str, str], _Learned], table: str, key: str, value: codec.Value) -> None:
    learned = acc.setdefault((table, key), _Learned())
    learned.kinds.add(value.kind)
    learned.newline = learned.newline or _ends_in_newline(value)


def _learn_steps(acc: dict[tuple[str, str], _Learned], key: str, steps: list[codec.Value]) -> None:
    learned = acc.setdefault(("feature_lists", key), _Learned())
    learned.kinds.update(s.kind for s in steps)
    learned.newline = learned.newline or any(_ends_in_newline(s) for s in steps)


def _tally(acc: dict[str, dict], features: Mapping, decode_raw: bool) -> None:
    values = {key: codec.value_from_proto(feat) for key, feat in features.items()}
    shapes = codec.raw_shapes(values) if decode_raw else {}
    for key, value in values.items():
        shown = "raw pixels .png" if key in shapes else codec.suffix_of(value)
        _count(_entry(acc, key), value.kind, len(value.values), shown, _ends_in_newline(value))


def _tally_lists(acc: dict[str, dict], lists: Mapping[str, Any]) -> None:
    for key, flist in lists.items():
        steps = [codec.value_from_proto(f) for f in flist.feature]
        kinds = {s.kind for s in steps}
        _count(_entry(acc, key), kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "empty"), len(steps),
               codec.render_feature_list(steps).suffix, any(_ends_in_newline(s) for s in steps))


def _entry(acc: dict[str, dict], key: str) -> dict:
    return acc.setdefault(key, {"kinds": {}, "records": 0, "min_values": None, "max_values": None, "shown": {},
                                "newline": 0})


def _count(entry: dict, kind: str, n: int, suffix: str, newline: bool) -> None:
    entry["records"] += 1
    entry["newline"] += newline
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
                    "shown_as": sorted(e["shown"], key=lambda s: -e["shown"][s]),
                    # records holding a value that ends in a newline (SPEC 7 "Text" asks)
                    "ending_in_newline": e["newline"]}
    return out
