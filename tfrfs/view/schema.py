"""The dataset's schema (SPEC 5 ``.tfrfs/schema.json``, ``tfrfs inspect``) and what it tells the
editors: the kind a key already has across the dataset (SPEC 7), whether a value of a key ends in a
newline (SPEC 7 "Text"), the keys a shortened name may stand for (SPEC 3.1), and whether a key is
shown as raw pixels near a given shard.

It is the sum of the shards' tallies (``shardschema``): each is computed once, on all cores, kept
in the shard's index file (the local cache, and the index shipped beside it), and carried through
a commit by taking out the records it replaced and adding those it wrote. A writable mount builds
the missing ones in the background as soon as it is up, so the first edit rarely waits.

In a writable mount "the dataset" is the shards plus what is staged: the keys and kinds of staged
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
from typing import Any, Callable, Iterable

from tfrfs.format import codec
from tfrfs.index import schema_summary, shardschema
from tfrfs.index.shard_index import ShardIndex
from tfrfs.view.nodes import RecordId
from tfrfs.view.records import RecordStore
from tfrfs.index.running import Runner
from tfrfs.index.shardschema import Tally

log = logging.getLogger("tfrfs")

Progress = Callable[[int, int], None]    # (records done, records to read)


class Schema:
    """Per feature key across the dataset: kind, records holding it, value counts, how shown."""

    def __init__(self, store: RecordStore, save: Callable[[Any], None] | None = None,
                 runners: Callable[[bool], Runner] | None = None) -> None:
        self.store = store
        self.save = save                 # keeps a shard's index (with its tally) in the cache
        # makes the runner tallies are read on (``jobs.runner.scan_pool``; True: in the background,
        # its workers yield to other work); None: read in this process
        self.runners = runners
        self.progress: Progress | None = None
        self._summary: dict | None = None
        self._staged: dict[tuple[str, str], _Learned] = {}   # (table, key) -> what staged values tell
        # (table, key) -> staged records that hold an empty bytes_list of the key, written while
        # the key had no kind: "[]" tells none (SPEC 7), so they take the key's first kind learned
        self._tentative: dict[tuple[str, str], set[tuple[int, RecordId]]] = {}
        self._staged_read = False      # whether the journal's records were read into ``_staged``
        self._lock = threading.Lock()
        self._build = threading.Lock()   # one scan at a time; others wait for it
        self._background: threading.Thread | None = None
        self._stop = threading.Event()

    def forget(self) -> None:
        """The shards changed (a commit): add up again when next asked (the shards' tallies stay)."""
        with self._lock:
            self._summary = None
            self._staged.clear()
            self._tentative.clear()
            self._staged_read = False

    # -- the shards' tallies ----------------------------------------------------------

    def _tally(self, shard: int) -> Tally | None:
        t = self.store.shards[shard].tally
        return t if t is not None and t.kind == self.store.kinds[shard] else None

    def ready(self) -> bool:
        """Whether every shard's tally is at hand (nothing to read)."""
        return all(self._tally(n) is not None for n in range(len(self.store.shards)))

    def tallies(self, shards: Iterable[int] | None = None) -> list[Tally]:
        """The tallies of ``shards`` (all by default), reading those not known yet."""
        wanted = list(range(len(self.store.shards)) if shards is None else shards)
        for _ in range(3):   # a shard a commit replaced while it was read is read again
            if all(self._tally(n) is not None for n in wanted):
                break
            with self._build:
                missing = [n for n in wanted if self._tally(n) is None]
                if missing:
                    self._read(missing)
        return [self._tally(n) or Tally(self.store.kinds[n]) for n in wanted]

    def _read(self, shards: list[int]) -> None:
        store = self.store
        total = sum(store.shards[n].count for n in shards)
        started = time.monotonic()
        log.info("reading %d records of %d shard(s) for the schema (.tfrfs/schema.json, kinds of new keys)",
                 total, len(shards))
        local: list[tuple[int, ShardIndex]] = []
        jobs: list[shardschema.Job] = []
        here: list[int] = []
        for n in shards:
            idx = store.shards[n]
            reader = store.reader(n)
            fd = reader.fileno() if reader is not None else None
            if fd is None:
                here.append(n)
                continue
            try:
                stamp = shardschema.stamp_of(os.fstat(fd))
            except OSError:
                here.append(n)
                continue
            local.append((n, idx))
            jobs.append((idx.data_path, stamp, store.kinds[n], idx.offsets, idx.bad))
        done = [0]

        def report(records: int, _total: int) -> None:
            if self.progress is not None:
                self.progress(done[0] + records, total)
        if jobs:
            runner = self.runners(threading.current_thread() is self._background) if self.runners else None
            try:
                tallies = shardschema.scan_local(jobs, report, runner, self._stop)
            finally:
                if runner is not None:
                    runner.close()
            for (n, idx), tally in zip(local, tallies):
                if tally is None:
                    log.info("%s changed while its schema was read; it is read again", idx.shard.relpath)
                else:
                    self._keep(n, idx, tally)
            done[0] += sum(idx.count for _, idx in local)
        for n in here:
            if self._stop.is_set():
                raise shardschema.Stopped
            idx = store.shards[n]
            self._keep(n, idx, self._scan_here(n))
            done[0] += idx.count
            report(0, total)
        log.info("schema of %d records read in %.1fs", total, time.monotonic() - started)

    def _scan_here(self, shard: int) -> Tally:
        """A shard with no descriptor to share (a remote one), read through the mount's reader."""
        store = self.store
        idx = store.shards[shard]
        reader = store.reader(shard)
        if reader is None:
            return Tally(store.kinds[shard])
        records = shardschema.records_in(reader.pread, idx.offsets, 0, idx.count, idx.bad)
        return shardschema.scan_records(store.kinds[shard], records)

    def _keep(self, shard: int, idx: ShardIndex, tally: Tally) -> None:
        """``tally`` is of the file ``idx`` indexes: kept with it (and saved, while it is the file
        the mount shows)."""
        idx.tally = tally
        if self.save is not None and tally.kind == idx.detected_kind and self.store.shards[shard] is idx:
            self.save(idx)

    def build_in_background(self) -> None:
        """Read the missing tallies now, in a thread (a writable mount, once it is up)."""
        if self._background is not None or self.ready():
            return

        def run() -> None:
            try:
                self.tallies()
            except shardschema.Stopped:
                log.info("reading the schema stopped: the mount is closing")
            except Exception:  # noqa: BLE001 - the schema is read again when needed; say why
                log.exception("reading the schema in the background failed; it is read when first needed")
        self._background = threading.Thread(target=run, name="tfrfs-schema", daemon=True)
        self._background.start()

    def close(self) -> None:
        """Stop a read under way (the parts being read finish first)."""
        self._stop.set()
        thread = self._background
        if thread is not None and thread is not threading.current_thread():
            thread.join(60)

    # -- commits --------------------------------------------------------------------

    def change_of(self, shard: int | None, kind: str, removed: Iterable[bytes],
                  written: Iterable[bytes | memoryview]) -> Tally | None:
        """What a commit does to a shard's tally: ``removed`` records (original ones it replaces or
        drops) out, ``written`` records (fresh ones) in; None when the shard's tally is not known
        (then it is read again when needed)."""
        base = self._tally(shard) if shard is not None else Tally(kind)
        if base is None:
            return None
        scanner = shardschema.Scanner(base.kind)
        data: bytes | memoryview
        for data in removed:
            scanner.add_large(data, -1)
        for data in written:
            scanner.add_large(data)
        after = Tally(base.kind)
        after.add(base)
        after.add(scanner.flush())
        return after

    def committed(self, shard: int, tally: Tally | None) -> None:
        """Shard ``shard`` was written anew and holds what ``tally`` says (from ``change_of``)."""
        if tally is not None and tally.kind == self.store.kinds[shard]:
            self._keep(shard, self.store.shards[shard], tally)
        self.forget()

    # -- the summary ----------------------------------------------------------------

    def summary(self) -> dict:
        with self._lock:
            if self._summary is not None:
                return self._summary
        store = self.store
        tallies = self.tallies()
        shards = [{"shard": idx.shard.relpath, "records": idx.count, "kind": store.kinds[n],
                   "compression": idx.shard.compression} for n, idx in enumerate(store.shards)]
        tables = schema_summary.summarize(tallies, store.decode_raw)
        out: dict = {"shards": shards, "features": tables["features"]}
        if tables["feature_lists"]:
            out["feature_lists"] = tables["feature_lists"]
        with self._lock:
            self._summary = out
        return out

    def as_json(self) -> bytes:
        return (json.dumps(self.summary(), ensure_ascii=False, indent=2, sort_keys=True) + "\n").encode()

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

    def learn(self, msg: Any, section: str, key: str, where: tuple[int, RecordId] | None = None) -> None:
        """Take note of ``key``'s value in ``msg``, a record just staged (``where``: its shard and
        id) (a key it no longer holds stays known, with what it had). An empty bytes_list tells no
        kind: while the key has none, the record is noted as waiting for one (``take_waiting``)."""
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
            waits = where is not None and _tells_no_kind(value) and self.dataset_kind(key, section)[0] is None
            with self._lock:
                _learn_value(self._staged, "features", key, value)
                if waits:
                    assert where is not None
                    self._tentative.setdefault(("features", key), set()).add(where)

    def take_waiting(self, section: str, key: str) -> set[tuple[int, RecordId]]:
        """The staged records whose empty bytes_list of ``key`` was written while the key had no
        kind (noted by ``learn``, and found in the journal after a remount); forgotten here."""
        self._learned()
        with self._lock:
            return self._tentative.pop((_table(section), key), set())

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
            ch = store.layer(n)
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
                    value = codec.value_from_proto(feat)
                    _learn_value(self._staged, "features", key, value)
                    if _tells_no_kind(value):
                        # Waiting for a kind, if the key turns out to have none yet (take_waiting's
                        # caller checks the record again before it changes anything).
                        self._tentative.setdefault(("features", key), set()).add((n, rid))

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
                r, p = self._raw_tally(n, section, key)
                raw, plain = raw + r, plain + p
            if raw or plain:
                return raw >= plain
        return None

    def _raw_tally(self, shard: int, section: str, key: str) -> tuple[int, int]:
        """(records showing ``key`` as raw pixels, records holding it as another one bytes value)
        among the shard's original records."""
        store = self.store
        kind = store.kinds[shard]
        if not store.decode_raw or kind == "raw" or (kind == "sequence" and section != "context"):
            return 0, 0
        return schema_summary.raw_counts(self.tallies([shard])[0], key)


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


def _tells_no_kind(value: codec.Value) -> bool:
    """An empty bytes_list: what ``[]`` written for a key with no kind yet is staged as (SPEC 7)."""
    return value.kind == "bytes_list" and not value.values


def _learn_value(acc: dict[tuple[str, str], _Learned], table: str, key: str, value: codec.Value) -> None:
    learned = acc.setdefault((table, key), _Learned())   # a key known, even with no kind yet
    if not _tells_no_kind(value):
        learned.kinds.add(value.kind)
    learned.newline = learned.newline or _ends_in_newline(value)


def _learn_steps(acc: dict[tuple[str, str], _Learned], key: str, steps: list[codec.Value]) -> None:
    learned = acc.setdefault(("feature_lists", key), _Learned())
    learned.kinds.update(s.kind for s in steps)
    learned.newline = learned.newline or any(_ends_in_newline(s) for s in steps)
