"""A bucket edited through a ``--rw`` mount, read by the real TensorFlow (SPEC 7.1): after the
commit, the objects the manifest names for the shards (``tfrfs.open(URL).shards[i].file``) are
shards TensorFlow reads, record for record, as it reads a local copy that took the same edits."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import tfrfs
from conftest import run_tfrfs
from support.tfview import differences, sha, tf_view

pytestmark = [pytest.mark.tf, pytest.mark.mount]

EDITS = {"train/train-00000-of-00002.tfrecord/000001/image/object/class/label.json": "[5, 6]\n",
         "tabular.tfrecord.gz/000003/age.json": "[41]\n"}
REMOVED = "val/val-00000-of-00001.tfrecord/000002"


def _edit(mnt: Path) -> None:
    for rel, text in EDITS.items():
        (mnt / rel).write_text(text)
    shutil.rmtree(mnt / REMOVED)


def test_tensorflow_reads_the_committed_bucket_as_the_local_copy(sample: Path, s3, tfrfs_mount,
                                                                 tmp_path: Path) -> None:
    local = shutil.copytree(sample, tmp_path / "local")
    mnt = tfrfs_mount(local, "--rw")
    _edit(mnt)
    assert run_tfrfs("umount", str(mnt)).returncode == 0

    s3.upload_tree(sample, "ds")
    mnt = tfrfs_mount(s3.url("ds"), "--rw", "--cache-dir", str(tmp_path / "cb"))
    _edit(mnt)
    assert run_tfrfs("umount", str(mnt)).returncode == 0

    # The objects that hold the shards now, as TensorFlow gets them (downloaded whole).
    got = tmp_path / "got"
    with tfrfs.open(s3.url("ds"), cache_dir=str(tmp_path / "c1")) as d:
        shards = d.shards
    named = {}
    for s in shards:
        key = s.file[len(s3.url("")):].lstrip("/")
        target = got / s.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(s3.get(key))
        named[s.path] = (str(target), s.compression, s.kind)
    edited = {s.file for s in shards if ".tfrfs-objects/" in s.file}
    assert len(edited) == 3, shards   # the three shards the edits touched, held by new objects
    theirs = tf_view(list(named.values()))
    problems = []
    with tfrfs.open(str(local), cache_dir=str(tmp_path / "c2")) as want:
        assert [(s.path, s.records) for s in want.shards] == [(s.path, s.records) for s in shards]
        for s in want.shards:
            view = theirs[named[s.path][0]]
            assert view["error"] is None, (s.path, view["error"])
            # The same stored bytes as the local commit wrote, and the values TensorFlow parses.
            assert view["records"] == [sha(r) for r in want.records(s.path)], s.path
            for i in range(s.records):
                problems += differences(want.example(s.path, i), view["values"][i], f"{s.path}[{i}]")
    assert not problems, problems[:10]
