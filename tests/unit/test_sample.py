"""The built-in sample dataset: every shard reads back, parses, and is deterministic."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import cast

import pytest
from PIL import Image

from tfrfs.sample import CLASS_ID, main, write_sample

from support import example_pb, reference

OD_SHARDS = {
    "train/train-00000-of-00002.tfrecord": 12,
    "train/train-00001-of-00002.tfrecord": 12,
    "val/val-00000-of-00001.tfrecord": 6,
}
SHARDS = {
    **OD_SHARDS,
    "mnist_raw.tfrecord": 20,
    "raw_rgb.tfrecord": 8,
    "clips.tfrecord": 4,
    "tabular.tfrecord.gz": 50,
}
PLAIN = {"label_map.pbtxt", "dataset_info.json"}


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("sample")
    write_sample(dest)
    return dest


def _examples(path: Path) -> list:
    return [example_pb.Example.FromString(r) for r in reference.written_records(path)]


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_layout_and_size(tmp_path: Path) -> None:
    written = write_sample(tmp_path)
    assert {p.relative_to(tmp_path).as_posix() for p in written} == set(SHARDS) | PLAIN
    assert _files(tmp_path) == set(SHARDS) | PLAIN
    assert sum(p.stat().st_size for p in written) < 2_000_000


def test_record_counts_and_kinds(sample: Path) -> None:
    for rel, count in SHARDS.items():
        records = reference.written_records(sample / rel)
        assert len(records) == count, rel
        for data in records:
            # Every Example also parses as a SequenceExample: the kind is told by feature_lists.
            seq = example_pb.SequenceExample.FromString(data)
            assert bool(seq.feature_lists.feature_list) == (rel == "clips.tfrecord"), rel
    assert (sample / "tabular.tfrecord.gz").read_bytes()[:2] == b"\x1f\x8b"


def test_object_detection_records(sample: Path) -> None:
    formats = set()
    filenames = []
    object_counts = []
    for rel in OD_SHARDS:
        for ex in _examples(sample / rel):
            f = ex.features.feature
            fmt = f["image/format"].bytes_list.value[0].decode()
            formats.add(fmt)
            (encoded,) = f["image/encoded"].bytes_list.value
            img = Image.open(io.BytesIO(encoded))
            img.load()
            assert img.format == {"jpeg": "JPEG", "png": "PNG"}[fmt]
            assert img.size == (f["image/width"].int64_list.value[0], f["image/height"].int64_list.value[0])
            filename = f["image/filename"].bytes_list.value[0].decode()
            filenames.append(filename)
            assert filename.endswith({"jpeg": ".jpg", "png": ".png"}[fmt])
            assert f["image/source_id"].bytes_list.value[0].decode().isdigit()

            xmin, ymin, xmax, ymax = (list(f[f"image/object/bbox/{k}"].float_list.value)
                                      for k in ("xmin", "ymin", "xmax", "ymax"))
            texts = [t.decode() for t in f["image/object/class/text"].bytes_list.value]
            labels = list(f["image/object/class/label"].int64_list.value)
            assert len(xmin) == len(ymin) == len(xmax) == len(ymax) == len(texts) == len(labels)
            assert labels == [CLASS_ID[t] for t in texts]
            for box in zip(xmin, ymin, xmax, ymax):
                assert all(0.0 <= v <= 1.0 for v in box), box
                assert box[0] < box[2] and box[1] < box[3], box
            # An empty list must still carry its kind, or the feature would show as `null`.
            assert f["image/object/bbox/xmin"].WhichOneof("kind") == "float_list"
            assert f["image/object/class/text"].WhichOneof("kind") == "bytes_list"
            object_counts.append(len(texts))
    assert formats == {"jpeg", "png"}
    assert "Zoë.jpg" in filenames
    assert 0 in object_counts and 1 in object_counts and max(object_counts) >= 3


def test_first_record_of_each_shard_has_several_objects(sample: Path) -> None:
    # The demo shows image/object/class/text.json of record 000000: several values make a .json.
    for rel in OD_SHARDS:
        first = _examples(sample / rel)[0]
        assert len(first.features.feature["image/object/class/text"].bytes_list.value) >= 2


def test_raw_pixel_arrays(sample: Path) -> None:
    for rel, key, prefix, depth_key in (("mnist_raw.tfrecord", "image_raw", "", "depth"),
                                        ("raw_rgb.tfrecord", "image/encoded", "image/", "image/channels")):
        for ex in _examples(sample / rel):
            f = ex.features.feature
            h = f[prefix + "height"].int64_list.value[0]
            w = f[prefix + "width"].int64_list.value[0]
            c = f[depth_key].int64_list.value[0]
            (pixels,) = f[key].bytes_list.value
            assert len(pixels) == h * w * c
            img = Image.frombytes({1: "L", 3: "RGB"}[c], (w, h), pixels)
            lo, hi = cast("tuple[int, int]", img.convert("L").getextrema())
            assert hi - lo > 60  # something is drawn, not a flat fill
    labels = [ex.features.feature["label"].int64_list.value[0] for ex in _examples(sample / "mnist_raw.tfrecord")]
    assert sorted(set(labels)) == list(range(10))


def test_sequence_clips(sample: Path) -> None:
    for data in reference.written_records(sample / "clips.tfrecord"):
        seq = example_pb.SequenceExample.FromString(data)
        ctx = seq.context.feature
        assert ctx["video/id"].bytes_list.value[0].startswith(b"clip-")
        n = ctx["video/num_frames"].int64_list.value[0]
        lists = seq.feature_lists.feature_list
        assert set(lists) == {"frames/boxes", "frames/tags", "frames/jpeg"}
        assert all(len(lists[k].feature) == n for k in lists)
        for step in lists["frames/boxes"].feature:
            box = list(step.float_list.value)
            assert len(box) == 4 and all(0.0 <= v <= 1.0 for v in box)
        for step in lists["frames/tags"].feature:
            assert step.bytes_list.value and all(v.decode() for v in step.bytes_list.value)
        for step in lists["frames/jpeg"].feature:
            (jpeg,) = step.bytes_list.value
            img = Image.open(io.BytesIO(jpeg))
            assert img.format == "JPEG" and img.size == (64, 48)


def test_tabular(sample: Path) -> None:
    rows = _examples(sample / "tabular.tfrecord.gz")
    assert [r.features.feature["customer_id"].int64_list.value[0] for r in rows] == list(range(10_000, 10_050))
    with_notes = sum("notes" in r.features.feature for r in rows)
    assert 0 < with_notes < len(rows)  # an optional column
    cities = {r.features.feature["city"].bytes_list.value[0].decode() for r in rows}
    assert any(not c.isascii() for c in cities)


def test_plain_files(sample: Path) -> None:
    info = json.loads((sample / "dataset_info.json").read_text(encoding="utf-8"))
    assert {rel: s["records"] for rel, s in info["shards"].items()} == SHARDS
    label_map = (sample / "label_map.pbtxt").read_text(encoding="utf-8")
    for name, cid in CLASS_ID.items():
        assert f'name: "{name}"' in label_map and f"id: {cid}" in label_map


def test_deterministic(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    write_sample(a)
    write_sample(b)
    assert _files(a) == _files(b)
    for rel in _files(a):
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def test_main_refuses_a_non_empty_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "new" / "sample"
    assert main([str(dest)]) == 0
    assert (dest / "clips.tfrecord").is_file()
    capsys.readouterr()
    assert main([str(dest)]) == 2
    err = capsys.readouterr().err
    assert "not empty" in err and str(dest) in err
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main([str(afile)]) == 2


@pytest.mark.tf
def test_tensorflow_reads_every_shard(sample: Path) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tf = pytest.importorskip("tensorflow")

    def records(rel: str) -> list[bytes]:
        compression = "GZIP" if rel.endswith(".gz") else ""
        ds = tf.data.TFRecordDataset(str(sample / rel), compression_type=compression)
        return [r.numpy() for r in ds]

    for rel, count in SHARDS.items():
        data = records(rel)
        assert len(data) == count, rel
        if rel == "clips.tfrecord":
            seqs = [tf.train.SequenceExample.FromString(d) for d in data]
            assert seqs[0].context.feature["video/id"].bytes_list.value == [b"clip-0001"]
            frames = seqs[0].feature_lists.feature_list["frames/jpeg"].feature
            img = tf.io.decode_jpeg(frames[0].bytes_list.value[0])
            assert tuple(img.shape) == (48, 64, 3)
        else:
            examples = [tf.train.Example.FromString(d) for d in data]
            assert all(ex.features.feature for ex in examples), rel

    first = tf.train.Example.FromString(records("train/train-00000-of-00002.tfrecord")[0]).features.feature
    img = tf.io.decode_image(first["image/encoded"].bytes_list.value[0])
    assert tuple(img.shape) == (120, 160, 3)
    assert first["image/format"].bytes_list.value == [b"jpeg"]

    parsed = tf.io.parse_single_example(records("mnist_raw.tfrecord")[3], {
        "image_raw": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    })
    assert int(parsed["label"]) == 3
    assert tf.io.decode_raw(parsed["image_raw"], tf.uint8).shape == (28 * 28,)

    rows = [tf.train.Example.FromString(d) for d in records("tabular.tfrecord.gz")]
    assert rows[0].features.feature["customer_id"].int64_list.value == [10_000]
