"""Indexing on every core: the block-at-a-time header walk, and shards indexed by worker processes,
must give exactly what the one-process, record-at-a-time build gives, on sound and damaged shards."""

from __future__ import annotations

import gzip
import logging
import multiprocessing
import os
import random
import struct
import sys
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrfs.index import discovery
from tfrfs.index import shard_index as index
from tfrfs.jobs import indexing as indexbuild
from tfrfs.format import proto
from tfrfs.format import salvage
from tfrfs.index import shardschema
from tfrfs.jobs import runner as jobs_runner
from tfrfs.index.shard_index import IndexCache, ShardIndex

sys.path.insert(0, str(Path(__file__).parent))
from test_salvage import _frame, _mcrc  # noqa: E402   (the framing written by hand, not by tfrfs)


def _example(i: int, text: bytes = b"") -> bytes:
    ex = proto.Example()
    ex.features.feature["id"].int64_list.value.append(i)
    if text:
        ex.features.feature["text"].bytes_list.value.append(text)
    return ex.SerializeToString()


def _damage(rng: random.Random, buf: bytes) -> bytes:
    """``buf`` with a few kinds of damage: flipped bytes, garbage or zeros put in, a cut end."""
    out = bytearray(buf)
    for _ in range(rng.randrange(0, 4)):
        what = rng.choice(["flip", "garbage", "zeros", "ones", "cut", "big length"])
        at = rng.randrange(0, len(out) + 1)
        if what == "flip" and out:
            out[min(at, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif what == "garbage":
            out[at:at] = rng.randbytes(rng.randrange(1, 200))
        elif what == "zeros":
            out[at:at] = bytes(rng.randrange(1, 300))
        elif what == "ones":
            out[at:at] = b"\xff" * rng.randrange(1, 40)
        elif what == "cut":
            del out[at:]
        else:   # a sound header whose length runs past the end
            big = struct.pack("<Q", len(out) + rng.randrange(1, 1 << 20))
            out[at:at] = big + struct.pack("<I", _mcrc(big))
    return bytes(out)


def _shard_bytes(rng: random.Random, n: int, big: bool = False) -> bytes:
    recs = [rng.randbytes(rng.randrange(0, 80)) for _ in range(n)]
    if big:   # records the walk steps over (not read whole) among small ones
        recs[rng.randrange(n)] = rng.randbytes(salvage._SMALL + rng.randrange(1000))
    return b"".join(_frame(r) for r in recs)


def _header_walk(buf: bytes, fast: bool) -> tuple:
    w = salvage.Walk(lambda n, off: buf[off:off + n], len(buf))
    offsets = list(w.offsets()) if fast else [o for o, _, _ in w]
    return offsets, w.problems, w.ends, w.count, w.end, w.cut


@given(seed=st.integers(0, 2**32), n=st.integers(0, 40), block=st.integers(12, 400), big=st.booleans())
@settings(max_examples=300, deadline=None)
def test_offsets_give_what_the_record_walk_gives(seed: int, n: int, block: int, big: bool) -> None:
    rng = random.Random(seed)
    buf = _damage(rng, _shard_bytes(rng, n, big and n > 0))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(salvage, "BLOCK", block)   # headers across block ends, blocks of a header or less
        assert _header_walk(buf, fast=True) == _header_walk(buf, fast=False)


def test_offsets_of_many_small_records_cross_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = b"".join(_frame(bytes([i % 7]) * (i % 50)) for i in range(5000))
    monkeypatch.setattr(salvage, "BLOCK", 4096)
    fast = _header_walk(buf, fast=True)
    assert fast == _header_walk(buf, fast=False)
    assert fast[3] == 5000 and not fast[1]


# --- shards indexed by workers ------------------------------------------------------------------


def _dataset(root: Path) -> list[discovery.ShardFile]:
    """Shards of every sort a worker may get: sound, damaged, compressed (sound and damaged),
    empty, records the walk steps over, raw and sequence records."""
    rng = random.Random(7)
    root.mkdir()
    text = [_frame(_example(i, rng.randbytes(rng.randrange(100, 3000)))) for i in range(300)]
    shards: dict[str, bytes] = {
        "sound.tfrecord": b"".join(text),
        "damaged.tfrecord": _damage(random.Random(1), b"".join(text[:150])) + b"\x00" * 40 + b"".join(text[150:]),
        "empty.tfrecord": b"",
        "raw.tfrecord": _shard_bytes(rng, 500, big=True),
        "zeroed.tfrecord": b"".join(text[:10]) + bytes(5000) + b"".join(text[10:20]),
        "cut.tfrecord": b"".join(text[:50])[:-9],
    }
    seq = proto.SequenceExample()
    seq.feature_lists.feature_list["f"].feature.add().int64_list.value.append(1)
    shards["seq.tfrecord"] = _frame(seq.SerializeToString()) * 20
    for name, data in shards.items():
        (root / name).write_bytes(data)
    (root / "sound.tfrecord.gz").write_bytes(gzip.compress(shards["sound.tfrecord"]))
    (root / "z.tfrecord.zlib").write_bytes(zlib.compress(shards["raw.tfrecord"]))
    cut = gzip.compress(shards["sound.tfrecord"])
    (root / "cut.tfrecord.gz").write_bytes(cut[:len(cut) // 2])
    return list(discovery.discover(str(root)).shards)


def _same(a: ShardIndex, b: ShardIndex) -> None:
    assert a.shard == b.shard
    assert list(a.offsets) == list(b.offsets)
    assert (a.problems, a.bad, a.ends, a.detected_kind) == (b.problems, b.bad, b.ends, b.detected_kind)
    assert a.count == b.count and os.path.getsize(a.data_path) == os.path.getsize(b.data_path)


def _in_process(shards: list[discovery.ShardFile], cache_dir: Path) -> list[ShardIndex]:
    cache = IndexCache(cache_dir)
    return [cache.build(s) for s in shards]


@pytest.fixture
def pool_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small test shards go to the workers too."""
    monkeypatch.setattr(indexbuild, "POOL_BYTES", 0)
    monkeypatch.setattr(jobs_runner, "cores", lambda: 2)


def test_workers_index_as_one_process_does(tmp_path: Path, pool_always: None) -> None:
    shards = _dataset(tmp_path / "data")
    cache = IndexCache(tmp_path / "cache")
    seen: list[tuple[int, int, int]] = []
    got = indexbuild.index_all(shards, cache, lambda *a: seen.append(a))
    want = _in_process(shards, tmp_path / "alone")
    for a, b in zip(got, want, strict=True):
        _same(a, b)
    assert any(i.problems for i in got) and {i.detected_kind for i in got} == {"example", "sequence", "raw"}
    assert cache.scans == len(shards)
    assert [s[0] for s in seen] == list(range(1, len(shards) + 1))
    assert seen[-1] == (len(shards), len(shards), sum(i.count for i in want))
    # Each index is in the cache, as a worker wrote it: a second run reads them all.
    again = IndexCache(tmp_path / "cache")
    for a, b in zip(indexbuild.index_all(shards, again), want):
        _same(a, b)
    assert again.scans == 0


def test_the_schema_is_read_by_the_worker_that_walked_the_shard(tmp_path: Path, pool_always: None) -> None:
    shards = _dataset(tmp_path / "data")
    got = indexbuild.index_all(shards, IndexCache(tmp_path / "cache"), schema=True)
    jobs = [(i.data_path, shardschema.stamp_of(os.stat(i.data_path)), i.detected_kind, i.offsets, i.bad) for i in got]
    want = shardschema.scan_local(jobs)
    for idx, tally in zip(got, want):
        assert idx.tally is not None and tally is not None
        assert idx.tally.to_json() == tally.to_json()
    plain = indexbuild.index_all(shards, IndexCache(tmp_path / "plain"))   # a mount's build: no schema
    assert all(i.tally is None for i in plain)


def _exit_at_start() -> None:
    os._exit(3)


def _failing_build(self: IndexCache, shard: discovery.ShardFile) -> ShardIndex:
    raise OSError(5, "Input/output error")


def _builds_fail() -> None:
    IndexCache.build = _failing_build  # type: ignore[method-assign]


class _PoolStartingWith(jobs_runner.LocalPool):
    """A local pool whose workers run ``init`` as they start (to make them fail)."""

    def __init__(self, init: Callable[[], None]) -> None:
        super().__init__(2)
        self.init = init

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("forkserver"),
                                             initializer=self.init)
        return self._pool


@pytest.mark.parametrize("init, message", [(_exit_at_start, "a process indexing shards stopped"),
                                           (_builds_fail, "indexing it in a worker process failed")])
def test_a_job_lost_in_its_worker_is_done_here(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                               init: Callable[[], None], message: str) -> None:
    shards = _dataset(tmp_path / "data")
    cache = IndexCache(tmp_path / "cache")
    found: dict[int, ShardIndex] = {}
    with caplog.at_level(logging.WARNING, logger="tfrfs"), _PoolStartingWith(init) as runner:
        indexbuild.build_all(indexbuild.local_where(cache), list(enumerate(shards)), cache, found.__setitem__,
                             runner)
    for n, want in enumerate(_in_process(shards, tmp_path / "alone")):
        _same(found[n], want)
    lines = [r.getMessage() for r in caplog.records if message in r.getMessage()]
    assert lines and all("\n" not in line for line in lines)
    if init is _exit_at_start:
        assert len(lines) == 1


@pytest.mark.parametrize("schema", [False, True])
@pytest.mark.parametrize("pooled", [False, True])
def test_the_default_indexing_writes_the_cache_entries_a_runner_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        schema: bool, pooled: bool) -> None:
    """``index_source`` without a runner (a local pool, or this process for few bytes) and with
    an explicit ``jobs.InProcess()`` runner write the same cache entry for every shard, byte for
    byte, with and without the schema's part."""
    from tfrfs.dataset.sources import index_source, open_source
    if pooled:
        monkeypatch.setattr(indexbuild, "POOL_BYTES", 0)
        monkeypatch.setattr(jobs_runner, "cores", lambda: 2)
    _dataset(tmp_path / "data")
    entries: list[dict[str, bytes]] = []
    for name, runner in (("default", None), ("inprocess", jobs_runner.InProcess())):
        src = open_source(str(tmp_path / "data"), cache_dir=tmp_path / name)
        try:
            indexes, cache = index_source(src, runner=runner, schema=schema)
            assert cache.scans == len(indexes)
            assert all((i.tally is not None) == schema for i in indexes)
        finally:
            src.close()
        files = sorted(p for p in (tmp_path / name).rglob("*") if p.is_file() and p.suffix != ".tmp")
        entries.append({str(p.relative_to(tmp_path / name)): p.read_bytes() for p in files})
    assert entries[0] and entries[0] == entries[1]
