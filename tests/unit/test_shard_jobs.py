"""SPEC 8: index, verify, inspect and repair give the same output whether their shard jobs run in
this process (``--workers 1``) or in a pool of local processes (the default): the same lines, exit
status, index files and manifest byte for byte, the same repaired shards. The dataset has damaged
plain shards, GZIP and ZLIB shards, a SequenceExample shard and a large shard cut in parts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from support import jobdata
from tfrfs.jobs import shard_work as shardjobs
from tfrfs.jobs import verify
from tfrfs.index.shard_index import IndexCache
from tfrfs.dataset.sources import open_source


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return jobdata.make(tmp_path_factory.mktemp("jobs") / "data")


def _same_files(a: Path, b: Path) -> dict[str, bytes]:
    """``a``'s files, checked equal to ``b``'s; the manifest's times of folders and plain files
    (the index files written by the command, and the folders they were written into) left out."""
    got_a, got_b = jobdata.files(a), jobdata.files(b)
    for got in (got_a, got_b):
        if ".tfrfs-manifest" in got:
            doc = json.loads(got[".tfrfs-manifest"])
            for d in doc["dirs"] + doc["files"]:
                d.pop("mtime_ns")
            got[".tfrfs-manifest"] = json.dumps(doc, sort_keys=True).encode()
    assert got_a == got_b
    return got_a


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)   # times kept: the shards' identities (and so their index files) too
    return dest


@pytest.mark.parametrize("args", [("verify",), ("verify", "--json"), ("inspect",), ("inspect", "--json")])
def test_reading_commands_give_the_same_output(dataset: Path, tmp_path: Path, args: tuple[str, ...]) -> None:
    # Indexed first (the large shard is then verified in parts), by the other runner each time.
    jobdata.run("index", "--no-schema", str(dataset), cache=tmp_path / "c1")
    jobdata.run("index", "--no-schema", "--workers", "1", str(dataset), cache=tmp_path / "c2")
    one = jobdata.run(*args, "--workers", "1", str(dataset), cache=tmp_path / "c1")
    pool = jobdata.run(*args, str(dataset), cache=tmp_path / "c2")
    assert one == pool
    assert one[0] == (1 if args[0] == "verify" else 0)
    assert "big.tfrecord" in one[1]


def test_index_beside_gives_the_same_files(dataset: Path, tmp_path: Path) -> None:
    a, b = _copy(dataset, tmp_path / "a"), _copy(dataset, tmp_path / "b")
    one = jobdata.run_on("index", "--beside", "--workers", "1", src=a, cache=tmp_path / "c1")
    pool = jobdata.run_on("index", "--beside", src=b, cache=tmp_path / "c2")
    assert one == pool and one[0] == 1          # damaged shards: problems found
    got_a = _same_files(a, b)
    assert ".tfrfs-manifest" in got_a and "big.tfrecord.tfrfs-idx" in got_a
    # The index files are those of the single-process run of the command as it was before jobs.
    c = _copy(dataset, tmp_path / "c")
    jobdata.run("index", "--beside", "--workers", "1", "--no-schema", str(c), cache=tmp_path / "c3")
    assert jobdata.files(c)["big.tfrecord.tfrfs-idx"] != b""


def test_repair_gives_the_same_shards(dataset: Path, tmp_path: Path) -> None:
    a, b = _copy(dataset, tmp_path / "a"), _copy(dataset, tmp_path / "b")
    one = jobdata.run_on("repair", "--workers", "1", src=a, cache=tmp_path / "c1")
    pool = jobdata.run_on("repair", src=b, cache=tmp_path / "c2")
    assert one == pool and one[0] == 0
    assert "big.tfrecord: repaired" in one[1]
    got_a = _same_files(a, b)
    assert ".tfrfs-damaged/big.tfrecord" in got_a
    assert jobdata.run("verify", str(b), cache=tmp_path / "c2")[0] == 0


def test_a_large_shard_verified_in_parts_gives_the_whole_shard_report(dataset: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    src = open_source(str(dataset), cache_dir=tmp_path / "cache")
    whole = [r.as_json() for r in verify.verify_source(src)]
    big = next(s for s in src.discovery.shards if s.relpath == jobdata.BIG)
    IndexCache(src.cache_dir, src.readers).get(big)        # its index, to cut it by
    monkeypatch.setattr(shardjobs, "SPLIT_RECORDS", jobdata.SPLIT_RECORDS)
    cut = verify._parts(src, big)
    assert cut is not None and len(cut) == 8
    starts = [p.first for p in cut]
    assert 400 not in starts and 401 in starts      # never right after a gap
    assert [r.as_json() for r in verify.verify_source(src)] == whole
    src.close()


def test_parts_cover_the_stream() -> None:
    offsets = list(range(0, 16 * 1001, 16))            # 1,000 records of 16 bytes
    pytest.MonkeyPatch().setattr(shardjobs, "SPLIT_RECORDS", 300)
    try:
        cut = shardjobs.parts(offsets, {599: 9600}, 16_010)
    finally:
        pytest.MonkeyPatch().undo()
    assert [(p.first, p.last) for p in cut] == [(0, 300), (300, 601), (601, 901), (901, 1000)]
    assert cut[0].start == 0 and cut[-1].stop == 16_010
    assert all(a.stop == b.start for a, b in zip(cut, cut[1:]))
