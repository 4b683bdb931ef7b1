"""One dataset, assembled in one place: SOURCE opened (``sources.open_source``), its shards
indexed (``sources.index_source``: from the cache, a shipped index file, the manifest, or walked
now on a runner), and the record store and schema over those indexes. The mount
(``assembly.open_mount``), ``tfrfs.open`` (and through it the Ray source) and every command
take their dataset from ``open_dataset``; nothing else makes a ``RecordStore`` or a ``Schema``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tfrfs.index.discovery import ShardFile
from tfrfs.index.memory import IndexMemory
from tfrfs.index.shard_index import IndexCache, IndexProgress, ShardIndex
from tfrfs.jobs import runner as jobs
from tfrfs.storage.readers import Readers
from tfrfs.view.overlay import Overlay
from tfrfs.view.records import RecordStore
from tfrfs.view.schema import Schema
from tfrfs.dataset.sources import Source, index_source, open_source

# Run once the shards are indexed, before the record store is made: what to lay over its records
# (a writable mount's staged edits, loaded and recovered only once the source's lock is taken).
OverlayOf = Callable[[Source], Overlay | None]


@dataclass(eq=False)
class DatasetParts:
    """An opened dataset: its source, its shards' indexes and the cache that gave them, the record
    store over them and the dataset's schema."""

    source: Source
    indexes: list[ShardIndex]
    cache: IndexCache
    store: RecordStore
    schema: Schema

    @property
    def shards(self) -> tuple[ShardFile, ...]:
        return self.source.discovery.shards

    @property
    def problems(self) -> int:
        """What indexing found wrong, each once, and what was found since (``RecordStore.errors``):
        as many as ``.tfrfs/errors`` lines."""
        self.store.note_problems()
        return len(self.store.errors)

    def close(self, *, source: bool = True) -> None:
        """Stop the schema's reading and let go of the shards' readers; ``source``: the source's
        readers too (else its owner still reads through them, and closes it)."""
        self.schema.close()   # before the readers it may be reading through
        self.store.close(factory=False)
        if source:
            self.source.close()


def open_dataset(source: str | Source, *, options: dict[str, Any] | None = None, cache_dir: str | None = None,
                 cache_size: int | None = None, readers: Readers | None = None, use_manifest: bool = False,
                 empty_ok: bool = False, index_dir: str | None = None, memory: IndexMemory | None = None,
                 progress: IndexProgress | None = None, runner: jobs.Runner | None = None,
                 schema_parts: bool = False, indexed: tuple[list[ShardIndex], IndexCache] | None = None,
                 records: str | None = None, decode_raw: bool = True, overlay: OverlayOf | None = None,
                 writable: bool = False) -> DatasetParts:
    """SOURCE (a path, glob or URL, opened with ``options``, ``cache_dir``, ``cache_size``,
    ``readers``, ``use_manifest`` and ``empty_ok``; or a ``Source`` already opened) as a dataset.
    Its shards are indexed with ``index_dir``, ``memory`` and ``progress``, the cold ones as shard
    jobs on ``runner`` (default: see ``index_source``), with their schema's part when
    ``schema_parts``; unless ``indexed`` gives them already. The record store reads them as
    ``records`` (default: as each shard's are), ``decode_raw``, ``writable``, with what
    ``overlay(source)`` lays over them. Raises what opening and indexing raise (UsageError for a
    bad SOURCE); a source it opened itself is closed again then."""
    src = source if isinstance(source, Source) else open_source(
        source, options=options, cache_dir=cache_dir, cache_size=cache_size, readers=readers, empty_ok=empty_ok,
        use_manifest=use_manifest)
    try:
        indexes, cache = indexed or index_source(src, progress, index_dir, memory, runner=runner,
                                                 schema=schema_parts)
        laid = overlay(src) if overlay is not None else None
        store = RecordStore(indexes, src.readers, records=records, decode_raw=decode_raw, writable=writable,
                            overlay=laid, on_bad=cache.save)
        schema = Schema(store, cache.save, jobs.scan_pool)
    except BaseException:
        if src is not source:
            src.close()
        raise
    return DatasetParts(src, indexes, cache, store, schema)
