"""One shard's part of the schema (SPEC 5 ``schema.json``, SPEC 7 kinds of new keys): what its
records hold, tallied so that shards add up to the dataset and a commit can take records out and
put records in without reading the shard again.

A ``Tally`` counts, per table (``features``: an Example's features or a SequenceExample's context;
``feature_lists``) and key, the records holding the key by the *row* they give: the value's kind,
its number of values (steps, for a feature list), the suffix it is shown with when not taken for
raw pixels, whether a value ends in a newline, and whether it is a raw pixel array (SPEC 3.3).
Rows are few (most keys give one or a handful), so a tally is small and exact: sums, minimum and
maximum all follow from it, and removing a record is adding it with weight -1.

The scan reads each record one level deep (``proto.ShallowExample``) and looks at a feature's
bytes only the first time they are seen in a shard (numeric lists of the usual packed encoding
are counted from their bytes directly). It runs on the runner it is given (every core, shards
split in parts), or here.
"""

from __future__ import annotations

import bisect
import os
import struct
import threading
import time
from array import array
from typing import Any, Callable, Iterable, Iterator

import crc32c

from tfrfs.format import bulk, codec
from tfrfs.index import idxfile
from tfrfs.index.running import Runner
from tfrfs.format import proto
from tfrfs.format import record_kinds
from tfrfs.format import shown_as
from tfrfs.format import wire

VERSION = 1
TABLES = ("features", "feature_lists")
RAW_SHOWN = "raw pixels .png"
PART_RECORDS = 250_000     # records in one task of the scan
LARGE = 1 << 20            # a record this long is read by spans: its large values are never copied
_SMALL_FEATURE = 1 << 16   # ... features up to this long are copied out to be read as usual
_MEMO_VALUE = 256          # feature bytes up to this long are remembered per key ...
_MEMO_KEYS = 4096          # ... this many per key
_CHUNK = 8 << 20           # bytes of records read at once
_HIGH = bytes(range(0x80))
_FOOTER = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
_LENGTH = struct.Struct("<Q")  # delete these to keep only bytes with the varint continuation bit

# A row: (kind, values, suffix when not raw, ends in a newline, raw pixels).
Row = tuple[str, int, str, bool, bool]


class Tally:
    """Records of a shard by what they hold (see the module's docstring)."""

    __slots__ = ("kind", "records", "skipped", "tables")

    def __init__(self, kind: str) -> None:
        self.kind = kind            # the record kind the records were read as
        self.records = 0            # records tallied
        self.skipped = 0            # records that did not parse (reported when opened)
        self.tables: dict[str, dict[str, dict[Row, int]]] = {t: {} for t in TABLES}

    def add(self, other: "Tally", weight: int = 1) -> None:
        self.records += weight * other.records
        self.skipped += weight * other.skipped
        for table, keys in other.tables.items():
            mine = self.tables[table]
            for key, rows in keys.items():
                for row, n in rows.items():
                    _count(mine, key, row, weight * n)

    def to_json(self) -> dict:
        return {"v": VERSION, "records_as": self.kind, "records": self.records, "skipped": self.skipped,
                "tables": {t: {k: [[*row, n] for row, n in sorted(rows.items())] for k, rows in keys.items()}
                           for t, keys in self.tables.items() if keys}}

    @classmethod
    def from_json(cls, data: Any) -> "Tally | None":
        """The tally saved by ``to_json``, or None when ``data`` is not one of this version."""
        try:
            if data.get("v") != VERSION:
                return None
            tally = cls(str(data["records_as"]))
            tally.records, tally.skipped = int(data["records"]), int(data["skipped"])
            for table, keys in data.get("tables", {}).items():
                if table not in TABLES:
                    return None
                tally.tables[table] = {str(k): {(str(r[0]), int(r[1]), str(r[2]), bool(r[3]), bool(r[4])): int(r[5])
                                                for r in rows} for k, rows in keys.items()}
            return tally
        except (AttributeError, KeyError, TypeError, ValueError, IndexError):
            return None


