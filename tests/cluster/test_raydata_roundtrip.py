"""SPEC 9: what ``tfrfs.ray.read(records="raw")`` returns, written by ``tfrfs.ray.write``, gives back
the same records byte for byte and in order, on TensorFlow-written shards (every kind of feature,
GZIP and ZLIB, SequenceExamples) and on the real data; TensorFlow reads the written shards as it
reads the originals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tfrfs
from support.tfview import sha, tf_view

ray = pytest.importorskip("ray")

TESTS = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def interop(tmp_path_factory) -> Path:
    pytest.importorskip("tensorflow")
    out = tmp_path_factory.mktemp("tf_fixtures")
    subprocess.run([sys.executable, str(TESTS / "interop" / "tf_fixtures.py"), str(out)], check=True,
                   capture_output=True)
    return out / "clean"


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
