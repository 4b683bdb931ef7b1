"""A read-only tree answers many threads at once exactly as it answers one (the FUSE adapter's
worker threads call it so).

Most tests read a dataset serially first, on a mount of its own, for the reference; then 12
threads look up, stat, list, read (in pieces, as the kernel asks) and ask the xattrs of its
files and folders on a fresh mount, many times over, and every answer must equal the reference:
the records of one shard (their large images read ahead and served from memory), more plain
files than are kept open, shards whose offsets are dropped under ``--index-memory`` pressure,
remote shards through a small block cache. The others have 16 threads come at once upon what is
learned on first use (records that do not parse, a folder compared with the disk) and check
that it is learned once and whole. The interpreter switches threads every microsecond
meanwhile, so that a race has its chance.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tfrfs.cli.parser import main
from tfrfs.dataset.assembly import Mount, open_mount
from tfrfs.dataset.sources import index_source, open_source
from tfrfs.format import proto, tfrecord
from tfrfs.index.memory import IndexMemory
from tfrfs.storage.local_reader import LocalReaders
from tfrfs.storage.readers import Served
from tfrfs.view.nodes import ShardDir, Stat, as_bytes
from tfrfs.view import tree as tree_module
from tfrfs.view.tree import Tree

THREADS = 12
Snapshot = dict[str, tuple[str, Stat, Any, dict[str, bytes]]]


# --- a dataset ---------------------------------------------------------------------

def _shard(path: Path, records: list[bytes]) -> None:
    buf = io.BytesIO()
    w = tfrecord.StreamWriter(buf, tfrecord.NONE)
    for r in records:
        w.write(r)
    w.close()
    path.write_bytes(buf.getvalue())


def _example(rnd: random.Random, n: int, image: int = 0) -> bytes:
    ex = proto.Example()
    ex.features.feature["id"].int64_list.value.append(n)
    ex.features.feature["label"].bytes_list.value.append(f"label {n}".encode())
    ex.features.feature["score"].float_list.value.extend([n / 7, -n / 3])
    if image:   # a JPEG by its magic bytes: large ones are served from their place in the shard
        ex.features.feature["image/encoded"].bytes_list.value.append(b"\xff\xd8\xff" + rnd.randbytes(image))
    return ex.SerializeToString()


def _dataset(root: Path, *, big: int = 0, small: int = 0, plain: int = 0, seed: int = 0) -> Path:
    """``big`` records of 70-140 KiB images in ``big.tfrecord``, ``small`` shards of 40 small
    records each, ``plain`` plain files (more than the tree keeps open) in ``plain/``."""
    rnd = random.Random(seed)
    root.mkdir(parents=True)
    if big:
        _shard(root / "big.tfrecord", [_example(rnd, i, rnd.randrange(70 << 10, 140 << 10)) for i in range(big)])
    for s in range(small):
        _shard(root / f"s{s}.tfrecord", [_example(rnd, 1000 * s + i) for i in range(40)])
    if plain:
        (root / "plain").mkdir()
        for i in range(plain):
            (root / "plain" / f"f{i:03d}.txt").write_bytes(rnd.randbytes(rnd.randrange(1, 20_000)))
    return root


# --- what one thread sees ----------------------------------------------------------------

def _copy(served: Served) -> bytes:
    """What the FUSE adapter sends for a read: it copies the bytes (or has libfuse read them from
    the descriptor) after the tree answered, while the other threads go on."""
    time.sleep(0)
    return as_bytes(served)


def _read(tree: Tree, path: str, size: int, piece: int) -> bytes:
    node = tree.lookup(path)
    return b"".join(_copy(tree.serve(node, piece, off)) for off in range(0, size, piece))


def snapshot(tree: Tree, top: str = "/") -> Snapshot:
    """Every path under ``top``: (kind, stat, listing or content, xattrs)."""
    out: Snapshot = {}

    def walk(path: str) -> None:
        node = tree.lookup(path)
        st = tree.stat(node)
        xattrs = dict(tree.xattrs(node))
        if node.folder:
            names = [n for n, _ in tree.names(node)]
            out[path] = ("dir", st, names, xattrs)
            for n in names:
                walk(path.rstrip("/") + "/" + n)
        else:
            out[path] = ("file", st, _read(tree, path, st.size, 1 << 20), xattrs)
    walk(top)
    return out


def check(tree: Tree, path: str, want: tuple[str, Stat, Any, dict[str, bytes]], rnd: random.Random) -> None:
    """Look ``path`` up, stat, list or read it and ask its xattrs, as a FUSE request would."""
    kind, st, body, xattrs = want
    node = tree.lookup(path)
    assert tree.stat(node) == st, "stat"
    if kind == "dir":
        assert [n for n, _ in tree.names(node)] == body, "names"
        assert [n for _, n, _ in tree.entries(node)] == body, "entries"
        if isinstance(node, ShardDir):
            assert [n for _, n, _, _ in tree.shard_listing(node)] == body, "shard listing"
    else:
        piece = rnd.choice((4096, 65536, 131072))
        assert _read(tree, path, st.size, piece) == body, f"content read in pieces of {piece}"
    assert dict(tree.xattrs(node)) == xattrs, "xattrs"


@contextlib.contextmanager
def switching_often() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def hammer(work: Callable[[int, random.Random], None], threads: int = THREADS) -> None:
    """Run ``work(k, rnd)`` on ``threads`` threads at once; fail with what any of them raised."""
    failures: list[str] = []
    start = threading.Barrier(threads)

    def run(k: int) -> None:
        rnd = random.Random(k)
        start.wait()
        try:
            work(k, rnd)
        except BaseException:   # noqa: BLE001 - reported below, with where it was raised
            failures.append(f"thread {k}: {traceback.format_exc()}")
    pool = [threading.Thread(target=run, args=(k,), name=f"request-{k}") for k in range(threads)]
    with switching_often():
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    assert not failures, f"{len(failures)} thread(s) failed; the first:\n{failures[0]}"


def every_path(tree: Tree, reference: Snapshot, rounds: int, *, in_order: bool = True) -> Callable[[int, random.Random], None]:
    """A thread's work: every path of ``reference`` ``rounds`` times, in order (even threads: so
    that the shards' large records are read ahead) or shuffled."""
    paths = sorted(reference)

    def work(k: int, rnd: random.Random) -> None:
        for _ in range(rounds):
            order = paths[:]
            if not (in_order and k % 2 == 0):
                rnd.shuffle(order)
            for path in order:
                try:
                    check(tree, path, reference[path], rnd)
                except AssertionError as exc:
                    raise AssertionError(f"{path}: {exc}") from exc
    return work


