"""SPEC 9: what ``tfrfs.ray.read(records="raw")`` returns, written by ``tfrfs.ray.write``, gives back
the same records byte for byte and in order, on TensorFlow-written shards (every kind of feature,
GZIP and ZLIB, SequenceExamples) and on the real data; TensorFlow reads the written shards as it
reads the originals. What ``read(records="example")`` returns, written back, gives records that
TensorFlow parses equal to the source's (an empty list or feature list coming back absent), for
Examples and SequenceExamples, and byte for byte where nothing was empty."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tfrfs
from support.tfview import sha, tf_view

ray = pytest.importorskip("ray")

TESTS = Path(__file__).resolve().parent.parent
TF_ROUNDTRIP = Path(__file__).resolve().parent / "tf_roundtrip.py"


@pytest.fixture(scope="module")
def interop(tf_written: Path) -> Path:
    return tf_written / "clean"


def sound_records(source: Path, cache: Path) -> list[bytes]:
    """Every record whose checksums hold, in the dataset's order, as ``tfrfs.open`` gives them."""
    out = []
    with tfrfs.open(str(source), cache_dir=str(cache)) as ds:
        for s in ds.shards:
            i = 0
            while i < s.records:
                try:
                    for data in ds.records(s.path, i):
                        out.append(data)
                        i += 1
                except tfrfs.DamagedRecord as exc:
                    i = exc.index + 1
    return out


def written_records(dest: Path, cache: Path) -> list[bytes]:
    with tfrfs.open(str(dest), cache_dir=str(cache)) as ds:
        return [data for s in ds.shards for data in ds.records(s.path, 0)]


def test_interop_shards_come_back_byte_for_byte(ray_local, interop: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    want = sound_records(interop, cache)
    dest = tmp_path / "out"
    got = tfrfs.ray.write(tfrfs.ray.read(str(interop), cache_dir=str(cache), override_num_blocks=5), str(dest))
    assert got["records"] == len(want)
    assert written_records(dest, cache) == want
    # TensorFlow reads the written shards: the same records, in the same order.
    names = sorted(p.name for p in dest.iterdir() if p.name.endswith(".tfrecord"))
    view = tf_view([(str(dest / n), "NONE", "raw") for n in names])
    assert [h for n in names for h in view[str(dest / n)]["records"]] == [sha(r) for r in want]
    assert (dest / ".tfrfs-manifest").is_file() and all((dest / (n + ".tfrfs-idx")).is_file() for n in names)


def test_realdata_comes_back_byte_for_byte(ray_local, realdata: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    want = sound_records(realdata, cache)
    assert len(want) > 100
    dest = tmp_path / "out"
    # The damaged files' bad records are left out, named in the log (never passed on silently).
    tfrfs.ray.write(tfrfs.ray.read(str(realdata), cache_dir=str(cache), on_damage="skip"), str(dest),
                    compression="gzip")
    assert written_records(dest, cache) == want


def tf_roundtrip(*args: str) -> str:
    """``tf_roundtrip.py`` under TensorFlow, in a subprocess (never in this process or a worker)."""
    proc = subprocess.run([sys.executable, str(TF_ROUNDTRIP), *args], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"tf_roundtrip.py {args[0]} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return proc.stdout


def example_rows_written_back(kind: str, tmp_path: Path) -> dict[str, str]:
    """A TensorFlow-written shard of 20 ``kind`` records read as ``example`` rows in 3 blocks and
    written by ``tfrfs.ray.write`` parse as the source's records (TensorFlow's check); the rows'
    column types."""
    pytest.importorskip("tensorflow")
    source = tmp_path / "src" / f"{kind}.tfrecord"
    source.parent.mkdir()
    tf_roundtrip("write", kind, str(source))
    cache = tmp_path / "cache"
    rows = tfrfs.ray.read(str(source), records="example", cache_dir=str(cache), override_num_blocks=3)
    schema = rows.schema()
    dest = tmp_path / "out"
    got = tfrfs.ray.write(rows, str(dest))
    with tfrfs.open(str(dest), cache_dir=str(cache)) as ds:
        assert {s.kind for s in ds.shards} == {kind}
    names = sorted(p.name for p in dest.iterdir() if p.name.endswith(".tfrecord"))
    report = json.loads(tf_roundtrip("check", kind, str(source), *(str(dest / n) for n in names)))
    assert report["differences"] == []
    assert got == {"dest": str(dest), "shards": 3, "records": 20} and report["records"] == 20
    # Records with nothing empty come back byte for byte; the fixture has both sorts.
    assert 0 < report["unchanged"] < 20 and report["byte_equal"] == report["unchanged"]
    return dict(zip(schema.names, map(str, schema.types)))


def test_sequence_example_rows_written_back_parse_equal(ray_local, tmp_path: Path) -> None:
    types = example_rows_written_back("sequence", tmp_path)
    assert types["label"] == "list<item: int64>" and types["void"] == "list<item: null>"
    assert types["feature_lists"].startswith("struct<frames: list<item: list<item: float>>")


def test_example_rows_written_back_parse_equal(ray_local, tmp_path: Path) -> None:
    types = example_rows_written_back("example", tmp_path)
    assert types["mixed"].startswith("struct<") and types["void"] == "list<item: null>"
