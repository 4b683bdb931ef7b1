"""TensorFlow's side of the ``example`` rows round trip (``test_raydata_roundtrip.py``). Run under
TensorFlow, in a subprocess (TensorFlow never in the test process nor in a Ray worker)::

    python tests/cluster/tf_roundtrip.py write sequence|example SHARD
    python tests/cluster/tf_roundtrip.py check sequence|example SOURCE WRITTEN [...]

``write`` writes 20 records with ``tf.io.TFRecordWriter`` from TensorFlow's own messages: empty
lists, Features with no kind (one key always so), empty feature lists and steps, steps with no
kind; for Examples also a key of two kinds across records. Each is serialized deterministically
(sorted map keys), so records that ``tfrfs.ray.write`` can give back unchanged compare byte for
byte.

``check`` reads SOURCE and the WRITTEN shards (in order) with ``tf.data.TFRecordDataset`` and
prints JSON ``{"records", "unchanged", "byte_equal", "differences"}``: every written record must
parse (``tf.train.*.FromString``) equal to its source record once the source's empty lists and
empty feature lists are dropped (``example`` rows cannot tell them from absent ones), and
``tf.io.parse_single_sequence_example`` / ``parse_single_example`` with VarLen specs must give
equal tensors; ``unchanged`` counts the source records that had nothing to drop, ``byte_equal``
the written records equal to their source byte for byte. Nothing of tfrfs is used here.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

COUNT = 20
INT64_MIN = -(2 ** 63)


def f_int(*v: int) -> tf.train.Feature:
    f = tf.train.Feature()
    f.int64_list.SetInParent()   # a kind even with no values
    f.int64_list.value.extend(v)
    return f


def f_float(*v: float) -> tf.train.Feature:
    f = tf.train.Feature()
    f.float_list.SetInParent()
    f.float_list.value.extend(v)
    return f


def f_bytes(*v: bytes) -> tf.train.Feature:
    f = tf.train.Feature()
    f.bytes_list.SetInParent()
    f.bytes_list.value.extend(v)
    return f


def f_none() -> tf.train.Feature:
    return tf.train.Feature()


def sequence_record(i: int) -> tf.train.SequenceExample:
    ctx: dict[str, tf.train.Feature] = {"label": f_int(i) if i != 3 else f_int()}   # 3: an empty context list
    if i == 7:
        ctx["name"] = f_bytes(b"\x80\x00not text", b"two")
    elif i != 5:
        ctx["name"] = f_bytes(f"seq-{i}".encode())
    if i % 4 == 1:
        ctx["note"] = f_none()                     # no kind here, bytes elsewhere
    elif i % 4 == 2:
        ctx["note"] = f_bytes(b"n" * i)
    if i in (0, 9):
        ctx["void"] = f_none()                     # never has a kind: a column of nulls
    lists: dict[str, list[tf.train.Feature]] = {
        # i % 5 == 0: a feature list of no steps; step 1 an empty float step
        "frames": [f_float(i + j / 4, -0.1 * j, 1e-30) if j != 1 else f_float() for j in range(i % 5)],
    }
    if i % 3 != 0:
        lists["tokens"] = [] if i == 4 else [f_int(i, j, INT64_MIN) for j in range(1 + i % 4)]
    if i in (2, 11):
        lists["marks"] = [f_none(), f_none()]      # steps with no kind
    se = tf.train.SequenceExample(context=tf.train.Features(feature=ctx))
    se.feature_lists.SetInParent()
    for key, steps in lists.items():
        fl = se.feature_lists.feature_list[key]
        for step in steps:
            fl.feature.add().CopyFrom(step)
    return se


def example_record(i: int) -> tf.train.Example:
    feats: dict[str, tf.train.Feature] = {"id": f_int(i) if i != 6 else f_int()}
    if i == 8:
        feats["score"] = f_float()
    elif i != 2:
        feats["score"] = f_float(i * 0.5, 1 / 3, float("inf"))
    if i != 4:
        feats["blob"] = f_bytes(bytes([0x80, i, 0]))
    if i % 4 == 1:
        feats["note"] = f_none()
    elif i % 4 == 2:
        feats["note"] = f_bytes(b"x" * i)
    if i in (0, 13):
        feats["void"] = f_none()
    # Two kinds across records: a struct column of one list per kind.
    if i == 9:
        feats["mixed"] = f_int()
    elif i % 3 == 0:
        feats["mixed"] = f_int(i, -i)
    elif i % 3 == 1:
        feats["mixed"] = f_float(i + 0.25)
    elif i == 5:
        feats["mixed"] = f_none()
    return tf.train.Example(features=tf.train.Features(feature=feats))


def write(kind: str, path: str) -> None:
    make = sequence_record if kind == "sequence" else example_record
    with tf.io.TFRecordWriter(path) as w:
        for i in range(COUNT):
            w.write(make(i).SerializeToString(deterministic=True))


def _empty(f: tf.train.Feature) -> bool:
    kind = f.WhichOneof("kind")
    return kind is not None and len(getattr(f, kind).value) == 0


def _drop_empty(feats: tf.train.Features) -> bool:
    gone = [k for k, f in feats.feature.items() if _empty(f)]
    for k in gone:
        del feats.feature[k]
    return bool(gone)


def without_empty(message: tf.train.Example | tf.train.SequenceExample) -> bool:
    """Drop what ``example`` rows give as absent: empty lists (and empty feature lists)."""
    if isinstance(message, tf.train.Example):
        return _drop_empty(message.features)
    dropped = _drop_empty(message.context)
    lists = message.feature_lists.feature_list
    gone = [k for k, fl in lists.items() if len(fl.feature) == 0]
    for k in gone:
        del lists[k]
    return dropped or bool(gone)


def specs(kind: str) -> tuple[dict, dict]:
    v = tf.io.VarLenFeature
    if kind == "sequence":
        return ({"label": v(tf.int64), "name": v(tf.string), "note": v(tf.string)},
                {"frames": v(tf.float32), "tokens": v(tf.int64)})
    return {"id": v(tf.int64), "score": v(tf.float32), "blob": v(tf.string), "note": v(tf.string)}, {}


def tensors(kind: str, data: bytes) -> dict[str, tf.SparseTensor]:
    ctx, seq = specs(kind)
    if kind == "sequence":
        context, sequence = tf.io.parse_single_sequence_example(data, ctx, seq)
        return {**{"context " + k: t for k, t in context.items()}, **{"list " + k: t for k, t in sequence.items()}}
    return tf.io.parse_single_example(data, ctx)


def _same(a: tf.SparseTensor, b: tf.SparseTensor) -> bool:
    return (a.dtype == b.dtype and np.array_equal(a.indices.numpy(), b.indices.numpy())
            and np.array_equal(a.values.numpy(), b.values.numpy())
            and np.array_equal(a.dense_shape.numpy(), b.dense_shape.numpy()))


def records(paths: list[str]) -> list[bytes]:
    return [r.numpy() for r in tf.data.TFRecordDataset(paths)]


def check(kind: str, source: str, written: list[str]) -> dict:
    cls = tf.train.SequenceExample if kind == "sequence" else tf.train.Example
    want, got = records([source]), records(written)
    out: dict = {"records": len(got), "unchanged": 0, "byte_equal": 0, "differences": []}
    if len(want) != len(got):
        out["differences"].append(f"{len(got)} records written for {len(want)}")
        return out
    for n, (src, new) in enumerate(zip(want, got)):
        expected = cls.FromString(src)
        out["unchanged"] += not without_empty(expected)
        out["byte_equal"] += src == new
        parsed = cls.FromString(new)
        if parsed != expected:
            out["differences"].append(f"record {n}: wrote {parsed} for {expected}")
        a, b = tensors(kind, src), tensors(kind, new)
        for key in a:
            if not _same(a[key], b[key]):
                out["differences"].append(f"record {n} {key}: {b[key]} for {a[key]}")
    return out


def main(argv: list[str]) -> None:
    if argv[0] == "write":
        write(argv[1], argv[2])
    else:
        json.dump(check(argv[1], argv[2], argv[3:]), sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
