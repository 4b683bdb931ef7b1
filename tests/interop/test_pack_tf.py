"""``tfrfs pack`` read by the real TensorFlow (SPEC 10): every shard TensorFlow wrote for the clean
fixtures (every feature kind and value form of SPEC 3-4, Examples and SequenceExamples, GZIP and
ZLIB), copied out of a real mount with ``cp -a`` and packed back, gzip-compressed: TensorFlow reads
the packed shards and parses every record equal to the original's, in order (each key's kind and
values)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_tfrfs

pytestmark = [pytest.mark.tf, pytest.mark.mount]

READ_SCRIPT = r'''
import json, sys
import tensorflow as tf

def feature(f):
    kind = f.WhichOneof("kind")
    if kind is None:
        return None
    values = getattr(f, kind).value
    return [kind, [v.hex() if isinstance(v, bytes) else repr(v) for v in values]]

def features(fm):
    return {k: feature(f) for k, f in sorted(fm.feature.items())}

# What a parse gives, by TensorFlow's own protos: each key's kind and values (an empty
# sub-message present or absent parses the same; fields of no known number are read by no parse).
out = {}
for name, (comp, path, kind) in json.loads(sys.argv[1]).items():
    got = []
    for r in tf.data.TFRecordDataset([path], compression_type=comp):
        if kind == "sequence":
            m = tf.train.SequenceExample.FromString(r.numpy())
            got.append({"context": features(m.context), "feature_lists": {
                k: [feature(f) for f in fl.feature] for k, fl in sorted(m.feature_lists.feature_list.items())}})
        else:
            got.append(features(tf.train.Example.FromString(r.numpy()).features))
    out[name] = got
print(json.dumps(out))
'''


def _tf_read(groups: dict[str, tuple[str, str, str]]) -> dict[str, list[str]]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", READ_SCRIPT, json.dumps(groups)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_tensorflow_reads_packed_shards_equal(_tf_written: Path, tfrfs_mount, tmp_path: Path) -> None:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed")
    import tfrfs
    clean = _tf_written / "clean"
    with tfrfs.open(str(clean), cache_dir=str(tmp_path / "cache")) as d:
        shards = [(s.path, s.kind, s.compression) for s in d.shards if s.kind in ("example", "sequence")]
    assert shards
    mnt = tfrfs_mount(clean)
    groups: dict[str, tuple[str, str, str]] = {}
    for n, (rel, kind, compression) in enumerate(shards):
        out = tmp_path / f"out{n}"
        subprocess.run(["cp", "-a", str(mnt / rel), str(out)], check=True)
        dest = tmp_path / f"dest{n}"
        proc = run_tfrfs("pack", str(out), str(dest), "--compression", "gzip", "--workers", "1")
        assert proc.returncode == 0, (rel, proc.stderr)
        [packed] = [p for p in dest.iterdir() if p.name.endswith(".gz")]
        groups[f"orig:{rel}"] = ({"NONE": "", "GZIP": "GZIP", "ZLIB": "ZLIB"}[compression], str(clean / rel), kind)
        groups[f"packed:{rel}"] = ("GZIP", str(packed), kind)
    got = _tf_read(groups)
    for rel, _, _ in shards:
        assert got[f"packed:{rel}"] == got[f"orig:{rel}"], rel
    assert sum(len(got[f"orig:{rel}"]) for rel, _, _ in shards) > 50   # (some shards hold none)


def test_tensorflow_reads_a_packed_image_folder(tmp_path: Path) -> None:
    """An image folder packed: TensorFlow's parse_single_example gives each image's bytes, its
    class number (classes in name order) and names."""
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed")
    from PIL import Image
    import io
    src = tmp_path / "pets"
    want = []
    for label, cls in enumerate(("cat", "dog")):
        (src / cls).mkdir(parents=True)
        for i in range(3):
            buf = io.BytesIO()
            Image.new("RGB", (8, 8), (40 * i, 100, 200)).save(buf, "PNG" if i == 2 else "JPEG")
            name = f"{cls}{i}.{'png' if i == 2 else 'jpg'}"
            (src / cls / name).write_bytes(buf.getvalue())
            want.append([buf.getvalue().hex(), label, cls, name])
    proc = run_tfrfs("pack", str(src), str(tmp_path / "dest"), "--layout", "imagefolder", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    script = r'''
import json, sys
import tensorflow as tf
spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64),
        "label_name": tf.io.FixedLenFeature([], tf.string), "filename": tf.io.FixedLenFeature([], tf.string)}
out = []
for r in tf.data.TFRecordDataset([sys.argv[1]]):
    ex = tf.io.parse_single_example(r, spec)
    out.append([ex["image"].numpy().hex(), int(ex["label"]), ex["label_name"].numpy().decode(),
                ex["filename"].numpy().decode()])
print(json.dumps(out))
'''
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    got = subprocess.run([sys.executable, "-c", script, str(tmp_path / "dest" / "pets.tfrecord")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert got.returncode == 0, got.stderr[-3000:]
    assert json.loads(got.stdout.strip().splitlines()[-1]) == want
