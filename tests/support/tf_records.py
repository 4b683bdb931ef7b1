"""TensorFlow's view of shards, for comparing what tfrfs reads with it. Run under TensorFlow::

    python tests/support/tf_records.py SHARD:COMPRESSION:KIND [...]

For each shard the records are read by ``tf.data.TFRecordDataset`` (until its first
``DataLossError``) and each is parsed by ``tf.train.Example`` or ``tf.train.SequenceExample``.
Printed as JSON: ``{SHARD: {"records": [sha256, ...], "values": [...], "error": str | None}}``
where a record's values are ``{key: [kind, values]}`` (``{"context": ..., "feature_lists": {key:
[[kind, values], ...]}}`` for a SequenceExample), kind as ``WhichOneof("kind")`` (None: no kind),
bytes values as their sha256. Only the standard library and TensorFlow are used: nothing of tfrfs.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402


def feature(f) -> list:
    kind = f.WhichOneof("kind")
    if kind is None:
        return [None, None]
    values = list(getattr(f, kind).value)
    if kind == "bytes_list":
        values = [hashlib.sha256(v).hexdigest() for v in values]
    return [kind, values]


def features(feats) -> dict:
    return {k: feature(f) for k, f in feats.feature.items()}


def parse(data: bytes, kind: str) -> dict | None:
    if kind == "sequence":
        se = tf.train.SequenceExample.FromString(data)
        return {"context": features(se.context),
                "feature_lists": {k: [feature(f) for f in fl.feature] for k, fl in se.feature_lists.feature_list.items()}}
    if kind == "example":
        return features(tf.train.Example.FromString(data).features)
    return None


def read(path: str, compression: str, kind: str) -> dict:
    out: dict = {"records": [], "values": [], "error": None}
    ds = tf.data.TFRecordDataset([path], compression_type="" if compression == "NONE" else compression)
    it = iter(ds)
    while True:
        try:
            data = next(it).numpy()
        except StopIteration:
            break
        except tf.errors.DataLossError as exc:
            out["error"] = str(exc).splitlines()[0]
            break
        out["records"].append(hashlib.sha256(data).hexdigest())
        out["values"].append(parse(data, kind))
    return out


def main(argv: list[str]) -> None:
    result = {}
    for arg in argv:
        path, compression, kind = arg.rsplit(":", 2)
        result[path] = read(path, compression, kind)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
