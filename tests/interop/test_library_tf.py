"""``tfrfs.open`` against TensorFlow (SPEC 9): on TensorFlow-written shards and the real data,
every record's bytes and values equal what ``tf.data.TFRecordDataset`` and
``tf.train.Example.FromString`` give, kinds kept; damaged real files name each bad record's
shard, index and offset and serve the salvaged rest; the schema is a mount's
``.tfrfs/schema.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tfrfs
from conftest import REALDATA
from support.tfview import differences, sha, tf_view
from test_interop_tf import REALDATA_DAMAGED, _need_tf_and_fuse

pytestmark = [pytest.mark.tf]


@pytest.fixture(scope="module")
def clean(tf_written: Path) -> Path:
    """The clean TensorFlow-written fixtures (every feature kind, GZIP/ZLIB, SequenceExamples)."""
    _need_tf_and_fuse()
    return tf_written / "clean"


def compare_with_tensorflow(ds, root: Path, *, skip: tuple[str, ...] = ()) -> list[str]:
    """Every record of every shard TensorFlow reads to the end: same bytes, same values."""
    shards = [s for s in ds.shards if s.path not in skip]
    view = tf_view([(str(root / s.path), s.compression, s.kind) for s in shards])
    problems: list[str] = []
    checked = 0
    for s in shards:
        tf = view[str(root / s.path)]
        if tf["error"]:
            problems.append(f"{s.path}: TensorFlow stops: {tf['error']}")
            continue
        if len(tf["records"]) != s.records:
            problems.append(f"{s.path}: {s.records} records, TensorFlow reads {len(tf['records'])}")
            continue
        got = list(ds.records(s.path))
        if [sha(r) for r in got] != tf["records"]:
            problems.append(f"{s.path}: record bytes differ from TensorFlow's")
        if s.kind == "raw":
            continue
        for i, theirs in enumerate(tf["values"]):
            problems += differences(ds.example(s.path, i), theirs, f"{s.path}[{i}]")
            checked += 1
    assert checked, "no record was compared"
    return problems


def test_interop_shards_equal_tensorflow(clean: Path, tmp_path: Path) -> None:
    with tfrfs.open(str(clean), cache_dir=str(tmp_path / "cache")) as ds:
        kinds = {s.kind for s in ds.shards}
        comps = {s.compression for s in ds.shards}
        assert {"example", "sequence", "raw"} <= kinds and {"NONE", "GZIP", "ZLIB"} <= comps
        problems = compare_with_tensorflow(ds, clean)
    assert not problems, "\n".join(problems[:40])


def test_realdata_equals_tensorflow_and_names_damage(tmp_path: Path) -> None:
    if not REALDATA.is_dir():
        pytest.skip(f"no real data at {REALDATA}")
    _need_tf_and_fuse()
    with tfrfs.open(str(REALDATA), cache_dir=str(tmp_path / "cache")) as ds:
        problems = compare_with_tensorflow(ds, REALDATA, skip=REALDATA_DAMAGED)
        assert not problems, "\n".join(problems[:40])
        # The damaged files: TensorFlow reads nothing of them; tfrfs names each bad record and
        # serves the rest.
        pets, serengeti = REALDATA_DAMAGED
        bad = {p["index"]: p["offset"] for p in ds.problems if p["shard"] == pets and "data checksum" in p["reason"]}
        assert bad, ds.problems
        served = 0
        for i in range(ds.shard_index(pets).count):
            if i in bad:
                with pytest.raises(tfrfs.DamagedRecord) as caught:
                    ds.record(pets, i)
                assert (caught.value.shard, caught.value.index, caught.value.offset) == (pets, i, bad[i])
                assert f"{pets}: record {i} at offset {bad[i]}" in str(caught.value)
            else:
                assert ds.example(pets, i)   # a sound Example, salvaged past the damage
                served += 1
        assert served
        assert [s.records for s in ds.shards if s.path == serengeti] == [0]
        assert any(p["shard"] == serengeti and p["index"] == 0 for p in ds.problems)
        view = tf_view([(str(REALDATA / pets), "NONE", "example")])
        assert view[str(REALDATA / pets)]["error"] and not view[str(REALDATA / pets)]["records"]


def test_schema_and_shards_equal_a_mount(clean: Path, tmp_path: Path, tfrfs_mount) -> None:
    mnt = tfrfs_mount(clean)
    mounted = json.loads((mnt / ".tfrfs" / "schema.json").read_text())
    with tfrfs.open(str(clean), cache_dir=str(tmp_path / "cache")) as ds:
        assert json.loads(json.dumps(ds.schema)) == mounted
        assert [(s.path, s.records) for s in ds.shards] == [(s["shard"], s["records"]) for s in mounted["shards"]]
