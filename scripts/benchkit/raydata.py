"""Ray Data read figures for ``scripts/bench --cluster``: ``tfrfs.ray.read`` against
``ray.data.read_tfrecords`` on the same files, each fully consumed (rows and record bytes
counted), and whether the values come through unchanged (one-element lists, empty features).

Runs in the Ray session this process holds (``ray.init`` first), or starts one on this machine.
"""

from __future__ import annotations

import glob
import os
import time
from typing import Any


def _consume(ds: Any, column: str | None) -> tuple[int, int]:
    """(rows, bytes of ``column``) of a dataset, read to the end in batches."""
    import pyarrow as pa
    rows = size = 0
    for batch in ds.iter_batches(batch_format="pyarrow", batch_size=4096):
        rows += batch.num_rows
        if column is not None and column in batch.column_names:
            size += pa.compute.sum(pa.compute.binary_length(batch.column(column))).as_py() or 0
    return rows, size


def _shards(path: str) -> list[str]:
    """The shard files ``ray.data.read_tfrecords`` is given (it takes every file of a folder)."""
    if any(ch in path for ch in "*?["):
        return sorted(glob.glob(path))
    if os.path.isdir(path):
        return sorted(p for p in glob.glob(os.path.join(path, "**", "*"), recursive=True)
                      if os.path.isfile(p) and not p.endswith((".tfrfs-idx", ".tfrfs-manifest", ".json", ".txt")))
    return [path]


def read_figures(path: str, *, blocks: int | None = None, theirs: bool = True) -> dict:
    """Seconds, rows and MB/s of reading ``path`` (a folder, file or glob) through ``tfrfs.ray.read``
    (raw records with a cold index cache, then again, then parsed) and, with ``theirs``, and through ``ray.data.read_tfrecords``; and whether one record's one-element lists
    and empty features keep their shape and kind in each."""
    import ray
    import tfrfs
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    out: dict = {"path": path, "blocks": blocks}
    total = sum(os.path.getsize(p) for p in _shards(path))
    out["bytes"] = total

    import tempfile
    cache = tempfile.mkdtemp(prefix="tfrfs-raydata-")   # a cold cache: the first read indexes
    for key in ("tfrfs_raw_cold_index", "tfrfs_raw"):
        started = time.monotonic()
        rows, size = _consume(tfrfs.ray.read(path, override_num_blocks=blocks, cache_dir=cache), "record")
        seconds = time.monotonic() - started
        out[key] = {"seconds": round(seconds, 3), "rows": rows, "record_bytes": size,
                    "MB/s": round(total / seconds / 1e6, 1)}

    started = time.monotonic()
    parsed = tfrfs.ray.read(path, records="example", override_num_blocks=blocks, cache_dir=cache)
    rows, _ = _consume(parsed, None)
    seconds = time.monotonic() - started
    out["tfrfs_example"] = {"seconds": round(seconds, 3), "rows": rows, "MB/s": round(total / seconds / 1e6, 1)}
    ours = parsed.take(1)[0]

    if not theirs:
        out["values"] = {"tfrfs_lists_kept": all(v is None or isinstance(v, list) for k, v in ours.items()
                                                 if k not in ("shard", "index"))}
        return out
    try:
        started = time.monotonic()
        theirs_ds = ray.data.read_tfrecords(_shards(path), override_num_blocks=blocks)
        rows, _ = _consume(theirs_ds, None)
        seconds = time.monotonic() - started
        out["ray_read_tfrecords"] = {"seconds": round(seconds, 3), "rows": rows,
                                     "MB/s": round(total / seconds / 1e6, 1)}
        theirs = theirs_ds.take(1)[0]
    except Exception as exc:  # noqa: BLE001 - it needs TensorFlow; say why it did not run
        out["ray_read_tfrecords"] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        theirs = None

    # Values as they come out: one-element lists stay lists, and a key whose record holds no value
    # is still an (empty or null) list of its kind in ours.
    out["values"] = {
        "tfrfs_lists_kept": all(v is None or isinstance(v, list) for k, v in ours.items() if k not in ("shard", "index")),
        "read_tfrecords_scalars": None if theirs is None else sorted(
            k for k, v in theirs.items() if v is not None and not isinstance(v, (list, bytes, str))
            and getattr(v, "ndim", 0) == 0),
    }
    return out


if __name__ == "__main__":
    import json
    import sys
    print(json.dumps(read_figures(sys.argv[1], blocks=int(sys.argv[2]) if len(sys.argv) > 2 else None,
                                  theirs=len(sys.argv) <= 3 or sys.argv[3] != "ours"), indent=1))
