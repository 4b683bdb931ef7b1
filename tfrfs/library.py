"""``tfrfs.open`` (SPEC 9): a dataset for Python code, without a mount.

It is assembled by the factory a read-only mount is assembled by (``dataset.factory.open_dataset``,
from the dataset's manifest when it has one), so the records, their checksums, the kinds and the
schema are the ones the mount shows; only the last step, a record's bytes into plain Python
values (``codec.plain_values``) instead of files, is its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterator

from tfrfs.format import codec
from tfrfs.index import record_runs as ranges
from tfrfs.errors import DamagedRecord, Invalid, UsageError
from tfrfs.format.record_kinds import RECORD_KINDS, Unparsable, decode
from tfrfs.index.shard_index import IndexCache, ShardIndex
from tfrfs.index.memory import IndexMemory, parse_size
from tfrfs.dataset.factory import DatasetParts, open_dataset
from tfrfs.dataset.sources import Source

# A library's problems reach the program's logging when it has some, and nothing otherwise: each
# one a program must know of raises.
logging.getLogger("tfrfs").addHandler(logging.NullHandler())

# An Example in the usual encoding straight to plain values, in C, where it was built (else, and
# for anything unusual, protobuf's parse and ``codec.plain_values``: the same values).
_VALUES = codec.compiled_values()


@dataclass(frozen=True)
class Shard:
    """One shard of a dataset: its path relative to SOURCE, its record count, how it is stored
    (``NONE``, ``GZIP``, ``ZLIB``) and what its records are (``example``, ``sequence``, ``raw``);
    ``file``: the file or object that holds it (a bucket commit's object, SPEC 7.1: what to hand
    to ``tf.data.TFRecordDataset``)."""

    path: str
    records: int
    compression: str
    kind: str
    file: str = ""


class Dataset:
    """A read-only TFRecord dataset (see ``open``). Thread-safe; close it (or use ``with``)."""

    def __init__(self, parts: DatasetParts) -> None:
        self._parts = parts
        self.source: Source = parts.source
        self.cache: IndexCache = parts.cache
        self._store = parts.store
        self._schema = parts.schema
        indexes = parts.indexes
        self._numbers = {idx.shard.relpath: n for n, idx in enumerate(indexes)}
        self.shards: tuple[Shard, ...] = tuple(
            Shard(idx.shard.relpath, idx.count, idx.shard.compression, self._store.kinds[n], idx.shard.path)
            for n, idx in enumerate(indexes))

    # -- what it holds -------------------------------------------------------------

    def __len__(self) -> int:
        return sum(s.records for s in self.shards)

    def __repr__(self) -> str:
        return f"<tfrfs.Dataset {self.source.name!r}: {len(self.shards)} shards, {len(self):,} records>"

    @property
    def schema(self) -> dict:
        """``.tfrfs/schema.json`` of a mount of the same SOURCE (SPEC 5): per feature key its kind,
        how many records hold it, its value counts and how it is shown; and the shards. Records
        whose part is not kept in an index yet are read once, the first time it is asked for."""
        return self._schema.summary()

    @property
    def problems(self) -> list[dict]:
        """What indexing found wrong (SPEC 6), as ``.tfrfs/errors`` lines: shard, index, offset,
        reason. A record whose data checksum fails is found when it is read."""
        return [dict(p.fields(), shard=idx.shard.relpath) for idx in self._store.shards for p in idx.problems]

    def shard_index(self, shard: str | int) -> ShardIndex:
        """The index of ``shard`` (its relative path, or its position in ``shards``)."""
        return self._store.shards[self._number(shard)]

    # -- records -------------------------------------------------------------------

    def record(self, shard: str | int, index: int) -> bytes:
        """Record ``index`` of ``shard`` as stored, its checksum checked. Raises
        ``DamagedRecord`` (shard, index, offset, reason) for a record that fails it."""
        n, index = self._where(shard, index)
        return self._record(n, index)

    def _record(self, n: int, index: int) -> bytes:
        data, damaged = self._store.original(n, index)
        if damaged is not None:
            raise DamagedRecord(self.shards[n].path, index, self._store.shards[n].span(index)[0], damaged)
        return data

    def example(self, shard: str | int, index: int) -> dict:
        """Record ``index`` of ``shard`` as plain values: ``{key: list}`` for an Example,
        ``{"context": {...}, "feature_lists": {key: [list, ...]}}`` for a SequenceExample.
        Lists hold ``int``, ``float`` or ``bytes``, a one-element feature stays a list, and a
        feature with no kind is None."""
        n, index = self._where(shard, index)
        return self._plain(n, index, self._record(n, index))

    def records(self, shard: str | int, start: int = 0, stop: int | None = None) -> Iterator[bytes]:
        """Records ``start`` .. ``stop - 1`` of ``shard``, streamed in large reads, every checksum
        checked: a damaged record raises ``DamagedRecord`` when reached (go on from its
        ``index + 1``)."""
        n = self._number(shard)
        count = self.shards[n].records
        stop = count if stop is None else stop
        if not 0 <= start <= stop <= count:
            raise IndexError(f"{self.shards[n].path}: records {start}..{stop} are not within its {count} records")
        if start == stop:
            return
        span = ranges.span_of(self._store.shards[n], start, stop)
        reader = self._store.reader(n)
        assert reader is not None
        for _, _, data in ranges.walk(reader.pread, span, self.shards[n].path):
            if isinstance(data, DamagedRecord):
                raise data
            yield data

    def examples(self, shard: str | int, start: int = 0, stop: int | None = None) -> Iterator[dict]:
        """``example`` of records ``start`` .. ``stop - 1`` of ``shard``, streamed as ``records``."""
        n = self._number(shard)
        for i, data in enumerate(self.records(n, start, stop), start):
            yield self._plain(n, i, data)

    def _plain(self, n: int, index: int, data: bytes) -> dict:
        kind = self.shards[n].kind
        if kind == "raw":
            raise Invalid(f"{self.shards[n].path}: its records are not Examples (raw records): read them with "
                          "record()")
        if kind == "example" and _VALUES is not None:
            values = _VALUES(data)
            if values is not None:
                return values
        try:
            message = decode(data, kind)
        except Unparsable as exc:
            raise DamagedRecord(self.shards[n].path, index, self._store.shards[n].span(index)[0],
                                exc.message) from None
        return codec.plain_values(message)

    def _number(self, shard: str | int) -> int:
        if isinstance(shard, int) and not isinstance(shard, bool):
            if not 0 <= shard < len(self.shards):
                raise IndexError(f"no shard {shard}: the dataset has {len(self.shards)} shards")
            return shard
        n = self._numbers.get(shard) if isinstance(shard, str) else None
        if n is None:
            raise KeyError(f"no shard {shard!r} in {self.source.name} (shards are named by their path relative "
                           "to it, as Dataset.shards lists them)")
        return n

    def _where(self, shard: str | int, index: int) -> tuple[int, int]:
        n = self._number(shard)
        count = self.shards[n].records
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"a record index is an int, not {type(index).__name__}")
        if not 0 <= index < count:
            raise IndexError(f"{self.shards[n].path} has no record {index}: it holds {count} records")
        return n, index

    # -- life ----------------------------------------------------------------------

    def close(self) -> None:
        """Let go of the shards' readers (and their caches)."""
        self._parts.close()

    def __enter__(self) -> "Dataset":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open(source: str, *, records: str | None = None, options: dict[str, Any] | None = None,  # noqa: A001
         cache_dir: str | None = None, use_manifest: bool = True, index_memory: int | str | None = None) -> Dataset:
    """SOURCE (a shard, a folder, a quoted glob or a URL, as ``tfrfs mount`` takes it) as a
    read-only ``Dataset``. ``records``: read every shard as ``example``, ``sequence`` or ``raw``
    records (default: as each shard's records are); ``options``: store options for a URL (as
    ``-o``); ``cache_dir``: where indexes are cached; ``use_manifest``: take the shards from the
    dataset's ``.tfrfs-manifest`` when it has one (no listing); ``index_memory``: bytes of record
    offsets held at once (an int, or a size such as ``"128M"``). Raises ``UsageError`` for a bad
    SOURCE or option."""
    if records is not None and records not in RECORD_KINDS:
        raise UsageError(f"records={records!r}: one of {', '.join(RECORD_KINDS)}, or None (as each shard is)")
    try:
        budget = parse_size(index_memory) if isinstance(index_memory, str) else index_memory
    except ValueError as exc:
        raise UsageError(f"index_memory: {exc}") from None
    return Dataset(open_dataset(source, options=options, cache_dir=cache_dir, use_manifest=use_manifest,
                                memory=IndexMemory(budget) if budget is not None else None, records=records))
