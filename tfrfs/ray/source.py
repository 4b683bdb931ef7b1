"""``tfrfs.ray.read`` (SPEC 9): a dataset's records as a Ray Data dataset, read by byte ranges of
its index.

The driver opens SOURCE with ``tfrfs.open`` (indexes from the cache, the index files shipped
beside the shards or the manifest) and cuts its records into read tasks of about equal bytes, as
many as Ray asks for (``override_num_blocks``, else Ray's own choice from its target block size).
A task is sent runs of records (``ranges.Span``: shard, first and last index, first and last
byte, and the resume points of any gap), never a shard's offsets. It streams its runs (local: a
block at a time by ``pread``; a bucket: ranged requests of a block) and checks every checksum;
rows leave it as Arrow tables of a few MiB, so a task's memory stays flat. A GZIP/ZLIB shard is
one run: a deflate stream cannot be entered in the middle, so a task inflates it from its start.

Damage (SPEC 6) is never passed on silently: by default the first damaged record, lost bytes or
record that does not parse ends the read with a ``DamagedRecord`` naming shard, index, offset and
reason; ``on_damage="skip"`` logs each one and reads every sound record. Nothing here imports
TensorFlow; ``ray`` is imported when ``read`` is called.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from tfrfs.format import codec
from tfrfs.format import record_kinds
from tfrfs.index import record_runs as ranges
from tfrfs.errors import DamagedRecord, Invalid, UsageError
from tfrfs.index.where import Where
from tfrfs.index.record_runs import Span
from tfrfs.format.tfrecord import NONE, PRead, Problem

log = logging.getLogger("tfrfs")

OUT_BYTES = 4 << 20       # about this many bytes of records per Arrow table a task yields
OUT_ROWS = 1 << 16        # ... or this many rows
RECORDS = ("raw", "example")
ON_DAMAGE = ("raise", "skip")
_ARROW_KINDS = {"int64_list": "int64", "float_list": "float32", "bytes_list": "binary"}


@dataclass(frozen=True)
class Part:
    """One run of one shard's records, as a read task gets it."""

    shard: str            # relative path (the rows' ``shard``)
    path: str             # where its stored bytes are (a path or URL)
    compression: str
    data_path: str        # the inflated stream in the driver's cache (a compressed shard)
    stream_size: int      # its size, when it is there
    kind: str             # example, sequence or raw
    span: Span
    lost: tuple[tuple[int | None, int, str], ...] = ()   # (index, offset, reason) of bytes lost in the run


@dataclass(frozen=True)
class Columns:
    """What ``example`` rows hold: a column per feature (an Example's features, a
    SequenceExample's context) and, when the dataset has SequenceExamples, one ``feature_lists``
    struct column of a field per feature list; the kinds by key."""

    features: tuple[tuple[str, tuple[str, ...]], ...]
    lists: tuple[tuple[str, tuple[str, ...]], ...] = ()
    sequence: bool = False   # some shard holds SequenceExamples: rows have ``feature_lists``


def read(source: str, *, records: str = "raw", override_num_blocks: int | None = None, on_damage: str = "raise",
         **options: Any) -> Any:
    """SOURCE's records as a ``ray.data.Dataset``: rows ``{"shard", "index", "record"}``, or for
    ``records="example"`` one list column per feature key typed from the schema, plus ``shard``
    and ``index``. ``options`` go to ``tfrfs.open`` (``options=``, ``cache_dir=``, ...)."""
    ray = _ray()
    if records not in RECORDS:
        raise UsageError(f"records={records!r}: one of {', '.join(RECORDS)}")
    if on_damage not in ON_DAMAGE:
        raise UsageError(f"on_damage={on_damage!r}: one of {', '.join(ON_DAMAGE)}")
    if override_num_blocks is not None and override_num_blocks < 1:
        raise UsageError("override_num_blocks: give a number of blocks, 1 or more")
    from tfrfs.library import open as open_dataset
    ds = open_dataset(source, **options)
    try:
        columns = columns_of(ds) if records == "example" else None
        plan = Plan(ds, Where.of(ds.source))
    finally:
        ds.close()   # the plan keeps what it cut from (see ``Plan``)
    datasource = _datasource_class()(plan, columns, on_damage)
    return ray.data.read_datasource(datasource, override_num_blocks=override_num_blocks)