# --- reading records -------------------------------------------------------------------------


class Scanner:
    """Tallies records of one kind; remembers what short feature values give.

    Records are first counted by the whole of what they give (most records of a shard give the
    same), then spread over their keys (``flush``): one dictionary update per record.
    """

    def __init__(self, kind: str) -> None:
        self.tally = Tally(kind)
        self._memo: dict[str, dict[bytes, Row]] = {}
        self._lists: dict[str, dict[bytes, Row]] = {}
        self._records: dict[tuple, int] = {}    # (features' rows, lists' rows) -> weight

    def add(self, data: bytes, weight: int = 1) -> None:
        """Count one record (``weight`` -1: take it out)."""
        kind = self.tally.kind
        if kind == "raw":
            self.tally.records += weight
            return
        try:
            message = record_kinds.decode(data, kind, shallow=True)
            if kind == "sequence":
                flists = message.feature_lists.feature_list
                gives = (self._features(message.context.feature),
                         tuple([(key, self._list_row(key, flists[key])) for key in flists]))
            else:
                gives = (self._features(message.features.feature), ())
        except Exception:  # noqa: BLE001 - Unparsable, or a feature that does not; reported when opened
            self.tally.skipped += weight
            return
        records = self._records
        records[gives] = records.get(gives, 0) + weight
        if len(records) > 8192:
            self.flush()

    def add_large(self, data: bytes | memoryview, weight: int = 1) -> None:
        """Count one record that may be large (a staged record mapped from its file, a record of
        a shard with a large image): one of ``LARGE`` bytes or more is read by its features' spans,
        so a value of a gigabyte is looked at where it lies, never copied."""
        if len(data) < LARGE or self.tally.kind != "example":
            self.add(bytes(data) if isinstance(data, memoryview) else data, weight)
            return
        view = memoryview(data)
        spans = wire.feature_spans(view)
        if spans is None:
            self.add(bytes(view), weight)   # an unusual encoding: protobuf decides
            return
        feats = _Spans(view, spans)
        try:
            rows = []
            for key in spans:
                start, end = spans[key]
                if end - start <= _SMALL_FEATURE:
                    value = feats[key]
                    row = _numeric_row(value) or _feature_row(value)
                else:
                    try:
                        row = _large_feature_row(view, start, end)
                    except ValueError:   # not the usual encoding: protobuf decides
                        row = _feature_row(bytes(view[start:end]))
                rows.append((key, row))
            if any(row[0] == "bytes_list" and row[1] == 1 for _, row in rows):
                rows = _with_raw(feats, rows)
        except Exception:  # noqa: BLE001 - as ``add``: a record that does not parse
            self.tally.skipped += weight
            return
        gives = (tuple(rows), ())
        self._records[gives] = self._records.get(gives, 0) + weight

    def add_counted(self, gives: dict[tuple, int]) -> None:
        """Records counted elsewhere (``bulk.tally``), by what they give."""
        records = self._records
        for key, n in gives.items():
            records[key] = records.get(key, 0) + n
        if len(records) > 8192:
            self.flush()

    def flush(self) -> Tally:
        """The tally, with every record counted so far spread over its keys."""
        tally = self.tally
        tables = tally.tables
        for (rows, lists), weight in self._records.items():
            if not weight:
                continue
            tally.records += weight
            for table, pairs in (("features", rows), ("feature_lists", lists)):
                keys = tables[table]
                for key, row in pairs:
                    _count(keys, key, row, weight)
        self._records.clear()
        return tally

    def _features(self, feats: Any) -> tuple:
        out = []
        memo = self._memo
        one_bytes = sized = False
        for key in feats:
            value = feats[key]
            if len(value) <= _MEMO_VALUE:
                seen = memo.get(key)
                if seen is None:
                    seen = memo[key] = {}
                row = seen.get(value)
                if row is None:
                    row = _numeric_row(value) or _feature_row(value)
                    if len(seen) < _MEMO_KEYS:
                        seen[value] = row
            else:   # a long value (text, an image) is seldom seen twice: not hashed to look it up
                row = _feature_row(value)
            if row[1] == 1 and row[0] == "bytes_list":
                one_bytes = True
            if key.endswith("height"):
                sized = True
            out.append((key, row))
        if one_bytes and sized:   # raw pixels need a PREFIXheight (SPEC 3.3)
            out = _with_raw(feats, out)
        return tuple(out)

    def _list_row(self, key: str, value: bytes) -> Row:
        seen = self._lists.setdefault(key, {})
        row = seen.get(value)
        if row is None:
            steps = [codec.value_from_proto(f) for f in proto.FeatureList.FromString(value).feature]
            kinds = {s.kind for s in steps}
            kind = kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "empty")
            row = (kind, len(steps), shown_as.steps_suffix(steps), any(_ends_in_newline(s) for s in steps), False)
            if len(value) <= _MEMO_VALUE and len(seen) < _MEMO_KEYS:
                seen[value] = row
        return row


