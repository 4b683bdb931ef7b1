"""A commit of a dataset with a manifest and shipped indexes (SPEC 1.2), killed at every durable
step: the next mount recovers and commits, and a read-only mount from the manifest then shows
exactly the committed records, whatever step the crash hit (an index file or manifest entry of an
old shard is told apart by its size and identity, and reported, never used)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tfrfs.storage import durable
from tfrfs.index import idxfile
from tfrfs.index import manifest
from tfrfs.format import proto
from tfrfs.cli.parser import main
from tfrfs.dataset.assembly import open_mount
from tfrfs.dataset.sources import index_source, open_source

from inprocess import Session
from support import reference

sys.path.insert(0, str(Path(__file__).parent))
from test_crash import CRASHED, Faults, crash_at, example, shard_records, write_shard  # noqa: E402

SHARDS = {"a.tfrecord": 5, "sub/b.tfrecord": 4, "c.tfrecord": 3}


@pytest.fixture
def template(tmp_path: Path) -> Path:
    root = tmp_path / "template"
    for n, (rel, count) in enumerate(SHARDS.items()):
        write_shard(root / rel, "NONE", [example(10 * n + i) for i in range(count)])
    assert main(["index", str(root), "--beside", "--cache-dir", str(tmp_path / "indexer")]) == 0
    assert (root / manifest.NAME).is_file()
    return root


def stage(s: Session) -> None:
    s.write("/a.tfrecord/000001/label.json", b"[555]\n")
    s.rm_r("/sub/b.tfrecord/000000")
    s.rm_r("/c.tfrecord")          # a whole shard removed


def read_only_records(root: Path, cache: Path) -> tuple[dict[str, list[bytes]], str]:
    """What a read-only mount from the manifest shows (every record's bytes), and its errors."""
    src = open_source(str(root), cache_dir=cache, use_manifest=True)
    m = open_mount(src, indexed=index_source(src))
    try:
        assert src.manifest is not None
        tree = m.tree
        shown = {}
        for rel in SHARDS:
            try:
                node = tree.lookup("/" + rel)
            except OSError:
                continue      # not shown
            n = m.store.shard_number(rel)
            assert n is not None
            shown[rel] = [m.store.record_bytes(n, rid)[0] for rid, _, _ in tree.record_names(node)]
        return shown, tree.errors.render().decode()
    finally:
        m.close()
        src.close()


def test_a_commit_killed_at_every_step_keeps_the_manifest_truthful(template: Path, tmp_path: Path,
                                                                  monkeypatch) -> None:
    monkeypatch.setattr(durable.os, "fsync", lambda fd: None)   # crashes, not power loss: see test_crash
    counting = tmp_path / "count"
    shutil.copytree(template, counting)
    s = Session(counting, tmp_path / "cache-count")
    stage(s)
    hook = Faults()
    durable.fault_hook = hook
    try:
        s.commit()
    finally:
        durable.fault_hook = None
    s.close()
    expected = {rel: shard_records(counting / rel) for rel in ("a.tfrecord", "sub/b.tfrecord")}
    assert reference.values(expected["a.tfrecord"][1], "label") == [555]
    assert len(expected["sub/b.tfrecord"]) == SHARDS["sub/b.tfrecord"] - 1
    steps = [p for _, p in hook.calls]
    assert any(p.endswith(manifest.NAME) for p in steps) and any(p.endswith(idxfile.SUFFIX) for p in steps), \
        "the commit writes the index files and the manifest through the durable seam"
    shown, errors = read_only_records(counting, tmp_path / "ro-count")
    assert shown == expected and errors == "", errors
    for n in range(1, len(hook.calls) + 1):
        root = tmp_path / f"k{n}"
        shutil.copytree(template, root)
        cache = tmp_path / f"cache{n}"
        staged = Session(root, cache)
        stage(staged)
        staged.close()
        info = crash_at(n, root, cache, lambda s, progress: s.commit())
        where = f"crash {n}/{len(hook.calls)} at {info.get('at')}"
        assert info["status"] == CRASHED, where
        # Right after the crash, before any recovery: a read-only mount from the manifest shows
        # each shard as it is on disk, old or new, never the manifest's idea of it.
        on_disk = {rel: shard_records(root / rel) for rel in SHARDS if (root / rel).exists()}
        shown, _ = read_only_records(root, tmp_path / f"mid{n}")
        assert shown == on_disk, where
        after = Session(root, cache)     # the next --rw mount: recovers, then commits what is staged
        after.commit()
        after.close()
        assert {rel: shard_records(root / rel) for rel in expected} == expected, where
        assert not (root / "c.tfrecord").exists(), where
        shown, errors = read_only_records(root, tmp_path / f"ro{n}")
        assert shown == expected, f"{where}: {errors}"
        body = json.loads((root / manifest.NAME).read_text())
        assert sorted(e["path"] for e in body["shards"]) == ["a.tfrecord", "sub/b.tfrecord"], where
        assert not os.path.exists(root / ("c.tfrecord" + idxfile.SUFFIX)), where
