"""SPEC 7: "[]" tells no kind. For a key new to the dataset an empty list waits: it takes the kind
of the next value of that key written in the mount, or the ``user.tfrfs.kind`` xattr set on its
file (``cp -a``), and only at commit, if nothing came, ``bytes_list``. Also after a remount, which
finds the waiting lists in the journal. Driven in process (``inprocess.Session``)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

from tfrfs.format import proto
from tfrfs.format import tfrecord
from tfrfs.view.records import RecordStore
from tfrfs.storage.readers import default_readers
from tfrfs.index import discovery
from tfrfs.index import shard_index as index

from inprocess import Session
from support import reference

sys.path.insert(0, str(Path(__file__).parent))
from test_index import example, write_shard  # noqa: E402


def kinds_of(root: Path, shard: str) -> list[dict[str, str | None]]:
    """Each committed record's feature kinds."""
    out = []
    for data in reference.written_records(root / shard):
        out.append({k: kind for k, (kind, _) in reference.parse_example(data).items()})
    return out


def new_dataset(tmp_path: Path) -> tuple[Path, Session]:
    root = tmp_path / "ds"
    root.mkdir()
    write_shard(root / "old.tfrecord", [example(id=1)])
    s = Session(root, tmp_path / "cache")
    s.mkdir("/new.tfrecord")
    return root, s


def test_an_empty_list_takes_the_kind_of_the_next_value_of_its_key(tmp_path: Path) -> None:
    root, s = new_dataset(tmp_path)
    try:
        for rec in ("a", "b", "c"):
            s.mkdir(f"/new.tfrecord/{rec}")
        s.write("/new.tfrecord/a/ids.json", b"[]\n")
        s.write("/new.tfrecord/a/none.json", b"[]\n")
        s.write("/new.tfrecord/b/ids.json", b"[0, -1, 9223372036854775807]\n")   # refused before
        s.write("/new.tfrecord/c/ids.json", b"[]\n")
        s.commit()
    finally:
        s.close()
    assert kinds_of(root, "new.tfrecord") == [{"ids": "int64_list", "none": "bytes_list"},
                                              {"ids": "int64_list"}, {"ids": "int64_list"}]


def test_a_waiting_empty_list_is_found_again_after_a_remount(tmp_path: Path) -> None:
    root, s = new_dataset(tmp_path)
    try:
        s.mkdir("/new.tfrecord/a")
        s.mkdir("/new.tfrecord/b")
        s.write("/new.tfrecord/a/score.json", b"[]\n")
    finally:
        s.close()
    s = Session(root, tmp_path / "cache")
    try:
        s.write("/new.tfrecord/b/score.json", b"[0.5]\n")
        s.commit()
    finally:
        s.close()
    assert kinds_of(root, "new.tfrecord") == [{"score": "float_list"}, {"score": "float_list"}]


def test_the_kind_xattr_gives_an_empty_list_its_kind(tmp_path: Path) -> None:
    root, s = new_dataset(tmp_path)
    try:
        s.mkdir("/new.tfrecord/a")
        s.write("/new.tfrecord/a/ids.json", b"[]\n")
        s.write("/new.tfrecord/a/name.txt", b"x")
        s.files.set_kind("/new.tfrecord/a/ids.json", b"float_list")
        s.files.set_kind("/new.tfrecord/a/name.txt", b"int64_list")   # a value that tells its kind: ignored
        assert s.tree.xattrs(s.tree.lookup("/new.tfrecord/a/ids.json"))["user.tfrfs.kind"] == b"float_list"
        s.mkdir("/new.tfrecord/b")
        s.write("/new.tfrecord/b/ids.json", b"[]\n")   # the key has a kind now
        s.commit()
    finally:
        s.close()
    assert kinds_of(root, "new.tfrecord") == [{"ids": "float_list", "name": "bytes_list"}, {"ids": "float_list"}]


def test_iterating_the_kinds_of_a_store_with_records_given_ends(tmp_path: Path) -> None:
    """``RecordStore.kinds`` answers ``--records`` for every shard, and only for shards there are:
    ``set(store.kinds)`` once never ended (a mount's mkdir of a new shard hung)."""
    root = tmp_path / "ds"
    root.mkdir()
    write_shard(root / "a.tfrecord", [example(id=1)])
    write_shard(root / "b.tfrecord", [example(id=2)])
    cache = index.IndexCache(tmp_path / "c")
    indexes = [cache.get(s)[0] for s in discovery.discover(str(root)).shards]
    for records in (None, "example", "sequence", "raw"):
        store = RecordStore(list(indexes), default_readers(), records=records)
        try:
            # Taken through islice: on the old code, a bare list() never returned.
            assert list(itertools.islice(store.kinds, 10)) == [records or "example"] * 2
            assert store.kinds[-1] == (records or "example")
        finally:
            store.close(factory=True)
