"""The dataset manifest (SPEC 1.2): what ``index --beside`` writes, and what a mount from it
opens, seen through the interpreter's audit events (every open and listing of this process)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import crc32c
import pytest

from tfrfs.index import idxfile
from tfrfs.index import manifest
from tfrfs.cli.parser import main
from tfrfs.dataset.assembly import open_mount
from tfrfs.dataset.sources import index_source, open_source

sys.path.insert(0, str(Path(__file__).parent))
from test_index import example, write_shard  # noqa: E402

_watch: list[tuple[str, str]] = []
_watching = [False]


def _audit(event: str, args: tuple) -> None:
    if _watching[0] and event in ("open", "os.scandir", "os.listdir") and args and \
            isinstance(args[0], (str, bytes, os.PathLike)):
        _watch.append((event, os.fsdecode(args[0])))


sys.addaudithook(_audit)


class Touched:
    """Files and folders under ``root`` this process opens or lists while in the ``with``."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.seen: set[tuple[str, str]] = set()

    def __enter__(self) -> "Touched":
        _watch.clear()
        _watching[0] = True
        return self

    def __exit__(self, *exc: object) -> None:
        _watching[0] = False
        self.seen = {(e, os.path.relpath(p, self.root)) for e, p in _watch
                     if p == self.root or p.startswith(self.root + os.sep)}


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    for folder, n in (("train", 3), ("test", 2)):
        (root / folder).mkdir(parents=True)
        for s in range(n):
            write_shard(root / folder / f"p{s}.tfrecord", [example(id=100 * s + i) for i in range(20)])
    (root / "info.json").write_text("{}")
    assert main(["index", str(root), "--beside", "--cache-dir", str(tmp_path / "indexer")]) == 0
    return root


def test_the_manifest_names_every_shard_with_what_a_mount_needs(dataset: Path) -> None:
    body = json.loads((dataset / manifest.NAME).read_text())
    assert body["tfrfs_manifest"] == 1
    shards = {e["path"]: e for e in body["shards"]}
    assert sorted(shards) == ["test/p0.tfrecord", "test/p1.tfrecord", "train/p0.tfrecord", "train/p1.tfrecord",
                              "train/p2.tfrecord"]
    e = shards["train/p1.tfrecord"]
    st = (dataset / "train" / "p1.tfrecord").stat()
    data = (dataset / "train" / ("p1.tfrecord" + idxfile.SUFFIX)).read_bytes()
    assert (e["size"], e["mtime_ns"], e["count"], e["kind"], e["compression"]) == \
        (st.st_size, st.st_mtime_ns, 20, "example", "NONE")
    assert e["index"] == {"file": "p1.tfrecord" + idxfile.SUFFIX, "size": len(data), "crc32c": crc32c.crc32c(data)}
    assert {f["path"] for f in body["files"]} >= {"info.json", "train/p1.tfrecord" + idxfile.SUFFIX}
    assert body["schema"]["features"]["id"]["records"] == 100
    assert {d["path"] for d in body["dirs"]} == {"", "train", "test"}


def test_a_mount_from_the_manifest_opens_only_what_is_looked_up(dataset: Path, tmp_path: Path) -> None:
    with Touched(dataset) as mounting:
        src = open_source(str(dataset), cache_dir=tmp_path / "c", use_manifest=True)
        m = open_mount(src, indexed=index_source(src))
    try:
        assert mounting.seen == {("open", manifest.NAME)}, "the manifest alone"
        tree = m.tree
        with Touched(dataset) as listing:
            names = [n for n, _ in tree.names(tree.lookup("/train/p1.tfrecord"))]
        assert len(names) == 20
        # Visiting a folder compares it with the disk: one listing of each on the way, nothing opened.
        assert listing.seen == {("os.scandir", "."), ("os.scandir", "train")}, listing.seen
        with Touched(dataset) as reading:
            node = tree.lookup("/train/p1.tfrecord/000007/id.json")
            assert tree.read(node, 100, 0) == b"[107]\n"
        opened = {p for e, p in reading.seen if e == "open"}
        assert opened == {"train/p1.tfrecord", "train/p1.tfrecord" + idxfile.SUFFIX}, reading.seen
        assert not {e for e, _ in reading.seen} - {"open"}
    finally:
        m.close()
        src.close()


def test_a_damaged_manifest_is_not_used(dataset: Path, tmp_path: Path, caplog) -> None:
    (dataset / manifest.NAME).write_text('{"tfrfs_manifest": 1, "shards": [{"path": "../x"}]}')
    src = open_source(str(dataset), cache_dir=tmp_path / "c", use_manifest=True)
    try:
        assert src.manifest is None and len(src.discovery.shards) == 5
        assert "the folder is listed instead" in caplog.text
    finally:
        src.close()
