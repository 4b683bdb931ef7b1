"""``tfrfs.ray.write`` (SPEC 9): a Ray Data sink that writes framed shards in its tasks and
publishes them once, on the driver, when every task succeeded (all shards or none), with their
index files and the manifest, through the same ``publish`` path as ``tfrfs reshard``.

Each write task writes one shard, ``part-NNNNN.tfrecord`` (NNNNN: the task's number, so the
shards' name order is the dataset's order). A task takes its blocks as Arrow tables, a few
thousand rows at a time. Rows with a ``record`` column (bytes) are written as they are, byte for
byte. Other rows are ``example`` rows, as ``tfrfs.ray.read(records="example")`` gives them
(``shard`` and ``index`` columns are left out), and are serialized here through ``codec``,
without TensorFlow:

- each column is a feature of an Example, or of a SequenceExample's context when the rows have a
  ``feature_lists`` struct column (a field per feature list, each a list of steps);
- a value's kind comes from its column's Arrow type (``list<int*>``: int64_list, ``list<float*>``:
  float_list, ``list<binary|string>``: bytes_list, a struct of such lists named by kind: the kind
  whose field is set), so an empty list keeps its kind and a step of a feature list is written
  of the kind its column holds; only a column whose type says nothing (``list<null>``, Python
  objects, tensors) has its kinds inferred from the values, by ``codec.plain_to_value``'s rules;
- None is a Feature with no kind; an empty list is a key the record lacks (``read`` gives such a
  key as ``[]``), and so is an empty feature list.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, Iterable, Iterator

from tfrfs.format import codec
from tfrfs.format import proto
from tfrfs.jobs import publish
from tfrfs.format import tfrecord
from tfrfs.errors import Invalid
from tfrfs.jobs.publish import Dest
from tfrfs.jobs.shardwrite import write_records

COMPRESSIONS = {"none": tfrecord.NONE, "gzip": tfrecord.GZIP, "zlib": tfrecord.ZLIB}
TEMPLATE = "part-{:05d}.tfrecord"
_SKIPPED = ("shard", "index")
_LISTS = "feature_lists"
BATCH_ROWS = 2048      # rows made Python values at a time (fewer when they are big) ...
BATCH_BYTES = 16 << 20  # ... so a task holds about this much beside its block, whatever the block's size
_KIND_FIELDS = ("int64_list", "float_list", "bytes_list")

# A cell (one row's value in a column, as ``to_pylist`` gives it) -> its Value.
Convert = Callable[[Any], codec.Value]


# --- the kinds of a column, from its Arrow type -----------------------------------------------

def _kind_of_items(pa: Any, t: Any) -> str | None:
    """The feature kind of values of Arrow type ``t``, or None when the type does not say."""
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return "int64_list"
    if pa.types.is_floating(t):
        return "float_list"
    if (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
            or pa.types.is_string(t) or pa.types.is_large_string(t)):
        return "bytes_list"
    if pa.types.is_dictionary(t):
        return _kind_of_items(pa, t.value_type)
    return None


def _is_list(pa: Any, t: Any) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def _inferred(cell: Any) -> codec.Value:
    if hasattr(cell, "tolist"):   # a numpy array (Ray's tensor columns): its values, flat
        cell = cell.reshape(-1).tolist() if hasattr(cell, "reshape") else cell.tolist()
    return codec.plain_to_value(cell)


def _exact(pa: Any, t: Any) -> bool:
    """Whether every value of Arrow type ``t`` is already what its kind stores (an int64, a
    float32, bytes): such values need no check or conversion."""
    return bool(pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t) or pa.types.is_int64(t)
                or pa.types.is_uint8(t) or pa.types.is_uint16(t) or pa.types.is_uint32(t)
                or pa.types.is_float16(t) or pa.types.is_float32(t)
                or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t))


def _typed(pa: Any, kind: str, t: Any) -> Convert:
    """Cells that are lists of values of Arrow type ``t``, stored as ``kind``."""
    if _exact(pa, t) and _kind_of_items(pa, t) == kind:
        return lambda cell: codec.Value("none", ()) if cell is None else codec.Value(kind, tuple(cell))
    if pa.types.is_boolean(t):
        # 0/1, as the column's type asks; a bare True among untyped values is refused (SPEC 7).
        return lambda cell: codec.plain_to_value(None if cell is None else [int(v) for v in cell], kind)
    return lambda cell: codec.plain_to_value(cell, kind)


def _scalar(pa: Any, kind: str, t: Any) -> Convert:
    """A column of one value a row (not a list): a one-value feature, None a Feature with no kind."""
    one = _typed(pa, kind, t)
    return lambda cell: one(None if cell is None else [cell])


def _several(pa: Any, t: Any) -> Convert | None:
    """A key of several kinds: a struct of one list per kind (``read``'s shape), the record's kind
    the field that is set. None when ``t`` is not such a struct."""
    names = [t.field(i).name for i in range(t.num_fields)]
    if not names or not all(n in _KIND_FIELDS and _is_list(pa, t.field(i).type) for i, n in enumerate(names)):
        return None
    # The field's name is the kind, as ``read`` names them.
    parts = {n: _typed(pa, n, t.field(i).type.value_type) for i, n in enumerate(names)}

    def convert(cell: Any) -> codec.Value:
        if cell is None:
            return codec.Value("none", ())
        given = {n: v for n, v in cell.items() if v is not None}
        if not given:
            return codec.Value("none", ())
        full = [n for n, v in given.items() if len(v)]
        if len(full) > 1:
            raise Invalid(f"the fields {' and '.join(full)} both hold values; a feature holds one kind")
        # ``read`` gives a key the record lacks as ``[]`` in the first kind's field (others None):
        # with no values the first field given decides, as an empty list of that kind.
        name = full[0] if full else next(iter(given))
        return parts[name](given[name])
    return convert


def converter(pa: Any, t: Any) -> Convert:
    """How the cells of a column of Arrow type ``t`` become Values: by the kind the type says, else
    by ``codec.plain_to_value``'s inference from each cell's values."""
    if _is_list(pa, t):
        kind = _kind_of_items(pa, t.value_type)
        return _typed(pa, kind, t.value_type) if kind else _inferred
    if pa.types.is_struct(t):
        return _several(pa, t) or _inferred
    kind = _kind_of_items(pa, t)
    return _scalar(pa, kind, t) if kind else _inferred


def _steps_converter(pa: Any, t: Any) -> Callable[[Any], list[codec.Value]]:
    """How one feature list's cells (a list of steps) become their Values: each step of the kind
    its type says; untyped steps take one kind inferred from all of them, as SPEC 7 does for a
    feature list, so ``[[1], [2.5]]`` is two float steps."""
    step = converter(pa, t.value_type) if _is_list(pa, t) else None
    if step is not None and step is not _inferred:
        return lambda cell: _each_step(step, cell or ())

    def infer(cell: Any) -> list[codec.Value]:
        if cell is None:
            return []
        if hasattr(cell, "tolist"):
            cell = cell.tolist()
        if not isinstance(cell, (list, tuple)):
            raise Invalid(f"a feature list is a list of steps, not {type(cell).__name__}")
        steps = [s.tolist() if hasattr(s, "tolist") else s for s in cell]
        values = [v for s in steps if isinstance(s, (list, tuple)) for v in s]
        kind = codec.plain_to_value(values).kind
        return _each_step(lambda s: codec.plain_to_value(s, kind), steps)
    return infer


def _each_step(step: Convert, cells: Iterable[Any]) -> list[codec.Value]:
    out = []
    for n, cell in enumerate(cells):
        try:
            out.append(step(cell))
        except Invalid as exc:
            raise Invalid(f"step {n}: {exc}") from None
    return out


def _named(key: str, steps: Callable[[Any], list[codec.Value]], cell: Any) -> list[codec.Value]:
    try:
        return steps(cell)
    except Invalid as exc:
        raise Invalid(f"feature list {key!r}: {exc}") from None


def _lists_converter(pa: Any, t: Any) -> Callable[[Any], dict[str, list[codec.Value]]]:
    """How the ``feature_lists`` cells become ``{key: steps}``: a struct of a field per feature
    list (``read``'s shape), or a map; else Python dicts, their kinds inferred."""
    if pa.types.is_struct(t):
        fields = {t.field(i).name: _steps_converter(pa, t.field(i).type) for i in range(t.num_fields)}
        return lambda cell: {} if cell is None else {k: _named(k, fields[k], v) for k, v in cell.items()}
    if pa.types.is_map(t):
        steps = _steps_converter(pa, t.item_type)
        return lambda cell: {} if cell is None else {k: _named(k, steps, v) for k, v in cell}
    untyped = _steps_converter(pa, pa.null())

    def convert(cell: Any) -> dict[str, list[codec.Value]]:
        if cell is None:
            return {}
        if not isinstance(cell, dict):
            raise Invalid(f"the {_LISTS} column holds {type(cell).__name__}, not {{key: [step, ...]}}")
        return {k: _named(k, untyped, v) for k, v in cell.items()}
    return convert


# --- records of a table ------------------------------------------------------------------------

def table_records(table: Any, batch_rows: int = BATCH_ROWS) -> Iterator[bytes]:
    """The records of an Arrow table's rows, in order: its ``record`` column's bytes as they are,
    else each row serialized as an Example or, with a ``feature_lists`` column, a SequenceExample
    (see the module's notes)."""
    import pyarrow as pa
    names = table.column_names
    batch_rows = _rows_per_batch(table, batch_rows)
    if "record" in names and not _is_feature(pa, table.schema.field("record").type):
        yield from _raw_records(table.column("record"), batch_rows)
        return
    keys = [k for k in names if k not in _SKIPPED and k != _LISTS]
    feats = [(k, converter(pa, table.schema.field(k).type)) for k in keys]
    lists = _lists_converter(pa, table.schema.field(_LISTS).type) if _LISTS in names else None
    for start in range(0, table.num_rows, batch_rows):
        part = table.slice(start, batch_rows)
        cells = [part.column(k).to_pylist() for k in keys]
        list_cells = part.column(_LISTS).to_pylist() if lists is not None else []
        where = _rows_named(part, start)
        for n in range(part.num_rows):
            try:
                if lists is None:
                    ex = proto.Example()
                    ex.features.SetInParent()
                    _fill(ex.features, feats, cells, n)
                else:
                    ex = proto.SequenceExample()
                    # Both parts present, as TensorFlow's constructors give them; an index finds a
                    # shard's kind by ``feature_lists`` being there, even when it holds no list.
                    ex.context.SetInParent()
                    ex.feature_lists.SetInParent()
                    _fill(ex.context, feats, cells, n)
                    for key, steps in lists(list_cells[n]).items():
                        if steps:   # [] is a feature list the record lacks, as for a feature
                            fl = ex.feature_lists.feature_list[key]
                            for value in steps:
                                codec.value_to_proto(value, fl.feature.add())
            except Invalid as exc:
                raise Invalid(f"{where(n)}: {exc}") from None
            yield ex.SerializeToString(deterministic=True)


def _rows_per_batch(table: Any, batch_rows: int) -> int:
    if not table.num_rows:
        return batch_rows
    per_row = table.nbytes / table.num_rows
    return max(1, min(batch_rows, int(BATCH_BYTES / max(per_row, 1))))


def _fill(features: Any, feats: list[tuple[str, Convert]], cells: list[list], n: int) -> None:
    for (key, convert), column in zip(feats, cells):
        try:
            value = convert(column[n])
        except Invalid as exc:
            raise Invalid(f"column {key!r}: {exc}") from None
        if value.kind != "none" and not value.values:
            continue   # ``read`` gives a key the record lacks as []: it stays out
        codec.value_to_proto(value, features.feature[key])


def _rows_named(part: Any, start: int) -> Callable[[int], str]:
    """How an error names a row: by the ``shard`` and ``index`` it was read from when the rows
    have them, else by its place in the block."""
    if "shard" in part.column_names and "index" in part.column_names:
        return lambda n: f"the row of {part.column('shard')[n].as_py()} record {part.column('index')[n].as_py()}"
    return lambda n: f"row {start + n} of its block"


def _is_feature(pa: Any, t: Any) -> bool:
    """Whether a ``record`` column is a feature of that name (a list, or a struct of kinds) rather
    than the records' bytes."""
    return _is_list(pa, t) or bool(pa.types.is_struct(t))


def _raw_records(column: Any, batch_rows: int) -> Iterator[bytes]:
    for start in range(0, len(column), batch_rows):
        for data in column.slice(start, batch_rows).to_pylist():
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise TypeError(f"the record column holds {type(data).__name__}, not bytes")
            yield bytes(data)


def _sink_class() -> Any:
    from ray.data import Datasink
    from ray.data.block import BlockAccessor

    class TfrfsDatasink(Datasink):
        def __init__(self, dest: Dest, compression: str) -> None:
            self.dest = dest
            self.compression = compression
            self.key = "ray-write:" + uuid.uuid4().hex
            self.done: list[dict] = []

        def on_write_start(self, schema: Any = None) -> None:
            publish.already_published(self.dest, self.key)   # raises unless DEST is new or empty
            publish.begin(self.dest, self.key, [])

        def write(self, blocks: Iterable[Any], ctx: Any) -> Any:
            def records() -> Iterator[bytes]:
                for block in blocks:
                    yield from table_records(BlockAccessor.for_block(block).to_arrow())
            return write_records(self.dest, TEMPLATE.format(ctx.task_idx), self.compression, records())

        def on_write_complete(self, write_result: Any) -> None:
            from tfrfs.jobs.reshardresult import manifest_body
            done = sorted((r for r in write_result.write_returns if r), key=lambda r: r["name"])
            publish.check(self.dest, done)
            publish.publish(self.dest, manifest_body(done, {}), {}, self.key)
            self.done = done

        def on_write_failed(self, error: Exception) -> None:
            publish.abandon(self.dest)

    return TfrfsDatasink


def write(dataset: Any, dest: str, *, shards: int | None = None, compression: str = "none", **options: Any) -> dict:
    """Write ``dataset``'s rows into DEST (a new or empty folder, or a bucket prefix) as framed
    shards (``shards``: that many, else one per block), published when every write task succeeded.
    Returns ``{"dest", "shards", "records"}``. Rows with a ``record`` column are written byte for
    byte; other rows are ``example`` rows as ``read(records="example")`` gives them (a column a
    feature, a ``feature_lists`` column making SequenceExamples), each value of the kind its
    column's Arrow type says: None a Feature with no kind, an empty list (or feature list) a key
    the record lacks."""
    from tfrfs.errors import UsageError
    if compression not in COMPRESSIONS:
        raise UsageError(f"compression {compression!r}: give none, gzip or zlib")
    target = Dest.of(dest, options or None)
    if shards is not None:
        dataset = dataset.repartition(shards)
    sink = _sink_class()(target, COMPRESSIONS[compression])
    # Shards are numbered by write task: in the dataset's order only when the order is kept.
    execution: Any = dataset.context.execution_options
    kept, execution.preserve_order = execution.preserve_order, True
    try:
        dataset.write_datasink(sink)
    finally:
        execution.preserve_order = kept
    done = getattr(sink, "done", [])
    return {"dest": dest, "shards": len(done), "records": sum(d["count"] for d in done)}
