"""tfrfs as a Ray Data source and sink (SPEC 9): ``tfrfs.ray.read`` and ``tfrfs.ray.write``.

May import: ``tfrfs.library`` (it opens datasets as ``tfrfs.open`` does) and every layer below
the faces; not ``cli`` or ``fuse``.

Ray is optional (``pip install 'tfrfs[ray]'``); it is imported when one of these is called.
"""

from __future__ import annotations

from typing import Any


def read(source: str, *, records: str = "raw", override_num_blocks: int | None = None, **options: Any) -> Any:
    """SOURCE's records as a ``ray.data.Dataset`` (rows of shard, index and record bytes, or, for
    ``records="example"``, one list column per feature key)."""
    from tfrfs.ray.source import read as _read
    return _read(source, records=records, override_num_blocks=override_num_blocks, **options)


def write(dataset: Any, dest: str, *, shards: int | None = None, compression: str = "none", **options: Any) -> Any:
    """Write ``dataset``'s rows as framed shards into DEST, committed once when every write task
    succeeded (all shards or none), with shipped indexes and the manifest. Rows with a ``record``
    column are written byte for byte; ``example`` rows (as ``read(records="example")`` gives them)
    become Examples, or SequenceExamples when they have a ``feature_lists`` column, each value of
    the kind its column's Arrow type says."""
    from tfrfs.ray.sink import write as _write
    return _write(dataset, dest, shards=shards, compression=compression, **options)