def _mount(source: Path, cache: Path, **kw: Any) -> Mount:
    return open_mount(str(source), cache_dir=str(cache), **kw)


def _reference(source: Path, cache: Path, *under: str) -> Snapshot:
    """What one reader finds (``snapshot``) in a mount of ``source``, made and closed for it."""
    serial = _mount(source, cache)
    try:
        return snapshot(serial.tree, *under)
    finally:
        serial.close()


# --- the tests -----------------------------------------------------------------------

def test_threads_reading_the_records_of_one_shard_see_what_one_sees(tmp_path: Path) -> None:
    src = _dataset(tmp_path / "ds", big=24)
    reference = _reference(src, tmp_path / "cache")
    assert len(reference) == 2 + 24 * 6
    m = _mount(src, tmp_path / "cache", readers=LocalReaders())   # (whatever $TFRFS_SHARD_READER says)
    try:
        # Records are rendered, and their large images read (ahead) again and again.
        m.store._views.budget = 1
        hammer(every_path(m.tree, reference, rounds=2))
    finally:
        m.close()


def test_threads_reading_more_plain_files_than_are_kept_open_get_each_its_own_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Few kept open: one is closed (and its number given to the next file opened) while a read
    # of it is under way in another thread.
    monkeypatch.setattr(tree_module, "_PLAIN_FDS", 3)
    src = _dataset(tmp_path / "ds", small=1, plain=40)
    reference = _reference(src, tmp_path / "cache", "/plain")
    m = _mount(src, tmp_path / "cache")
    try:
        hammer(every_path(m.tree, reference, rounds=3, in_order=False))
    finally:
        m.close()


def test_indexes_dropped_under_memory_pressure_while_other_threads_read(tmp_path: Path) -> None:
    src = _dataset(tmp_path / "ds", small=4)
    reference = _reference(src, tmp_path / "cache")
    memory = IndexMemory(1)   # one shard's offsets at a time
    m = _mount(src, tmp_path / "cache", memory=memory)
    try:
        hammer(every_path(m.tree, reference, rounds=2, in_order=False))
        indexes = m.store.shards
        assert memory.drops > 10, "the offsets were dropped while read"
        # What the budget counts is what is held: no index holds offsets that it does not count.
        assert memory.shards == sum(idx.loaded for idx in indexes) == 1
        assert memory.total == sum(len(idx.offsets) * idx.offsets.itemsize for idx in indexes if idx.loaded)
    finally:
        m.close()