def _ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise UsageError("tfrfs.ray needs Ray: pip install 'tfrfs[ray]'") from None
    return ray


# --- cutting the records into read tasks -----------------------------------------------------

class Plan:
    """The shards to read and how to cut them: what ``get_read_tasks`` needs, at any time Ray
    asks, without the dataset held open. A shard's offsets are looked up only where a cut falls
    inside it (the index file mapped, not held)."""

    def __init__(self, ds: Any, where: Where) -> None:
        self.where = where
        self.shards: list[tuple[Any, int]] = []   # (ShardIndex, its bytes), shards with records
        self.kinds: dict[str, str] = {}
        for n, shard in enumerate(ds.shards):
            idx = ds.shard_index(n)
            if shard.records:
                self.shards.append((idx, max(1, idx.shard.size)))
                self.kinds[shard.path] = shard.kind
        self.bytes = sum(size for _, size in self.shards)
        self.records = sum(idx.count for idx, _ in self.shards)

    def tasks(self, wanted: int) -> list[list[Part]]:
        """The records cut into at most ``wanted`` tasks of about equal bytes, at record
        boundaries, in order; fewer when there are too few records (or whole compressed shards)."""
        groups: list[list[tuple[Any, int, int]]] = [[]]
        target = self.bytes / max(1, wanted)
        base = 0
        for idx, size in self.shards:
            # The cuts k * target that fall in this shard, as record boundaries where it can be
            # entered in the middle; one at its end (or that cannot be) starts the next task.
            cuts = [k * target - base for k in range(int(base // target) + 1, wanted)
                    if base < k * target <= base + size]
            inner: list[int] = []
            if cuts and idx.shard.compression == NONE and idx.count > 1:
                offsets = idx.peek_offsets()
                inner = sorted({min(idx.count - 1, max(1, bisect.bisect_left(offsets, c, 0, idx.count)))
                                for c in cuts if c < size})
            first = 0
            for i in inner:
                groups[-1].append((idx, first, i))
                groups.append([])
                first = i
            groups[-1].append((idx, first, idx.count))
            if len(cuts) > len(inner):
                groups.append([])
            base += size
        groups = [g for g in groups if g]
        self._even_out(groups, wanted)
        return [[self._part(idx, first, stop) for idx, first, stop in g] for g in groups]

    @staticmethod
    def _even_out(groups: list[list[tuple[Any, int, int]]], wanted: int) -> None:
        """Split the largest groups until there are ``wanted`` (or nothing left to split): a group
        of several runs between its runs, a single run of an uncompressed shard at its middle
        record."""
        def weight(g: list[tuple[Any, int, int]]) -> int:
            return sum(stop - first for _, first, stop in g)

        def splittable(g: list[tuple[Any, int, int]]) -> bool:
            return len(g) > 1 or (g[0][0].shard.compression == NONE and g[0][2] - g[0][1] > 1)
        while len(groups) < wanted:
            candidates = [n for n, g in enumerate(groups) if splittable(g)]
            if not candidates:
                return
            n = max(candidates, key=lambda k: weight(groups[k]))
            g = groups[n]
            if len(g) > 1:
                halves = [g[:len(g) // 2], g[len(g) // 2:]]
            else:
                idx, first, stop = g[0]
                mid = (first + stop) // 2
                halves = [[(idx, first, mid)], [(idx, mid, stop)]]
            groups[n:n + 1] = halves

    def _part(self, idx: Any, first: int, stop: int) -> Part:
        shard = idx.shard
        span = ranges.span_of(idx, first, stop)
        lost = tuple((p.index, p.offset, p.reason) for p in idx.problems
                     if _loses_bytes(p) and _in_run(p, first, stop, idx.count))
        stream_size = shard.size if shard.compression == NONE else _stream_size(idx)
        return Part(shard.relpath, shard.path, shard.compression, idx.data_path, stream_size,
                    self.kinds[shard.relpath], span, lost)


def _stream_size(idx: Any) -> int:
    try:
        return os.path.getsize(idx.data_path)
    except OSError:
        return -1


def _loses_bytes(p: Problem) -> bool:
    """Whether a problem the index knows means bytes are lost (a gap, a cut, a damaged stream),
    not a record that is there but fails its checksum or parse (the task finds those itself)."""
    return p.skipped is not None or p.resync_offset is not None or p.compressed_offset is not None


def _in_run(p: Problem, first: int, stop: int, count: int) -> bool:
    """Whether problem ``p`` (before record ``p.index``, or after the last) is met in the run."""
    at = count if p.index is None else min(p.index, count)
    return first <= at < stop or (at >= count and stop == count)


# --- the read task -----------------------------------------------------------------------------

def read_parts(where: Where, parts: list[Part], columns: Columns | None, on_damage: str) -> Iterator[Any]:
    """What one read task yields: the rows of ``parts``, as Arrow tables of about ``OUT_BYTES``."""
    import pyarrow as pa
    rows = _RawRows(pa) if columns is None else _ExampleRows(pa, columns)
    for part in parts:
        with ExitStack() as stack:
            pread = _pread(where, part, stack)
            lost = sorted(part.lost, key=lambda p: (p[0] is None, p[0] or 0, p[1]))
            for index, offset, data in ranges.walk(pread, part.span, part.shard):
                while lost and lost[0][0] is not None and lost[0][0] <= index:
                    _damage(DamagedRecord(part.shard, *lost.pop(0)), on_damage)
                if isinstance(data, DamagedRecord):
                    _damage(data, on_damage)
                    continue
                try:
                    rows.add(part, index, data)
                except DamagedRecord as exc:   # a record that does not parse (example rows)
                    _damage(DamagedRecord(part.shard, index, offset, exc.reason), on_damage)
                if rows.full():
                    yield rows.table()
            for p in lost:
                _damage(DamagedRecord(part.shard, *p), on_damage)
    if rows.count or not parts:
        yield rows.table()


def _damage(problem: DamagedRecord, on_damage: str) -> None:
    if on_damage == "raise":
        raise DamagedRecord(problem.shard, problem.index, problem.offset,
                            f"{problem.reason} (tfrfs verify lists every problem; on_damage='skip' reads "
                            "the sound records)")
    log.warning("skipped: %s", problem)


def _pread(where: Where, part: Part, stack: ExitStack) -> PRead:
    """How a task reads the run's (inflated) stream: an uncompressed shard through the source's
    shard readers (a local file by ``pread``, an object by ranged requests); a compressed shard
    from the driver's inflated copy when this node has it, else inflated here into a temporary
    file (memory stays flat)."""
    if part.compression == NONE:
        reader = where.readers().open(part.path)
        stack.callback(reader.close)
        return lambda size, offset: reader.pread(size, offset) if size > 0 else b""
    try:
        if part.stream_size >= 0 and os.path.getsize(part.data_path) == part.stream_size:
            fd = os.open(part.data_path, os.O_RDONLY)
            stack.callback(os.close, fd)
            return functools.partial(os.pread, fd)
    except OSError:
        pass
    from tfrfs.format import salvage
    tmp = stack.enter_context(tempfile.TemporaryFile())
    with where.open_stream(part.path) as src:
        salvage.inflate(src, tmp, part.compression)   # its damage is among the run's known problems
    tmp.flush()
    return functools.partial(os.pread, tmp.fileno())


class _RawRows:
    def __init__(self, pa: Any) -> None:
        self.pa = pa
        self.schema = raw_schema(pa)
        self._reset()

    def _reset(self) -> None:
        self.shards: list[str] = []
        self.indexes: list[int] = []
        self.records: list[bytes] = []
        self.count = self.bytes = 0

    def add(self, part: Part, index: int, data: bytes) -> None:
        self.records.append(data)
        self._counted(part.shard, index, len(data))

    def _counted(self, shard: str, index: int, size: int) -> None:
        self.shards.append(shard)
        self.indexes.append(index)
        self.count += 1
        self.bytes += size

    def full(self) -> bool:
        return self.bytes >= OUT_BYTES or self.count >= OUT_ROWS

    def table(self) -> Any:
        pa = self.pa
        out = pa.table([pa.array(self.shards, pa.string()), pa.array(self.indexes, pa.int64()),
                        pa.array(self.records, pa.binary())], schema=self.schema)
        self._reset()
        return out


def raw_schema(pa: Any) -> Any:
    return pa.schema([("shard", pa.string()), ("index", pa.int64()), ("record", pa.binary())])


class _ExampleRows(_RawRows):
    """Rows of parsed records: a column per feature and, with SequenceExamples, a
    ``feature_lists`` struct (see ``Columns`` and ``example_schema``)."""

    def __init__(self, pa: Any, columns: Columns) -> None:
        self.columns = columns
        super().__init__(pa)
        self.schema = example_schema(pa, columns)

    def _reset(self) -> None:
        super()._reset()
        self.values: dict[str, list] = {k: [] for k, _ in self.columns.features}
        self.lists: dict[str, list] = {k: [] for k, _ in self.columns.lists}

    def add(self, part: Part, index: int, data: bytes) -> None:
        shard = part.shard
        try:
            message = record_kinds.decode(data, part.kind)
        except record_kinds.Unparsable as exc:
            raise DamagedRecord(shard, index, -1, exc.message) from None
        feats = message.context.feature if part.kind == "sequence" else message.features.feature
        for key, kinds in self.columns.features:
            value = codec.value_from_proto(feats[key]) if key in feats else None
            self.values[key].append(_cell(value, kinds, shard, index, key))
        if self.columns.sequence:
            lists = message.feature_lists.feature_list if part.kind == "sequence" else {}
            for key, kinds in self.columns.lists:
                steps = lists[key].feature if key in lists else ()
                self.lists[key].append([_cell(codec.value_from_proto(f), kinds[:1], shard, index, key)
                                        for f in steps])
        self._counted(shard, index, len(data))

    def table(self) -> Any:
        pa = self.pa
        arrays: list[Any] = [pa.array(self.shards, pa.string()), pa.array(self.indexes, pa.int64())]
        arrays += [pa.array(self.values[k], _feature_type(pa, kinds)) for k, kinds in self.columns.features]
        if self.columns.sequence:
            lists = [pa.array(self.lists[k], pa.list_(_feature_type(pa, kinds[:1]))) for k, kinds in self.columns.lists]
            names = [k for k, _ in self.columns.lists]
            arrays.append(pa.StructArray.from_arrays(lists, names=names) if names else
                          pa.array([{}] * self.count, pa.struct([])))
        out = pa.table(arrays, schema=self.schema)
        self._reset()
        return out


def _cell(value: codec.Value | None, kinds: tuple[str, ...], shard: str, index: int, key: str) -> Any:
    """A feature's value in its column: ``kinds`` are the key's kinds across the dataset, most
    records first. One kind: the values (``[]`` when the record lacks the key, None for a
    Feature with no kind). Several: a struct with the record's kind set and the others None."""
    if value is not None and value.kind != "none" and value.kind not in kinds:
        raise Invalid(f"{shard}: record {index}: feature {key!r} is a {value.kind}, which its column "
                      f"({' or '.join(kinds)}) cannot hold: read with records='raw' and parse it yourself")
    if len(kinds) == 1:
        if value is None:
            return []
        return None if value.kind == "none" else list(value.values)
    if value is None:
        return {k: [] if n == 0 else None for n, k in enumerate(kinds)}
    if value.kind == "none":
        return None
    return {k: list(value.values) if k == value.kind else None for k in kinds}


def _feature_type(pa: Any, kinds: tuple[str, ...]) -> Any:
    """A list of the kind's values; for a key of several kinds, a struct of such lists."""
    def of(kind: str) -> Any:
        return pa.list_(getattr(pa, _ARROW_KINDS[kind])()) if kind in _ARROW_KINDS else pa.list_(pa.null())
    if len(kinds) == 1:
        return of(kinds[0])
    return pa.struct([(k, of(k)) for k in kinds])


def example_schema(pa: Any, columns: Columns) -> Any:
    fields = [("shard", pa.string()), ("index", pa.int64())]
    fields += [(k, _feature_type(pa, kinds)) for k, kinds in columns.features]
    if columns.sequence:
        fields.append(("feature_lists", pa.struct([(k, pa.list_(_feature_type(pa, kinds[:1])))
                                                   for k, kinds in columns.lists])))
    return pa.schema(fields)


def columns_of(ds: Any) -> Columns:
    """The columns of ``example`` rows, from the dataset's schema: each key's value kinds, most
    records first (a Feature with no kind is not a kind here; a key that never has one is a list
    of nulls)."""
    kinds = {s.kind for s in ds.shards if s.records}
    if "raw" in kinds:
        raws = [s.path for s in ds.shards if s.kind == "raw" and s.records]
        raise UsageError(f"{raws[0]}: its records are not Examples: read the dataset with records='raw'")
    schema = ds.schema
    feats = tuple((k, _kinds(e["kind"])) for k, e in sorted(schema.get("features", {}).items()))
    lists = tuple((k, _kinds(e["kind"])) for k, e in sorted(schema.get("feature_lists", {}).items()))
    sequence = "sequence" in kinds
    own = ("shard", "index", "feature_lists") if sequence else ("shard", "index")
    clash = [k for k, _ in feats if k in own]
    if clash:
        raise UsageError(f"feature {clash[0]!r} has the name of the rows' own {clash[0]!r} column: read the "
                         "dataset with records='raw'")
    return Columns(feats, lists, sequence)


def _kinds(kind: str | list | None) -> tuple[str, ...]:
    """The value kinds of a schema entry, most records first; ``("none",)`` when it has none."""
    found = tuple(k for k in (kind if isinstance(kind, list) else [kind]) if k in _ARROW_KINDS)
    return found or ("none",)


# --- the Ray Data datasource -------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _datasource_class() -> type:
    """``TFRecordDatasource``, a ``ray.data.Datasource``: made when first asked for, so importing
    this module does not import Ray."""
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    class TFRecordDatasource(Datasource):
        def __init__(self, plan: Plan, columns: Columns | None, on_damage: str) -> None:
            super().__init__()
            self.plan = plan
            self.columns = columns
            self.on_damage = on_damage

        def get_name(self) -> str:
            return "tfrfs"

        def estimate_inmemory_data_size(self) -> int | None:
            return self.plan.bytes

        def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                           data_context: Any = None) -> list[Any]:
            import pyarrow as pa
            schema = raw_schema(pa) if self.columns is None else example_schema(pa, self.columns)
            tasks = []
            for parts in self.plan.tasks(max(1, parallelism)):
                meta = BlockMetadata(num_rows=sum(p.span.records for p in parts),
                                     size_bytes=sum(p.span.end - p.span.start for p in parts),
                                     exec_stats=None, input_files=tuple(dict.fromkeys(p.path for p in parts)))
                fn: Callable[[], Iterator[Any]] = functools.partial(read_parts, self.plan.where, parts,
                                                                     self.columns, self.on_damage)
                tasks.append(ReadTask(fn, meta, schema=schema, per_task_row_limit=per_task_row_limit))
            return tasks

    return TFRecordDatasource
