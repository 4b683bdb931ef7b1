"""``tfrfs.ray.write`` (SPEC 9): a Ray Data sink that writes framed shards in its tasks and
publishes them once, on the driver, when every task succeeded (all shards or none), with their
index files and the manifest, through the same ``publish`` path as ``tfrfs reshard``.

Each write task writes one shard, ``part-NNNNN.tfrecord`` (NNNNN: the task's number, so the
shards' name order is the dataset's order). Rows with a ``record`` column (bytes) are written as
they are, byte for byte; other rows are taken as an Example's features (``{key: list}``, as
``tfrfs.ray.read(records="example")`` gives them; ``shard`` and ``index`` columns are left out)
and serialized here, without TensorFlow.
"""

from __future__ import annotations

import uuid
from typing import Any, Iterable

from . import proto, publish, tfrecord
from .index import KIND_SAMPLE, detect_kind
from .publish import Dest
from .shardwrite import ShardWriter

COMPRESSIONS = {"none": tfrecord.NONE, "gzip": tfrecord.GZIP, "zlib": tfrecord.ZLIB}
TEMPLATE = "part-{:05d}.tfrecord"
_SKIPPED = ("shard", "index")
_FLUSH = 4 << 20


def example_bytes(row: dict) -> bytes:
    """An Example of a row of feature lists (None: a feature with no kind)."""
    ex = proto.Example()
    for key, values in row.items():
        if key in _SKIPPED:
            continue
        if values is None:
            ex.features.feature[key].SetInParent()   # a feature with no kind
            continue
        values = values.tolist() if hasattr(values, "tolist") else values
        if not isinstance(values, (list, tuple)):
            values = [values]
        if not values:
            continue   # ``read`` gives a key the record lacks as []: it stays out
        feature = ex.features.feature[key]
        if all(isinstance(v, (bytes, str)) for v in values):
            feature.bytes_list.value.extend(v.encode() if isinstance(v, str) else v for v in values)
        elif any(isinstance(v, float) for v in values):
            feature.float_list.value.extend(values)
        else:
            feature.int64_list.value.extend(int(v) for v in values)
    return ex.SerializeToString()


def _record_of(row: dict) -> bytes:
    if "record" in row:
        data = row["record"]
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"the record column holds {type(data).__name__}, not bytes")
        return bytes(data)
    return example_bytes(row)


def write_rows(dest: Dest, name: str, compression: str, rows: Iterable[dict]) -> dict | None:
    """Write ``rows`` as shard ``name`` in DEST: its figures, or None for no rows."""
    it = iter(rows)
    first: list[bytes] = []
    for row in it:
        first.append(_record_of(row))
        if len(first) >= KIND_SAMPLE:
            break
    if not first:
        return None
    w = ShardWriter(dest, name, compression, detect_kind(r for r in first if r))
    out = bytearray()
    try:
        def put(data: bytes) -> None:
            nonlocal out
            w.record(len(data), data)
            out += tfrecord.frame(data)
            if len(out) >= _FLUSH:
                w.emit(out)
                out = bytearray()
        for data in first:
            put(data)
        for row in it:
            put(_record_of(row))
        w.emit(out)
        return w.finish()
    except BaseException:
        w.abort()
        raise


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
            def rows() -> Iterable[dict]:
                for block in blocks:
                    yield from BlockAccessor.for_block(block).iter_rows(public_row_format=True)
            return write_rows(self.dest, TEMPLATE.format(ctx.task_idx), self.compression, rows())

        def on_write_complete(self, write_result: Any) -> None:
            from .reshard import manifest_body
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
    Returns ``{"dest", "shards", "records"}``. Rows of ``example`` shape: a list column is a
    feature, None a feature with no kind, an empty list a key the record lacks (as ``read`` gives
    them); kinds follow the values (bytes or str, a float anywhere, else int64)."""
    from .errors import UsageError
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
