"""Offsets loaded when first needed and dropped within a budget; shipped indexes checked at
sampled record headers; index files mapped in place (SPEC 1.2)."""

from __future__ import annotations

import os
import sys
import threading
from array import array
from pathlib import Path

import pytest

from tfrfs.index import idxfile
from tfrfs.index import discovery
from tfrfs.index import shard_index as index
from tfrfs.errors import DataLoss
from tfrfs.index.memory import IndexMemory
from tfrfs.view.records import RecordStore
from tfrfs.storage.readers import default_readers

sys.path.insert(0, str(Path(__file__).parent))
from test_index import example, write_shard  # noqa: E402


def make_shards(root: Path, n: int, records: int = 50) -> list[discovery.ShardFile]:
    for s in range(n):
        write_shard(root / f"s{s}.tfrecord", [example(id=s * 1000 + i) for i in range(records)])
    return list(discovery.discover(str(root)).shards)


class Owner:
    def __init__(self) -> None:
        self.dropped = 0

    def drop_offsets(self) -> None:
        self.dropped += 1


def test_memory_drops_the_least_recently_used_past_its_budget() -> None:
    mem = IndexMemory(100)
    a, b, c = Owner(), Owner(), Owner()
    mem.hold(a, 40)
    mem.hold(b, 40)
    mem.used(a)              # b is now the least recently used
    mem.hold(c, 40)
    assert (a.dropped, b.dropped, c.dropped) == (0, 1, 0)
    assert mem.total == 80 and mem.shards == 2
    big = Owner()
    mem.hold(big, 500)       # more than the budget alone: it stays, the others go
    assert (a.dropped, c.dropped, big.dropped) == (1, 1, 0)
    assert mem.total == 500 and mem.drops == 3


def test_offsets_load_when_first_needed_and_reload_after_a_drop(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    shards = make_shards(tmp_path / "d", 3)
    built = [index.IndexCache(tmp_path / "c").build(s) for s in shards]
    mem = IndexMemory(1)     # room for one shard's offsets at a time
    cache = index.IndexCache(tmp_path / "c", memory=mem)
    for idx in built:
        cache.save(idx)
    lazy = [cache.get(s)[0] for s in shards]
    assert [i.count for i in lazy] == [50, 50, 50]
    assert not any(i.loaded for i in lazy), "the mount needs counts only"
    view = lazy[0].offsets                    # held by a reader while the index is dropped
    assert lazy[0].loaded
    for i, idx in enumerate(lazy):
        assert idx.span(7) == built[i].span(7)
    assert not lazy[0].loaded and not lazy[1].loaded and lazy[2].loaded
    assert mem.drops == 2
    assert list(view) == list(built[0].offsets), "a dropped index's view stays valid"
    assert lazy[0].span(49) == built[0].span(49)   # loaded again
    assert isinstance(lazy[0].offsets, memoryview), "the index file is mapped, not copied"


def test_index_files_put_the_offsets_at_an_aligned_place(tmp_path: Path) -> None:
    for n in (0, 1, 2, 7, 1000):
        data = idxfile.dump({"size": n, "kind": "example" * (n % 3)}, array("Q", range(0, 8 * (n + 1), 8)))
        meta, start = idxfile.header(data)
        assert start % 8 == 0
        p = tmp_path / f"{n}.idx"
        p.write_bytes(data)
        meta, offsets = idxfile.map_file(str(p))
        assert isinstance(offsets, memoryview) and list(offsets) == list(range(0, 8 * (n + 1), 8))
        assert idxfile.load(data)[1] == array("I", range(0, 8 * (n + 1), 8))


def test_a_cached_index_gone_or_changed_is_built_again_and_a_changed_count_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    [shard] = make_shards(tmp_path / "d", 1)
    cache = index.IndexCache(tmp_path / "c")
    idx, _ = cache.get(shard)
    for f in (tmp_path / "c" / "index").iterdir():
        f.unlink()
    assert idx.span(3)[1] > 0 and idx.count == 50     # scanned again
    idx.drop_offsets()
    # The cache entry changed under the mount: it is not trusted, the shard is read again.
    [entry] = (tmp_path / "c" / "index").iterdir()
    meta, offsets = idxfile.load(entry.read_bytes())
    entry.write_bytes(idxfile.dump({k: v for k, v in meta.items() if k not in ("version", "count", "width", "crc")},
                                   offsets[:-1]))
    assert idx.span(49)[1] > 0
    # The shard itself lost a record while mounted: its records are not served by wrong offsets.
    idx.drop_offsets()
    write_shard(Path(shard.path), [example(id=i) for i in range(49)])
    entry.unlink()
    with pytest.raises(DataLoss, match="49 records, 50 when it was mounted"):
        idx.span(3)


def rewrite_same_size_and_count(path: Path, records: list[bytes]) -> None:
    """Another version of a shard: as many records and bytes, and the same modification time,
    but five bytes moved from the first record to the middle one. The last record's header
    stays where it was: only the other samples tell the index is not of this shard."""
    st = path.stat()
    lengths = [len(r) for r in records]
    lengths[0] -= 5
    lengths[len(lengths) // 2] += 5
    write_shard(path, [bytes([65 + i % 26]) * n for i, n in enumerate(lengths)])
    assert path.stat().st_size == st.st_size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_shipped_index_of_another_version_of_the_shard_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    [shard] = make_shards(tmp_path / "d", 1, records=20)
    cache = index.IndexCache(tmp_path / "c")
    idx, _ = cache.get(shard)
    shipped = Path(shard.path + idxfile.SUFFIX)
    shipped.write_bytes(cache.shipped_bytes(idx))
    rewrite_same_size_and_count(Path(shard.path), [example(id=i) for i in range(20)])
    again = discovery.discover(str(tmp_path / "d")).shards[0]
    assert (again.size, again.identity) == (shard.size, shard.identity), "same size, same time"
    got, ignored = index.IndexCache(tmp_path / "c2").from_shipped(again)
    assert got is None
    assert any("does not check" in note for note in ignored)
    fresh, from_file = index.IndexCache(tmp_path / "c3").get(again)
    assert not from_file and fresh.count == 20
    store = RecordStore([fresh], default_readers())
    try:
        assert store.record_bytes(0, 10)[1] is None
    finally:
        store.close()


def test_many_threads_read_while_indexes_are_dropped(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    shards = make_shards(tmp_path / "d", 6, records=200)
    cache = index.IndexCache(tmp_path / "c", memory=IndexMemory(1))
    indexes = [cache.get(s)[0] for s in shards]
    store = RecordStore(indexes, default_readers())
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for j in range(300):
                s = (j + k) % 6
                data, bad = store.record_bytes(s, (j * 7) % 200)
                assert bad is None and data == example(id=s * 1000 + (j * 7) % 200)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    assert not errors, errors[0]
    assert cache.memory.drops > 100
