"""One suite every ``Storage`` passes: the local file system, fsspec's in-memory store, a local
folder reached as ``file://`` through fsspec, S3 (moto on loopback, through the proxy) and GCS
(gcp-storage-emulator on loopback, behind the gate that keeps its generation preconditions)."""

from __future__ import annotations

import pickle
import threading
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from tfrfs.errors import UsageError
from tfrfs.storage.base import Conflict, Location, NotSupported, Storage
from tfrfs.storage.factory import is_url, locate, open_storage
from tfrfs.storage.fsspec_storage import FsspecStorage
from tfrfs.storage.local_storage import LocalStorage


@pytest.fixture(params=["local", "memory", "file", "s3", "gs"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Storage, str]]:
    """(a storage, an empty folder or prefix in it)."""
    kind = request.param
    if kind == "local":
        root = str(tmp_path / "root")
        (tmp_path / "root").mkdir()
        yield open_storage(root), root
    elif kind == "memory":
        root = f"memory://tfrfs-contract-{uuid.uuid4().hex}"
        yield open_storage(root), root
    elif kind == "file":
        (tmp_path / "root").mkdir()
        root = f"file://{tmp_path / 'root'}"
        yield open_storage(root), root
    elif kind == "gs":
        request.getfixturevalue("gcs")   # an empty bucket "data", the environment set
        root = "gs://data/contract"
        yield open_storage(root, {"retries": 2, "timeout": 10}), root
    else:
        from support.remote_fixtures import S3Rig
        if not isinstance(request.getfixturevalue("s3"), S3Rig):   # a fresh bucket "data", the AWS variables set
            pytest.skip("the remote tests run on file:// here: no S3 server")
        root = "s3://data/contract"
        yield open_storage(root, {"retries": 2, "timeout": 10}), root


def test_the_factory_picks_the_storage_by_the_name() -> None:
    assert isinstance(open_storage("/tmp"), LocalStorage)
    assert isinstance(open_storage("relative/path"), LocalStorage)
    assert isinstance(open_storage("memory://x"), FsspecStorage)
    assert isinstance(open_storage("file:///tmp"), FsspecStorage)
    assert is_url("s3://b/k") and is_url("HTTPS://h/x") and is_url("file:///tmp") and not is_url("/tmp/x")
    assert not is_url("ftp://h/x") and not is_url("relative/s3://x")
    with pytest.raises(UsageError):
        open_storage("/tmp", {"anon": True})


