"""A commit asked for through ``.tfrfs/commit`` runs on a thread of its own (``edit.commit``): the
mount answers meanwhile with what it held before, refuses changes (EBUSY), and puts each new
shard in place only while no request holds the mount's guard. Without FUSE: the requests are
made as the adapter makes them, holding ``Mount.guard``."""

from __future__ import annotations

import errno
import json
import threading
from pathlib import Path
from typing import Iterator

import pytest

from tfrfs.edit.repack import ShardPlan, Written
from tfrfs.errors import Busy
from tfrfs.format import proto
from tfrfs.format import tfrecord

from inprocess import Session


def example(i: int) -> bytes:
    ex = proto.Example()
    ex.features.feature["label"].int64_list.value.append(i)
    return ex.SerializeToString(deterministic=True)


def labels(path: Path) -> list[int]:
    return [proto.Example.FromString(r).features.feature["label"].int64_list.value[0]
            for r in tfrecord.iter_records(path)]


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    root = tmp_path / "src"
    root.mkdir()
    with open(root / "a.tfrecord", "wb") as f:
        w = tfrecord.StreamWriter(f, tfrecord.NONE)
        for i in range(3):
            w.write(example(i))
        w.close()
    s = Session(root, tmp_path / "cache")
    try:
        yield s
    finally:
        s.close()


def held_jobs(s: Session, go: threading.Event) -> tuple:
    """The mount's own write jobs, each held until ``go`` is set."""
    jobs = s.mount.write_jobs(None)

    def write_jobs(plans: list[ShardPlan]) -> Iterator[Written]:
        go.wait(30)
        yield from jobs(plans)
    return write_jobs


def read(s: Session, path: str) -> bytes:
    with s.mount.guard:   # as the FUSE adapter answers a request
        return s.tree.open(s.tree.lookup(path)).read(1 << 20, 0)


def commit_file(s: Session) -> dict:
    return json.loads(read(s, "/.tfrfs/commit"))


def test_the_mount_answers_while_a_commit_runs(session: Session) -> None:
    s = session
    src = Path(s.tree.discovery.root)
    s.write("/a.tfrecord/000001/label.json", b"[7]")
    go = threading.Event()
    assert commit_file(s) == {"commits": 0, "running": False}
    s.mount.committer.start(held_jobs(s, go))
    try:
        doc = commit_file(s)
        assert doc["running"] and doc["commits"] == 1
        # Reads and listings answer with what was there before: the staged edit included.
        assert read(s, "/a.tfrecord/000001/label.json") == b"[7]\n"
        assert read(s, "/a.tfrecord/000002/label.json") == b"[2]\n"
        assert [n for n, _ in s.tree.names(s.tree.lookup("/a.tfrecord"))] == ["000000", "000001", "000002"]
        assert s.mount.status().to_json()["committing"]
        # Changes are refused until it is over: it works from what was staged when it started.
        assert s.mount.busy() is not None
        with pytest.raises(Busy) as refused:
            s.write("/a.tfrecord/000002/label.json", b"[9]")
        assert refused.value.errno == errno.EBUSY
        assert any("commit is running" in r.reason for r in s.tree.errors.rejected)
        assert labels(src / "a.tfrecord") == [0, 1, 2]
    finally:
        go.set()
        s.mount.committer.wait(30)
    doc = commit_file(s)
    assert doc["ok"] and not doc["running"] and doc["commits"] == 1
    assert [r["relpath"] for r in doc["shards"]] == ["a.tfrecord"]
    assert labels(src / "a.tfrecord") == [0, 7, 2]
    assert s.mount.busy() is None and not s.mount.status().committing
    assert read(s, "/a.tfrecord/000002/label.json") == b"[2]\n"
    s.write("/a.tfrecord/000002/label.json", b"[9]")   # open to changes again
    assert s.pending() == ["a.tfrecord"]


def test_the_new_shard_is_put_in_place_between_requests(session: Session) -> None:
    s = session
    src = Path(s.tree.discovery.root)
    s.write("/a.tfrecord/000000/label.json", b"[5]")
    go = threading.Event()
    with s.mount.guard:   # a request that takes long: the commit writes, but waits to swap
        s.mount.committer.start(held_jobs(s, go))
        go.set()
        s.mount.committer.wait(0.5)
        assert s.mount.committer.running
        assert labels(src / "a.tfrecord") == [0, 1, 2]
        assert s.tree.open(s.tree.lookup("/a.tfrecord/000000/label.json")).read(100, 0) == b"[5]\n"
    s.mount.committer.wait(30)
    assert labels(src / "a.tfrecord") == [5, 1, 2]
    assert s.pending() == []


def test_a_failed_commit_says_why_and_keeps_the_edits(session: Session) -> None:
    s = session

    def failing(plans: list[ShardPlan]) -> Iterator[Written]:
        for _ in plans:
            yield Written(0, OSError(errno.ENOSPC, "No space left on device"))
    s.write("/a.tfrecord/000001/label.json", b"[7]")
    s.mount.committer.start(failing)
    s.mount.committer.wait(30)
    doc = commit_file(s)
    assert doc["ok"] is False and "disk full" in doc["error"] and not doc["running"]
    assert s.pending() == ["a.tfrecord"]
    assert read(s, "/a.tfrecord/000001/label.json") == b"[7]\n"


def test_a_commit_asked_for_while_one_runs_is_that_one(session: Session) -> None:
    s = session
    s.write("/a.tfrecord/000001/label.json", b"[7]")
    go = threading.Event()
    s.mount.committer.start(held_jobs(s, go))
    try:
        s.mount.control(b"commit\n")
        assert commit_file(s)["commits"] == 1
    finally:
        go.set()
        s.mount.committer.wait(30)
    assert commit_file(s)["ok"]
