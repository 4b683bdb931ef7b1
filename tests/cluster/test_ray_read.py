"""``tfrfs.ray.read`` (SPEC 9) on a Ray cluster of this machine: rows equal ``tfrfs.open``'s records
and TensorFlow's reading (TensorFlow in this test process's helper only, never in a worker), the
requested number of blocks, example rows that keep one-element lists and the kinds of empty
features (where ``ray.data.read_tfrecords`` changes them), damage named, a bucket read alike.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tfrfs
from support.tfview import sha, tf_view

ray = pytest.importorskip("ray")

PETS = "Tensorflow-Ion-Detetection/models/research/object_detection/test_data/pets_examples.record"
CSV = "tfx/tfx/components/testdata/csv_example_gen/Split-eval"
LITE = "tfrecord_lite/tests"


@pytest.fixture(scope="module")
def interop(tf_written: Path) -> Path:
    """The clean TensorFlow-written shards (every kind of feature, GZIP and ZLIB, SequenceExamples)."""
    return tf_written / "clean"


def rows_of(dataset) -> list[dict]:
    return sorted(dataset.take_all(), key=lambda r: (r["shard"], r["index"]))


def expected_rows(source: Path, cache: Path) -> list[tuple[str, int, bytes]]:
    """Every sound record as tfrfs.open streams it."""
    out = []
    with tfrfs.open(str(source), cache_dir=str(cache)) as ds:
        for s in ds.shards:
            i = 0
            while i < s.records:
                try:
                    for data in ds.records(s.path, i):
                        out.append((s.path, i, data))
                        i += 1
                except tfrfs.DamagedRecord as exc:
                    i = exc.index + 1
    return sorted(out)


def test_raw_rows_equal_the_library_and_tensorflow(ray_local, interop: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    rows = rows_of(tfrfs.ray.read(str(interop), cache_dir=str(cache)))
    assert [(r["shard"], r["index"], r["record"]) for r in rows] == expected_rows(interop, cache)
    with tfrfs.open(str(interop), cache_dir=str(cache)) as ds:
        shards = [(str(interop / s.path), s.compression, s.kind) for s in ds.shards]
    view = tf_view(shards)
    for path, _, _ in shards:
        rel = str(Path(path).relative_to(interop))
        assert [sha(r["record"]) for r in rows if r["shard"] == rel] == view[path]["records"], rel


def test_realdata_rows_and_damage(ray_local, realdata: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # By default a damaged record ends the read, named. One read task, so that the first damaged
    # record in the dataset's order is the one met first: with several, the tasks race, and the
    # first to fail names the damaged record of its own part (pets_examples.record has three).
    with pytest.raises(Exception) as caught:
        tfrfs.ray.read(str(realdata), cache_dir=str(cache), override_num_blocks=1).materialize()
    assert f"{PETS}: record 0 at offset 0: data checksum failed" in str(caught.value)
    rows = rows_of(tfrfs.ray.read(str(realdata), cache_dir=str(cache), on_damage="skip", override_num_blocks=5))
    assert [(r["shard"], r["index"], r["record"]) for r in rows] == expected_rows(realdata, cache)
    mnist = "tfx/tfx/examples/mnist/data/mnist.tfrecord"
    view = tf_view([(str(realdata / mnist), "NONE", "example")])[str(realdata / mnist)]
    assert [sha(r["record"]) for r in rows if r["shard"] == mnist] == view["records"]


def test_damage_names_shard_index_offset(ray_local, tmp_path: Path) -> None:
    from tfrfs.format import proto
    from tfrfs.format import tfrecord
    ex = proto.Example()
    ex.features.feature["n"].int64_list.value.append(7)
    frames = [tfrecord.frame(ex.SerializeToString()) for _ in range(6)]
    buf = bytearray(b"".join(frames))
    buf[3 * len(frames[0]) + 14] ^= 1           # record 3's data
    (tmp_path / "d.tfrecord").write_bytes(bytes(buf))
    with pytest.raises(Exception) as caught:
        tfrfs.ray.read(str(tmp_path / "d.tfrecord"), cache_dir=str(tmp_path / "c")).materialize()
    assert f"d.tfrecord: record 3 at offset {3 * len(frames[0])}: data checksum failed" in str(caught.value)
    rows = rows_of(tfrfs.ray.read(str(tmp_path / "d.tfrecord"), cache_dir=str(tmp_path / "c"), on_damage="skip"))
    assert [r["index"] for r in rows] == [0, 1, 2, 4, 5]


def test_the_requested_number_of_blocks(ray_local, realdata: Path, tmp_path: Path) -> None:
    source = str(realdata / "tensorflow_datasets")   # one 10,000-record shard
    for n in (1, 4, 9):
        ds = tfrfs.ray.read(source, cache_dir=str(tmp_path / "c"), override_num_blocks=n).materialize()
        assert ds.num_blocks() == n and ds.count() == 10000
    assert tfrfs.ray.read(source, cache_dir=str(tmp_path / "c")).count() == 10000


def test_example_rows_keep_lists_and_kinds(ray_local, realdata: Path, tmp_path: Path) -> None:
    source = str(realdata / CSV)
    ds = tfrfs.ray.read(source, records="example", cache_dir=str(tmp_path / "c"))
    schema = ds.schema()
    types = dict(zip(schema.names, map(str, schema.types)))
    assert types["fare"] == "list<item: float>" and types["trip_seconds"] == "list<item: int64>"
    assert types["company"] == "list<item: binary>"    # no value in the first record, a bytes_list still
    rows = rows_of(ds)
    with tfrfs.open(source, cache_dir=str(tmp_path / "c")) as lib:
        for r in rows:
            want = lib.example(r["shard"], r["index"])
            for key, values in want.items():
                got = r[key]
                assert (list(got) if got is not None else None) == values, (r["index"], key)
    first = rows[0]
    assert isinstance(first["trip_seconds"], list) and len(first["trip_seconds"]) == 1
    assert first["company"] is None   # a Feature with no kind: null, in the binary column the key has
    # The interop example rows are all as the library parses them, and no worker imported TensorFlow.
    loaded = ds.map_batches(_tensorflow_loaded(), batch_format="numpy").take_all()
    assert loaded and not any(x["tensorflow"] for x in loaded)
    # ray.data.read_tfrecords: one-element lists come back as scalars, the empty feature without
    # its kind (what tfrfs keeps).
    try:
        theirs = sorted(ray.data.read_tfrecords(str(realdata / CSV)).take_all(),
                        key=lambda r: (r["trip_start_timestamp"], r["fare"]))
    except Exception as exc:  # noqa: BLE001 - Ray's reader needs TensorFlow in its workers
        pytest.skip(f"ray.data.read_tfrecords does not run here: {exc}")
    assert isinstance(theirs[0]["fare"], float)          # a one-element list became a scalar there
    assert isinstance(rows[0]["fare"], list) and len(rows[0]["fare"]) == 1


def _tensorflow_loaded():
    """The check, sent to the workers by value (they cannot import the tests' support modules)."""
    from support import raycheck
    ray.cloudpickle.register_pickle_by_value(raycheck)
    return raycheck.tensorflow_loaded


def test_sequence_examples_as_feature_lists(ray_local, realdata: Path, tmp_path: Path) -> None:
    source = str(realdata / "tfx/tfx/components/testdata/tfrecord_sequence")
    ds = tfrfs.ray.read(source, records="example", cache_dir=str(tmp_path / "c"))
    rows = rows_of(ds)
    with tfrfs.open(source, cache_dir=str(tmp_path / "c")) as lib:
        assert any(r["f"] is None for r in rows)    # context Features with no kind: null
        for r in rows[:200]:
            want = lib.example(r["shard"], r["index"])
            assert (r["f"], r["i"]) == (want["context"].get("f", []), want["context"].get("i", []))
            assert [list(s) for s in r["feature_lists"]["s"]] == want["feature_lists"]["s"]


def test_a_bucket_reads_the_same_rows(ray_local, realdata: Path, s3, tmp_path: Path) -> None:
    s3.upload_tree(realdata / LITE, "lite")
    s3.upload_tree(realdata / CSV, "csv")
    options = {"endpoint_url": s3.proxy.url, "key": s3.server.ACCESS_KEY, "secret": s3.server.SECRET_KEY}
    for prefix, local in (("lite", LITE), ("csv", CSV)):
        remote = rows_of(tfrfs.ray.read(s3.url(prefix), options=options, cache_dir=str(tmp_path / "r"),
                                        override_num_blocks=3))
        here = rows_of(tfrfs.ray.read(str(realdata / local), cache_dir=str(tmp_path / "l")))
        assert [(r["shard"], r["index"], r["record"]) for r in remote] == \
            [(r["shard"], r["index"], r["record"]) for r in here]