def _count(keys: dict[str, dict[Row, int]], key: str, row: Row, n: int) -> None:
    """Add ``n`` records (taken out when negative) to ``key``'s ``row``; what reaches zero goes."""
    acc = keys.get(key)
    if acc is None:
        acc = keys[key] = {}
    left = acc.get(row, 0) + n
    if left:
        acc[row] = left
    else:
        acc.pop(row, None)
        if not acc:
            del keys[key]


def _numeric_row(value: bytes) -> Row | None:
    """The row of a Feature holding a packed int64 or float list under 128 bytes (the encoding
    protobuf writes for most numeric features), read from its bytes; else None."""
    size = len(value)
    if size < 2 or value[1] != size - 2 or size > 129:
        return None
    tag = value[0]
    if size == 2:
        if tag == 0x1A:
            return ("int64_list", 0, shown_as.JSON, False, False)
        if tag == 0x12:
            return ("float_list", 0, shown_as.JSON, False, False)
        return None
    if size < 4 or value[2] != 0x0A or value[3] != size - 4:
        return None
    if tag == 0x1A:
        body = value[4:]
        if body and body[-1] & 0x80:
            return None
        return ("int64_list", len(body) - len(body.translate(None, _HIGH)), shown_as.JSON, False, False)
    if tag == 0x12 and (size - 4) % 4 == 0:
        return ("float_list", (size - 4) // 4, shown_as.JSON, False, False)
    return None


def _one_bytes_value(data: bytes) -> tuple[int, int] | None:
    """``wire.single_bytes_value`` of a whole Feature, for the values under 16 KiB that text
    features hold, with the varints read inline (it runs once per long value of every record)."""
    size = len(data)
    if size < 4 or data[0] != 0x0A:
        return None
    b = data[1]
    if b < 0x80:
        pos, outer = 2, b
    elif size > 4 and data[2] < 0x80:
        pos, outer = 3, (b & 0x7F) | data[2] << 7
    else:
        return wire.single_bytes_value(data, 0, size)
    if pos + outer != size or data[pos] != 0x0A:
        return None
    b = data[pos + 1]
    if b < 0x80:
        start, inner = pos + 2, b
    elif pos + 2 < size and data[pos + 2] < 0x80:
        start, inner = pos + 3, (b & 0x7F) | data[pos + 2] << 7
    else:
        return wire.single_bytes_value(data, 0, size)
    return (start, size) if start + inner == size else None


def _feature_row(data: bytes) -> Row:
    span = _one_bytes_value(data)
    if span is not None:
        # One bytes value in the usual encoding (text, an image): read where it lies, as the
        # renderer would show it, without parsing it into a message and a Value (a third of
        # the time a 2 KB text record takes).
        one = data[span[0]:span[1]]
        return ("bytes_list", 1, shown_as.single_suffix(one), one.endswith(b"\n"), False)
    value = codec.value_from_proto(proto.Feature.FromString(data))
    return (value.kind, len(value.values), shown_as.suffix_of(value), _ends_in_newline(value), False)


def _with_raw(feats: Any, rows: list[tuple[str, Row]]) -> list[tuple[str, Row]]:
    """``rows`` with each one-value bytes feature that is a raw pixel array marked so (SPEC 3.3:
    the record's PREFIXheight and PREFIXwidth say so)."""
    found: dict[str, codec.Value | None] = {}

    def get(key: str) -> codec.Value | None:
        if key not in found:
            found[key] = codec.value_from_proto(proto.Feature.FromString(feats[key])) if key in feats else None
        return found[key]
    out = []
    for key, row in rows:
        if row[0] == "bytes_list" and row[1] == 1:
            prefix = key[:key.rfind("/") + 1]
            if prefix + "height" in feats and prefix + "width" in feats:
                feature = feats[key]
                span = wire.single_bytes_value(feature, 0, len(feature))
                if span is not None and shown_as.raw_shape(key, span[1] - span[0], get) is not None:
                    row = (row[0], row[1], row[2], row[3], True)
        out.append((key, row))
    return out


class _Spans:
    """A large record's features by key, as ``_with_raw`` asks for them: the bytes of a small
    feature, a view of a large one."""

    def __init__(self, view: memoryview, spans: dict[str, tuple[int, int]]) -> None:
        self.view, self.spans = view, spans

    def __contains__(self, key: object) -> bool:
        return key in self.spans

    def __getitem__(self, key: str) -> Any:
        start, end = self.spans[key]
        part = self.view[start:end]
        return bytes(part) if end - start <= _SMALL_FEATURE else part


def _large_feature_row(view: memoryview, start: int, end: int) -> Row:
    """The row of a large ``Feature`` read where it lies (at most a chunk of a value at a time)."""
    lists = list(wire.fields(view, start, end))
    if len(lists) != 1:
        return _feature_row(bytes(view[start:end]))   # not one list: leave it to protobuf
    tag, lstart, lend = lists[0]
    if tag == 0x0A:
        values = [view[s:e] for t, s, e in wire.fields(view, lstart, lend) if t == 0x0A]
        newline = any(len(v) and v[-1] == 0x0A for v in values)
        return ("bytes_list", len(values), shown_as.bytes_suffix(values), newline, False)
    packed = list(wire.fields(view, lstart, lend))
    if tag == 0x12 and len(packed) == 1 and (packed[0][2] - packed[0][1]) % 4 == 0:
        return ("float_list", (packed[0][2] - packed[0][1]) // 4, shown_as.JSON, False, False)
    if tag == 0x1A and len(packed) == 1:
        _, s, e = packed[0]
        continued = sum(len(bytes(view[p:min(e, p + _CHUNK)]).translate(None, _HIGH)) for p in range(s, e, _CHUNK))
        return ("int64_list", (e - s) - continued, shown_as.JSON, False, False)
    return _feature_row(bytes(view[start:end]))


def _ends_in_newline(value: codec.Value) -> bool:
    return value.kind == "bytes_list" and any(v.endswith(b"\n") for v in value.values)


# --- scanning shards ----------------------------------------------------------------------


def _block_end(offsets: idxfile.Offsets, i: int, stop: int, start: int) -> int:
    """The last record (past ``i``, at most ``stop``) whose header lies within ``_CHUNK`` bytes
    of ``start``, record ``i``'s: the records ``i``..j-1 are read as one block (found by a
    binary search: no Python step per record)."""
    return max(i + 1, bisect.bisect_right(offsets, start + _CHUNK, i + 1, stop + 1) - 1)


def records_in(read: Callable[[int, int], bytes], offsets: idxfile.Offsets, first: int, stop: int,
               skip: Iterable[int] = ()) -> Iterator[bytes]:
    """The data of records ``first``..``stop-1`` whose header offsets (and the end of the last)
    are ``offsets[first..stop]``, read ``_CHUNK`` bytes at a time; ``skip``: indexes left out."""
    skipped = set(skip)
    i = first
    while i < stop:
        start = offsets[i]
        j = _block_end(offsets, i, stop, start)
        block = read(offsets[j] - start, start)
        unpack = _LENGTH.unpack_from
        for k in range(i, j):
            if k in skipped:
                continue
            head = offsets[k] - start
            (length,) = unpack(block, head)
            yield block[head + 12:head + 12 + length]
        i = j


Stamp = tuple[int, int, int, int]   # a file's device, inode, size and mtime: which bytes it holds


def stamp_of(st: os.stat_result) -> Stamp:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def scan_part(path: str, stamp: Stamp, kind: str, offsets: bytes, first: int, skip: tuple[int, ...],
              typecode: str = "Q") -> dict | None:
    """A task of the scan, run in a worker process: the tally (as JSON) of the records whose
    offsets, an array of ``typecode``, are ``offsets`` (the first is record ``first``'s), in the
    plain stream ``path``; None when ``path`` is no longer the file ``stamp`` describes (a commit
    replaced it)."""
    spans = array(typecode)
    spans.frombytes(offsets)
    scanner = Scanner(kind)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        if stamp_of(os.fstat(fd)) != stamp:
            return None
        scan_read(scanner, lambda n, off: os.pread(fd, n, off), spans, {i - first for i in skip})
    finally:
        os.close(fd)
    return scanner.flush().to_json()


def scan_read(scanner: Scanner, pread: Callable[[int, int], bytes], offsets: idxfile.Offsets,
              skipped: set[int], failed: list[int] | None = None) -> None:
    """``records_in`` through ``pread`` (size, offset) into ``scanner``, without a generator step
    per record (this loop runs once per record of every shard a cold index reads); ``skipped``:
    records left out, numbered from the first of ``offsets``. With ``failed`` (a list), every
    record's data checksum is checked on the way, skipped ones too, and the numbers of those whose
    checksum fails are appended to it (the tally is the same either way)."""
    unpack, add = _LENGTH.unpack_from, scanner.add
    crc, footer = crc32c.crc32c, _FOOTER.unpack_from
    stop = len(offsets) - 1
    i = 0
    while i < stop:
        start = offsets[i]
        j = _block_end(offsets, i, stop, start)
        block = pread(offsets[j] - start, start)
        fast = _tally_in_c(scanner, block, start, offsets, i, j, skipped, failed)
        for k in (range(i, j) if fast is None else fast):
            head = offsets[k] - start + 12
            (length,) = unpack(block, head - 12)
            data = block[head:head + length]
            if failed is not None and fast is None:
                c = crc(data)
                if len(block) < head + length + 4 or \
                        footer(block, head + length)[0] != ((((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF):
                    failed.append(k)
            if skipped and k in skipped:
                continue
            if length < LARGE:
                add(data if type(data) is bytes else bytes(data))   # (a view of a block read before)
            else:
                scanner.add_large(data)
        i = j


def _tally_in_c(scanner: Scanner, block: bytes, start: int, offsets: idxfile.Offsets, i: int, j: int,
                skipped: set[int], failed: list[int] | None) -> list[int] | None:
    """``scan_read``'s records ``i``..``j-1`` (in ``block``, from ``start``) tallied in C
    (``bulk.tally``): the numbers of the records left to the Python scanner, their checksums
    already checked; None without C, or for a kind it does not read."""
    if scanner.tally.kind != "example" or not bulk.available():
        return None
    mine = {k - i for k in skipped if i <= k < j} if skipped else None
    got = bulk.tally(block, start, offsets[i:j + 1], failed is not None, mine)
    assert got is not None
    scanner.add_counted(got.gives)
    if failed is not None:
        failed += [i + k for k in got.failed]
    return [i + k for k in got.unsure if not mine or k not in mine]


def tally_block(scanner: Scanner, block: bytes | memoryview, start: int, offsets: array) -> list[int]:
    """Count the records of ``block`` (the stream from ``start``) whose headers are at ``offsets``
    (the last: the end of the last record) into ``scanner``, in C where it can: the numbers of
    those that do not parse (as ``Scanner.add_large`` leaves them out)."""
    got = bulk.tally(block, start, offsets, False, None) if scanner.tally.kind == "example" else None
    todo = range(len(offsets) - 1) if got is None else got.unsure
    if got is not None:
        scanner.add_counted(got.gives)
    bad = []
    for k in todo:
        at = offsets[k] - start
        (length,) = _LENGTH.unpack_from(block, at)
        skipped = scanner.tally.skipped
        scanner.add_large(block[at + 12:at + 12 + length])
        if scanner.tally.skipped != skipped:
            bad.append(k)
    return bad


class Part:
    """One task: records ``start``..``stop-1`` of one shard."""

    __slots__ = ("shard", "start", "stop")

    def __init__(self, shard: int, start: int, stop: int) -> None:
        self.shard, self.start, self.stop = shard, start, stop


def parts_of(count: int, shard: int) -> list[Part]:
    return [Part(shard, s, min(count, s + PART_RECORDS)) for s in range(0, max(count, 1), PART_RECORDS)]


Progress = Callable[[int, int], None]    # (records done, records in all)


Job = tuple[str, Stamp, str, "idxfile.Offsets", set[int]]   # path, its stamp, record kind, offsets, records left out


class Stopped(Exception):
    """The scan was asked to stop (the mount is closing)."""


def scan_local(jobs: list[Job], progress: Progress | None = None, runner: Runner | None = None,
               stop: threading.Event | None = None) -> list[Tally | None]:
    """The tally of each job's records, on ``runner`` (one task per ``PART_RECORDS`` records), or
    here without one; None for a job whose file was replaced meanwhile. Raises Stopped once
    ``stop`` is set (the parts under way finish first)."""
    total = sum(len(job[3]) - 1 for job in jobs)
    tallies: list[Tally | None] = [Tally(job[2]) for job in jobs]
    if total == 0:
        return tallies
    parts: list[Part] = []
    tasks: list[tuple[Any, ...]] = []
    here = runner is None or runner.workers <= 1 or total <= PART_RECORDS
    if not here:
        assert runner is not None
        for n, (path, stamp, kind, offsets, skip) in enumerate(jobs):
            for part in parts_of(len(offsets) - 1, n):
                if part.stop > part.start:
                    mine = tuple(i for i in skip if part.start <= i < part.stop)
                    parts.append(part)
                    tasks.append((path, stamp, kind, offsets[part.start:part.stop + 1].tobytes(), part.start,
                                  mine, idxfile.typecode(offsets)))
        results = runner.run(scan_part, tasks)
    else:
        # Fewer records than a worker takes to start, or no runner: read them here, shard by shard.
        for n, (path, stamp, kind, offsets, skip) in enumerate(jobs):
            parts.append(Part(n, 0, len(offsets) - 1))
            tasks.append((path, stamp, kind, offsets.tobytes(), 0, tuple(skip), idxfile.typecode(offsets)))
        results = ((k, _unless_stopped(stop, scan_part, task)) for k, task in enumerate(tasks))
    done = 0
    last = time.monotonic()
    for k, result in results:
        if stop is not None and stop.is_set():
            raise Stopped
        part = parts[k]
        got = Tally.from_json(result) if result is not None else None
        whole = tallies[part.shard]
        if got is None or whole is None:
            tallies[part.shard] = None
        else:
            whole.add(got)
        done += part.stop - part.start
        now = time.monotonic()
        if progress is not None and (now - last > 0.5 or done == total or here):
            progress(done, total)
            last = now
    return tallies


def _unless_stopped(stop: threading.Event | None, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    if stop is not None and stop.is_set():
        raise Stopped
    return fn(*args)


def scan_records(kind: str, records: Iterable[bytes]) -> Tally:
    """The tally of ``records`` read here (remote shards, staged records)."""
    scanner = Scanner(kind)
    for data in records:
        scanner.add_large(data)
    return scanner.flush()
