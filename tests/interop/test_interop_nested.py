"""Nested values edited in a ``--rw`` mount, committed, and read by REAL TensorFlow.

Shards are written by TensorFlow (``tf.io.TFRecordWriter``, ``tf.train`` messages): a
SequenceExample whose feature list ``frames/jpeg`` has 3 steps of 2 images each (shown as
``jpeg.steps/N.list/M.jpg``), and an Example whose ``image/encoded`` holds 4 images (shown as
``image/encoded.list/``), each beside a second record no edit touches. After each edit and a
commit, TensorFlow reads the shard (``tf.data.TFRecordDataset``) and parses it with its own ops
(``tf.io.parse_single_sequence_example`` with a ``RaggedFeature`` for the steps,
``tf.io.parse_single_example`` for the list): the remaining items, in order, and nothing else
changed. One TensorFlow worker process serves the whole module (importing TensorFlow takes seconds).
"""

from __future__ import annotations

import base64
import importlib.util
import io
import os
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
from PIL import Image

from conftest import run_tfrfs
from support.tfworker import TfWorker

pytestmark = [pytest.mark.tf, pytest.mark.mount]

# Requests on stdin, one JSON object a line; answers "OK <json>" or "ERR <message>".
#   {"op": "write", "path": P, "kind": "sequence"|"example", "records": [R, ...]}: R is
#     {"context": {key: [b64]}, "lists": {key: [[b64, ...], ...]}} or {"features": {key: [b64]}}
#   {"op": "read", "path": P, "kind": ...}: every record as TensorFlow reads and parses it
WORKER = r'''
import base64, json, os, sys, traceback
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf

b64 = lambda v: base64.b64encode(v).decode()
raw = lambda s: base64.b64decode(s)


def feature(values):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[raw(v) for v in values]))


def write(path, kind, records):
    with tf.io.TFRecordWriter(path) as w:
        for r in records:
            if kind == "sequence":
                m = tf.train.SequenceExample()
                for k, v in r["context"].items():
                    m.context.feature[k].CopyFrom(feature(v))
                for k, steps in r["lists"].items():
                    fl = m.feature_lists.feature_list[k]
                    for s in steps:
                        fl.feature.add().CopyFrom(feature(s))
            else:
                m = tf.train.Example(features=tf.train.Features(feature={k: feature(v) for k, v in r["features"].items()}))
            w.write(m.SerializeToString())
    return None


def values(f):
    kind = f.WhichOneof("kind")
    return [kind, [b64(v) if isinstance(v, bytes) else v for v in getattr(f, kind).value] if kind else []]


def read(path, kind):
    out = []
    for rec in tf.data.TFRecordDataset(path):
        data = rec.numpy()
        if kind == "sequence":
            m = tf.train.SequenceExample.FromString(data)
            parsed = {"context": {k: values(f) for k, f in m.context.feature.items()},
                      "lists": {k: [values(s) for s in fl.feature] for k, fl in m.feature_lists.feature_list.items()}}
            ragged = {k: tf.io.RaggedFeature(tf.string) for k, fl in m.feature_lists.feature_list.items()
                      if all(s.WhichOneof("kind") == "bytes_list" for s in fl.feature)}
            _, seq = tf.io.parse_single_sequence_example(data, sequence_features=ragged)
            parsed["op"] = {k: [[b64(v) for v in step] for step in t.to_list()] for k, t in seq.items()}
        else:
            m = tf.train.Example.FromString(data)
            parsed = {"features": {k: values(f) for k, f in m.features.feature.items()}}
            spec = {k: tf.io.VarLenFeature(tf.string) for k in m.features.feature}
            got = tf.io.parse_single_example(data, spec)
            parsed["op"] = {k: [b64(v) for v in t.values.numpy().tolist()] for k, t in got.items()}
        parsed["bytes"] = b64(data)
        out.append(parsed)
    return out


print("READY", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    try:
        if req["op"] == "write":
            result = write(req["path"], req["kind"], req["records"])
        else:
            result = read(req["path"], req["kind"])
        print("OK " + json.dumps(result), flush=True)
    except Exception:
        print("ERR " + traceback.format_exc().replace("\n", " | "), flush=True)
'''


class TensorFlow(TfWorker):
    def __init__(self) -> None:
        super().__init__(WORKER)

    def ask(self, **req: Any) -> Any:
        return self.request(req)


@pytest.fixture(scope="module")
def tf() -> Iterator[TensorFlow]:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")
    worker = TensorFlow()
    yield worker
    worker.close()


def _image(fmt: str, n: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (3, 2), (50 * n % 256, 90 + 20 * n % 150, 255 - 25 * n % 256)).save(buf, format=fmt)
    return buf.getvalue()


STEPS = [[_image("JPEG", 2 * s + i) for i in range(2)] for s in range(3)]     # 3 steps of 2 images
IMAGES = [_image("JPEG", 10), _image("PNG", 11), _image("PNG", 12), _image("JPEG", 13)]
NEW = [_image("JPEG", 20), _image("JPEG", 21)]
OTHER_STEPS = [[_image("JPEG", 30), _image("JPEG", 31)]]
assert len({*map(bytes, sum(STEPS, [])), *IMAGES, *NEW, *sum(OTHER_STEPS, [])}) == 6 + 4 + 2 + 2


def _b64(values: list[bytes]) -> list[str]:
    return [base64.b64encode(v).decode() for v in values]


def _sequence_records(steps: list[list[bytes]]) -> list[dict]:
    return [{"context": {"id": _b64([b"clip-0"])}, "lists": {"frames/jpeg": [_b64(s) for s in steps]}},
            {"context": {"id": _b64([b"clip-1"])}, "lists": {"frames/jpeg": [_b64(s) for s in OTHER_STEPS]}}]


