"""TensorFlow reads large values written through a --rw mount: staged from their files without
being read into the daemon (``tfrfs.edit.largevalue``), they must reach the shard exactly, in an
Example, in a value of a ``.list/`` folder, in a SequenceExample's context, and as a ``.txt``
(its newline rule) in a GZIP shard."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tfrfs.format import proto
from tfrfs.format import tfrecord

from conftest import REPO, run_tfrfs

pytestmark = [pytest.mark.tf, pytest.mark.mount,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed"),
              pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse")]

MIB = 1 << 20

# Reads each shard as TensorFlow does and prints, per record, the SHA-256 of every bytes value.
TF_READ = textwrap.dedent("""
    import hashlib, json, sys
    import tensorflow as tf
    out = {}
    for path, kind, comp, keys in json.loads(sys.argv[1]):
        rows = []
        for raw in tf.data.TFRecordDataset(path, compression_type=comp):
            spec = {k: tf.io.VarLenFeature(tf.string) for k in keys}
            if kind == "sequence":
                ctx, _ = tf.io.parse_single_sequence_example(raw, context_features=spec)
            else:
                ctx = tf.io.parse_single_example(raw, spec)
            rows.append({k: [hashlib.sha256(v).hexdigest() for v in tf.sparse.to_dense(ctx[k]).numpy().tolist()]
                         for k in keys})
        out[path] = rows
    print(json.dumps(out))
""")


def _write(path: Path, records: list[bytes], compress: bool = False) -> None:
    with (gzip.open(path, "wb") if compress else open(path, "wb")) as f:
        w = tfrecord.StreamWriter(f)
        for r in records:
            w.write(r)
        w.close()


def _example(**values: list[bytes]) -> bytes:
    ex = proto.Example()
    for k, vs in values.items():
        ex.features.feature[k].bytes_list.value.extend(vs)
    return ex.SerializeToString()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_tensorflow_reads_large_values_written_through_the_mount(tfrfs_mount, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    _write(src / "ex.tfrecord", [_example(blob=[b"\0small"], imgs=[b"\0a", b"\0b"]), _example(blob=[b"\0keep"])])
    _write(src / "text.tfrecord.gz", [_example(note=[b"short"])], compress=True)
    seq = proto.SequenceExample()
    seq.context.feature["blob"].bytes_list.value.append(b"\0ctx")
    seq.feature_lists.feature_list["n"].feature.add().int64_list.value.append(1)
    _write(src / "seq.tfrecord", [seq.SerializeToString()])

    big = [os.urandom(3 * MIB + i) for i in range(3)]
    text = b"a line of text\n" * 200_000
    mnt = tfrfs_mount(src, "--rw")
    (mnt / "ex.tfrecord/000000/blob.bin").write_bytes(big[0])
    (mnt / "ex.tfrecord/000000/imgs.list/1.bin").write_bytes(big[1])
    (mnt / "seq.tfrecord/000000/context/blob.bin").write_bytes(big[2])
    (mnt / "text.tfrecord.gz/000000/note.txt").write_bytes(text)
    assert (mnt / "ex.tfrecord/000000/blob.bin").read_bytes() == big[0]
    assert (mnt / "text.tfrecord.gz/000000/note.txt").read_bytes() == text[:-1]   # one newline dropped (SPEC 7)
    proc = run_tfrfs("umount", str(mnt))
    assert proc.returncode == 0, proc.stderr

    shards = [(str(src / "ex.tfrecord"), "example", "", ["blob", "imgs"]),
              (str(src / "seq.tfrecord"), "sequence", "", ["blob"]),
              (str(src / "text.tfrecord.gz"), "example", "GZIP", ["note"])]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
    run = subprocess.run([sys.executable, "-c", TF_READ, json.dumps(shards)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got[shards[0][0]] == [{"blob": [_sha(big[0])], "imgs": [_sha(b"\0a"), _sha(big[1])]},
                                 {"blob": [_sha(b"\0keep")], "imgs": []}]
    assert got[shards[1][0]] == [{"blob": [_sha(big[2])]}]
    assert got[shards[2][0]] == [{"note": [_sha(text[:-1])]}]
