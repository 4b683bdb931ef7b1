"""``tfrfs reshard`` output read by the real TensorFlow and TFDS: the same records in the same
order (the same multiset under ``--shuffle``) for none/gzip/zlib output, a damaged source's sound
records with every drop reported, and a TFDS dataset that ``tfds.builder_from_directory`` loads
with the new split lengths.

TensorFlow and TFDS run in subprocesses (their imports take seconds): one for all the reads.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfrfs.index import manifest
from tfrfs.format import proto
from tfrfs.format import tfrecord

from conftest import REPO, run_tfrfs

pytestmark = [pytest.mark.tf]

READ_SCRIPT = r'''
import hashlib, json, sys
import tensorflow as tf
out = {}
for name, (comp, files) in json.loads(sys.argv[1]).items():
    ds = tf.data.TFRecordDataset(files, compression_type=comp)
    out[name] = [hashlib.sha256(r.numpy()).hexdigest() for r in ds]
print(json.dumps(out))
'''


def _need_tf() -> None:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed")


def tf_read(groups: dict[str, tuple[str, list[str]]]) -> dict[str, list[str]]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", READ_SCRIPT, json.dumps(groups)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _record(i: int) -> bytes:
    ex = proto.Example()
    ex.features.feature["id"].int64_list.value.append(i)
    ex.features.feature["blob"].bytes_list.value.append(hashlib.sha256(str(i).encode()).digest() * (i % 7))
    return ex.SerializeToString()


def _make_source(root: Path, shards: int = 3, per: int = 50) -> list[bytes]:
    root.mkdir(parents=True)
    records = []
    for s in range(shards):
        mine = [_record(s * per + i) for i in range(per)]
        records += mine
        (root / f"data-{s:05d}-of-{shards:05d}.tfrecord").write_bytes(b"".join(tfrecord.frame(r) for r in mine))
    return records


def _sha(records: list[bytes]) -> list[str]:
    return [hashlib.sha256(r).hexdigest() for r in records]


def _shards(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.iterdir() if p.name.endswith(".tfrecord"))


CASES = {
    "plain": (["--shards", "4"], "", False),
    "by-size": (["--shard-size", "2K"], "", False),
    "gzip": (["--shards", "2", "--compression", "gzip"], "GZIP", False),
    "zlib": (["--shards", "5", "--compression", "zlib"], "ZLIB", False),
    "shuffled": (["--shards", "3", "--shuffle", "11"], "", True),
    "shuffled-gzip": (["--shards", "3", "--shuffle", "11", "--compression", "gzip"], "GZIP", True),
}


@pytest.fixture(scope="module")
def resharded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    _need_tf()
    base = tmp_path_factory.mktemp("reshard")
    records = _make_source(base / "src")
    out = {}
    for name, (opts, comp, _) in CASES.items():
        dest = base / name
        proc = run_tfrfs("reshard", str(base / "src"), str(dest), *opts, "--cache-dir", str(base / "cache"),
                         "--workers", "2", cwd=REPO)
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
        out[name] = (comp, _shards(dest))
    return {"records": records, "files": out, "read": tf_read(out), "base": base}


@pytest.mark.parametrize("case", list(CASES))
def test_tensorflow_reads_the_records_exactly(resharded: dict, case: str) -> None:
    want = _sha(resharded["records"])
    got = resharded["read"][case]
    if CASES[case][2]:
        assert sorted(got) == sorted(want) and got != want
    else:
        assert got == want


def test_shards_are_cut_as_asked_and_indexed(resharded: dict) -> None:
    base = resharded["base"]
    names = [Path(p).name for p in resharded["files"]["plain"][1]]
    assert names == [f"data-{i:05d}-of-00004.tfrecord" for i in range(4)]
    counts = [len(list(tfrecord.iter_records(p))) for p in resharded["files"]["zlib"][1]]
    assert counts == [30] * 5
    sizes = [os.path.getsize(p) for p in resharded["files"]["by-size"][1]]
    assert max(sizes) <= 2048 and len(sizes) > 2
    m = manifest.parse((base / "plain" / manifest.NAME).read_bytes())
    assert [e.count for e in m.shards] == [38, 38, 37, 37]
    assert all((base / "plain" / (e.path + ".tfrfs-idx")).is_file() for e in m.shards)
    assert m.schema is not None and set(m.schema["features"]) == {"id", "blob"}
    assert m.schema["features"]["id"]["records"] == 150
    # Shuffled the same way, whatever the compression.
    a = [r for p in resharded["files"]["shuffled"][1] for r in tfrecord.iter_records(p)]
    b = [r for p in resharded["files"]["shuffled-gzip"][1] for r in tfrecord.iter_records(p)]
    assert a == b


def test_a_damaged_source_keeps_every_sound_record(tmp_path: Path) -> None:
    _need_tf()
    records = [_record(i) for i in range(30)]
    frames = [tfrecord.frame(r) for r in records]
    buf = bytearray(b"".join(frames))
    at = sum(map(len, frames[:5]))
    buf[at + 14] ^= 1                       # record 5's data
    at = sum(map(len, frames[:12]))
    buf[at + 3] ^= 1                        # record 12's header: a gap
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "bad.tfrecord").write_bytes(bytes(buf))
    proc = run_tfrfs("reshard", str(tmp_path / "src"), str(tmp_path / "out"), "--shards", "2",
                     "--cache-dir", str(tmp_path / "cache"), cwd=REPO)
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.endswith("(not copied)")]
    assert len(lines) == 2 and "bad.tfrecord" in lines[0], proc.stdout
    got = tf_read({"out": ("", _shards(tmp_path / "out"))})["out"]
    assert got == _sha([r for i, r in enumerate(records) if i not in (5, 12)])


# --- TFDS ---------------------------------------------------------------------------------------

def test_tfds_loads_a_resharded_dataset(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    if importlib.util.find_spec("tensorflow_datasets") is None:
        pytest.skip("tensorflow-datasets is not installed")
    from test_interop_tfds import check_in_step, run_tfds
    folder = Path(run_tfds("build", str(tmp_path_factory.mktemp("tfds"))))
    dest = tmp_path / "toy" / "1.0.0"
    dest.parent.mkdir(parents=True)
    proc = run_tfrfs("reshard", str(folder), str(dest), "--shards", "3", "--cache-dir", str(tmp_path / "cache"),
                     cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in dest.glob("toy-*") if not p.name.endswith(".tfrfs-idx"))
    assert names == [f"toy-{s}.tfrecord-0000{i}-of-00003" for s in ("test", "train") for i in range(3)]
    assert (dest / "features.json").read_bytes() == (folder / "features.json").read_bytes()
    view = json.loads(run_tfds("read", str(dest)))
    assert view["train"]["shard_lengths"] == [4, 3, 3] and view["test"]["shard_lengths"] == [2, 2, 2]
    assert view["train"]["n"] == list(range(10)) and view["test"]["n"] == list(range(100, 106))
    check_in_step(dest, view)