def _example_records(images: list[bytes]) -> list[dict]:
    return [{"features": {"image/encoded": _b64(images), "label": _b64([b"cat"])}},
            {"features": {"image/encoded": _b64(IMAGES[:2]), "label": _b64([b"dog"])}}]


def _source(tmp_path: Path, tf: TensorFlow, kind: str) -> tuple[Path, Path, list[dict]]:
    """A source folder holding one shard written by TensorFlow; the shard, and TensorFlow's view of it."""
    src = tmp_path / "src"
    src.mkdir()
    shard = src / ("clips.tfrecord" if kind == "sequence" else "images.tfrecord")
    records = _sequence_records(STEPS) if kind == "sequence" else _example_records(IMAGES)
    tf.ask(op="write", path=str(shard), kind=kind, records=records)
    return src, shard, tf.ask(op="read", path=str(shard), kind=kind)


def _edit_and_commit(src: Path, tfrfs_mount: Any, command: str, folder: str) -> None:
    """Run ``command`` in the record folder ``folder`` of a --rw mount, then unmount (which commits)."""
    mnt = tfrfs_mount(src, "--rw")
    subprocess.run(["sh", "-ec", command], cwd=mnt / folder, check=True, capture_output=True)
    proc = run_tfrfs("umount", str(mnt))
    assert proc.returncode == 0, proc.stderr


def _read_steps(tf: TensorFlow, shard: Path, before: list[dict]) -> list[list[bytes]]:
    """The steps of frames/jpeg of the first record as TensorFlow reads them after the commit,
    having checked that nothing else changed: the context, and the second record byte for byte."""
    after = tf.ask(op="read", path=str(shard), kind="sequence")
    assert len(after) == 2
    assert after[1]["bytes"] == before[1]["bytes"]
    assert after[0]["context"] == before[0]["context"]
    assert list(after[0]["lists"]) == ["frames/jpeg"]
    steps = [[base64.b64decode(v) for v in s] for kind, s in after[0]["lists"]["frames/jpeg"] if kind == "bytes_list"]
    assert len(steps) == len(after[0]["lists"]["frames/jpeg"])
    # TensorFlow's own parsing op reads the same steps.
    assert [[base64.b64decode(v) for v in s] for s in after[0]["op"]["frames/jpeg"]] == steps
    return steps


def _read_images(tf: TensorFlow, shard: Path, before: list[dict]) -> dict[str, list[bytes]]:
    """The bytes features of the first record as TensorFlow reads them after the commit, having
    checked that the second record is byte for byte what it was."""
    after = tf.ask(op="read", path=str(shard), kind="example")
    assert len(after) == 2
    assert after[1]["bytes"] == before[1]["bytes"]
    feats = {k: [base64.b64decode(v) for v in values] for k, (kind, values) in after[0]["features"].items()}
    assert {k: [base64.b64decode(v) for v in values] for k, values in after[0]["op"].items()} == feats
    return feats


STEPS_DIR = "clips.tfrecord/000000/feature_lists/frames/jpeg.steps"
RECORD = "images.tfrecord/000000"


def test_removing_one_image_of_one_step(tmp_path: Path, tfrfs_mount: Any, tf: TensorFlow) -> None:
    src, shard, before = _source(tmp_path, tf, "sequence")
    _edit_and_commit(src, tfrfs_mount, "rm 1.list/0.jpg", STEPS_DIR)
    assert _read_steps(tf, shard, before) == [STEPS[0], [STEPS[1][1]], STEPS[2]]


def test_removing_a_whole_step(tmp_path: Path, tfrfs_mount: Any, tf: TensorFlow) -> None:
    src, shard, before = _source(tmp_path, tf, "sequence")
    _edit_and_commit(src, tfrfs_mount, "rm -r 1.list", STEPS_DIR)
    assert _read_steps(tf, shard, before) == [STEPS[0], STEPS[2]]


def test_writing_and_creating_items_in_a_steps_list(tmp_path: Path, tfrfs_mount: Any, tf: TensorFlow) -> None:
    src, shard, before = _source(tmp_path, tf, "sequence")
    new0, new1 = (tmp_path / "new0.jpg", tmp_path / "new1.jpg")
    new0.write_bytes(NEW[0])
    new1.write_bytes(NEW[1])
    _edit_and_commit(src, tfrfs_mount, f"cp {new0} 0.list/1.jpg && cat {new1} > 2.list/2.jpg", STEPS_DIR)
    assert _read_steps(tf, shard, before) == [[STEPS[0][0], NEW[0]], STEPS[1], STEPS[2] + [NEW[1]]]


def test_mv_of_a_list_folder_with_gaps(tmp_path: Path, tfrfs_mount: Any, tf: TensorFlow) -> None:
    src, shard, before = _source(tmp_path, tf, "example")
    _edit_and_commit(src, tfrfs_mount, "rm image/encoded.list/1.png && mv image/encoded.list image/moved.list",
                     RECORD)
    assert _read_images(tf, shard, before) == {"image/moved": [IMAGES[0], IMAGES[2], IMAGES[3]], "label": [b"cat"]}


def test_removing_an_item_of_an_examples_list(tmp_path: Path, tfrfs_mount: Any, tf: TensorFlow) -> None:
    src, shard, before = _source(tmp_path, tf, "example")
    _edit_and_commit(src, tfrfs_mount, "rm image/encoded.list/2.png", RECORD)
    assert _read_images(tf, shard, before) == {"image/encoded": [IMAGES[0], IMAGES[1], IMAGES[3]],
                                               "label": [b"cat"]}