def test_absolute_names_the_same_place_from_anywhere(place: tuple[Storage, str], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    st, root = place
    path = st.join(root, "a", "one.bin")
    assert st.absolute(path) == path   # the fixture's roots are absolute already
    if isinstance(st, LocalStorage):
        monkeypatch.chdir(tmp_path)
        assert st.absolute("root/a") == str(tmp_path / "root" / "a")


def test_a_location_is_small_and_travels(tmp_path: Path) -> None:
    loc = locate(str(tmp_path) + "/sub")
    assert loc == Location(str(tmp_path / "sub")) and loc.name == "sub"
    assert pickle.loads(pickle.dumps(loc)) == loc
    url = locate("memory://bucket/prefix/", {"retries": 1})
    assert url.root == "memory://bucket/prefix" and url.options == (("retries", 1),)
    assert url.join("a/b") == "memory://bucket/prefix/a/b"
    assert url.storage() is pickle.loads(pickle.dumps(url)).storage()   # one storage a process


def test_write_read_stat_delete(place: tuple[Storage, str]) -> None:
    st, root = place
    path = st.join(root, "a", "one.bin")
    assert st.stat(path) is None
    st.write(path, b"hello world")
    got = st.stat(path)
    assert got is not None and got.size == 11 and got.identity and not got.is_dir and got.mtime_ns > 0
    assert st.read(path) == b"hello world"
    assert st.read_range(path, 6, 11) == b"world"
    assert st.read_range(path, 6, 100) == b"world"   # fewer only past the end
    with st.open_read(path) as f:
        assert f.read() == b"hello world"
    st.write(path, b"HELLO")
    again = st.stat(path)
    assert again is not None and again.size == 5 and again.identity != got.identity
    assert st.read(path) == b"HELLO"
    st.delete(path)
    assert st.stat(path) is None
    st.delete(path)   # not there: no error
    with pytest.raises(FileNotFoundError):
        st.read(path)


def test_unsynced_writes_and_sync_all(place: tuple[Storage, str]) -> None:
    st, root = place
    path = st.join(root, "r", "x.json")
    st.write(path, b"{}", sync=False)
    st.sync_all(root)
    assert st.read(path) == b"{}"


def test_listing_with_details(place: tuple[Storage, str]) -> None:
    st, root = place
    for name, data in [("b.txt", b"bb"), ("a.txt", b"a"), ("sub/c.txt", b"ccc"), ("sub/deep/d.txt", b"dddd")]:
        st.write(st.join(root, name), data)
    flat = st.list(root)
    assert flat is not None
    assert [(e.name, e.stat.is_dir) for e in flat] == [("a.txt", False), ("b.txt", False), ("sub", True)]
    assert flat[0].stat.size == 1 and flat[0].path == st.join(root, "a.txt")
    deep = st.list(root, recursive=True)
    assert deep is not None
    assert [(e.name, e.stat.size) for e in deep] == [("a.txt", 1), ("b.txt", 2), ("sub/c.txt", 3), ("sub/deep/d.txt", 4)]
    assert all(e.stat.identity == st.stat(e.path).identity for e in deep)   # type: ignore[union-attr]
    assert st.list(st.join(root, "nothing-here"), recursive=True) in (None, [])


def test_a_source_is_listed_as_one_file_a_folder_or_a_glob(place: tuple[Storage, str]) -> None:
    st, root = place
    for name, data in [("b.txt", b"bb"), ("a.txt", b"a"), ("sub/c.txt", b"ccc"), ("sub/deep/a.txt", b"dddd"),
                       (".tfrfs-staging/x", b"staged")]:
        st.write(st.join(root, name), data)
    folder = st.list_source(root)
    assert not folder.named and folder.root == root
    assert [(rel, o.size) for rel, o in folder.files] == [("a.txt", 1), ("b.txt", 2), ("sub/c.txt", 3),
                                                           ("sub/deep/a.txt", 4)]
    assert folder.dirs == ("", "sub", "sub/deep")
    assert all(st.read(o.url) == st.read(st.join(root, rel)) and o.identity for rel, o in folder.files)
    one = st.list_source(st.join(root, "sub", "c.txt"))
    assert one.named and one.root == st.join(root, "sub") and [rel for rel, _ in one.files] == ["c.txt"]
    globbed = st.list_source(st.join(root, "*.txt"))
    assert not globbed.named and [rel for rel, _ in globbed.files] == ["a.txt", "b.txt"]
    with pytest.raises(UsageError):
        st.list_source(st.join(root, "none*.txt"))


def test_the_head_of_a_file(place: tuple[Storage, str]) -> None:
    st, root = place
    path = st.join(root, "h.bin")
    st.write(path, b"0123456789")
    assert st.read_head(path, 4) == b"0123"
    assert st.read_head(path, 100) == b"0123456789"


def test_streamed_create(place: tuple[Storage, str]) -> None:
    st, root = place
    path = st.join(root, "s", "big.bin")
    st.makedirs(st.join(root, "s"))
    w = st.create(path)
    for _ in range(4):
        w.file.write(b"x" * 1000)
    got = st.finish(path, w)
    assert got.size == 4000 and st.stat(path) == got
    assert st.read_range(path, 3990, 4000) == b"x" * 10


def test_rename_replaces(place: tuple[Storage, str]) -> None:
    st, root = place
    src, dst = st.join(root, "src.bin"), st.join(root, "dst.bin")
    st.write(src, b"new")
    st.write(dst, b"old")
    st.rename(src, dst)
    assert st.stat(src) is None and st.read(dst) == b"new"


def test_conditional_writes(place: tuple[Storage, str]) -> None:
    st, root = place
    path = st.join(root, "lock", "owner.json")
    try:
        made = st.write_if(path, b"first", identity=None)
    except NotSupported:
        pytest.skip("this storage has no conditional write")
    with pytest.raises(Conflict):
        st.write_if(path, b"second", identity=None)
    assert st.read(path) == b"first"
    seen = st.stat(path)
    assert seen is not None and seen.identity == made   # what the write said it wrote
    replaced = st.write_if(path, b"replaced", identity=seen.identity)
    assert st.read(path) == b"replaced"
    now = st.stat(path)
    assert now is not None and now.identity == replaced != made
    with pytest.raises(Conflict):
        st.write_if(path, b"stale", identity=seen.identity)   # changed since it was looked at
    assert st.read(path) == b"replaced"


def test_only_one_of_racing_creates_wins(place: tuple[Storage, str]) -> None:
    st, root = place
    path = st.join(root, "race")
    won: list[int] = []
    lost: list[int] = []
    unsupported: list[int] = []

    def one(n: int) -> None:
        try:
            st.write_if(path, str(n).encode(), identity=None)
            won.append(n)
        except Conflict:
            lost.append(n)
        except NotSupported:
            unsupported.append(n)
    threads = [threading.Thread(target=one, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if unsupported:
        pytest.skip("this storage has no conditional write")
    assert len(won) == 1 and len(lost) == 5 and st.read(path) == str(won[0]).encode()


def test_cache_keys_follow_identity(place: tuple[Storage, str]) -> None:
    st, root = place
    path = st.join(root, "k")
    assert st.cache_key(path, "etag:1") != st.cache_key(path, "etag:2")
    assert st.cache_key(path, "etag:1") == st.cache_key(path, "etag:1")


def test_remove_tree(place: tuple[Storage, str]) -> None:
    st, root = place
    folder = st.join(root, "tree")
    for name in ("x", "y/z", "y/w/v"):
        st.write(st.join(folder, name), b"1")
    st.write(st.join(root, "kept"), b"2")
    st.remove_tree(folder)
    st.sync_folder(root)
    assert [e.name for e in st.list(root, recursive=True) or []] == ["kept"]
    assert st.stat(folder) is None


def test_copy_and_upload(place: tuple[Storage, str], tmp_path: Path) -> None:
    st, root = place
    src, dst = st.join(root, "c", "src"), st.join(root, "c", "dst")
    st.write(src, b"copied")
    st.write(dst, b"old bytes")
    st.copy(src, dst)
    assert st.read(dst) == b"copied" and st.read(src) == b"copied"
    st.copy(src, st.join(root, "c", "new", "folder", "dst"))   # into a folder not there yet
    assert st.read(st.join(root, "c", "new", "folder", "dst")) == b"copied"
    st.rename(dst, st.join(root, "c", "other", "dst"))
    assert st.read(st.join(root, "c", "other", "dst")) == b"copied" and st.stat(dst) is None
    local = tmp_path / "up.bin"
    local.write_bytes(b"u" * 5000)
    st.upload(str(local), st.join(root, "c", "up"))
    assert st.read(st.join(root, "c", "up")) == b"u" * 5000