@pytest.mark.parametrize("attempt", range(3))   # each on a cold mount and cache
def test_records_found_not_to_parse_by_many_threads_are_noted_once_and_kept(tmp_path: Path, attempt: int) -> None:
    rnd = random.Random(attempt)
    src = tmp_path / "ds"
    src.mkdir()
    bad = list(range(20, 80, 2))   # (the kind is judged from the first 16 records: example)
    _shard(src / "mixed.tfrecord", [b"\xff\xff\xff" + rnd.randbytes(40) if i in bad else _example(rnd, i)
                                    for i in range(80)])
    m = _mount(src, tmp_path / "cache")
    try:
        tree = m.tree

        def work(k: int, rnd: random.Random) -> None:
            order = bad[:]
            rnd.shuffle(order)
            for i in order:
                node = tree.lookup(f"/mixed.tfrecord/{i:06d}")   # listed as a folder until read
                assert list(tree.names(node)) == []
                assert tree.store.is_bad(0, i)
        hammer(work, threads=16)
        idx = m.store.shards[0]
        assert sorted(idx.bad) == bad
        assert sorted(p.index or -1 for p in idx.problems) == bad, "each record's problem once"
        errors = tree.read(tree.lookup("/.tfrfs/errors"), 1 << 20, 0).decode().splitlines()
        assert len(errors) == len(bad)
        assert [n for n, _ in tree.names(tree.lookup("/mixed.tfrecord"))][20:24] == \
            ["000020.bin", "000021", "000022.bin", "000023"]
    finally:
        m.close()
    again = _mount(src, tmp_path / "cache")   # what was found is kept with the index
    try:
        assert sorted(again.store.shards[0].bad) == bad
    finally:
        again.close()


def test_a_folder_compared_with_the_disk_on_first_visit_is_listed_whole_by_every_thread(tmp_path: Path) -> None:
    src = _dataset(tmp_path / "ds", small=2)
    (src / "more").mkdir()
    _shard(src / "more" / "m.tfrecord", [_example(random.Random(1), i) for i in range(5)])
    assert main(["index", str(src), "--beside", "--cache-dir", str(tmp_path / "indexer")]) == 0
    for i in range(60):   # files the manifest does not name: added to the folder when first visited
        (src / "more" / f"new{i:02d}.json").write_text(f"[{i}]\n")
    source = open_source(str(src), cache_dir=tmp_path / "cache", use_manifest=True)
    assert source.manifest is not None
    m = open_mount(source, indexed=index_source(source))
    try:
        tree = m.tree
        want = ["m.tfrecord", "m.tfrecord.tfrfs-idx", *(f"new{i:02d}.json" for i in range(60))]

        def work(k: int, rnd: random.Random) -> None:
            folder = tree.lookup("/more")
            if k % 2:
                assert sorted(n for n, _ in tree.names(folder)) == want
            else:
                i = rnd.randrange(60)
                assert tree.read(tree.lookup(f"/more/new{i:02d}.json"), 100, 0) == f"[{i}]\n".encode()
        hammer(work, threads=16)
    finally:
        m.close()
        source.close()


def test_threads_reading_remote_shards_through_a_small_block_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fsspec = pytest.importorskip("fsspec")
    from fsspec.implementations.memory import MemoryFileSystem

    local = _dataset(tmp_path / "ds", big=12, small=1, plain=3)
    fs = fsspec.filesystem("memory")
    root = f"/tfrfs-threads-{os.getpid()}-{id(tmp_path)}"
    for path in local.rglob("*"):
        if path.is_file():
            fs.pipe_file(f"{root}/ds/{path.relative_to(local).as_posix()}", path.read_bytes())
    url = f"memory:/{root}/ds"
    fetch = MemoryFileSystem.cat_file

    def over_a_network(self: Any, path: str, *args: Any, **kw: Any) -> Any:
        time.sleep(0.002)   # requests wait: the threads' fetches overlap
        return fetch(self, path, *args, **kw)
    monkeypatch.setattr(MemoryFileSystem, "cat_file", over_a_network)
    try:
        serial_source = open_source(url, cache_dir=tmp_path / "cache1")
        serial = open_mount(serial_source)
        try:
            reference = snapshot(serial.tree)
        finally:
            serial.close()
            serial_source.close()
        assert sum(len(body) for kind, _, body, _ in reference.values() if kind == "file") > 1 << 20
        # Blocks (of a MiB) fetched by one thread are read by others, and evicted meanwhile.
        source = open_source(url, cache_dir=tmp_path / "cache2", cache_size=1 << 20)
        m = open_mount(source)
        try:
            m.store._views.budget = 1
            hammer(every_path(m.tree, reference, rounds=1))
        finally:
            m.close()
            source.close()
    finally:
        fs.rm(root, recursive=True)
