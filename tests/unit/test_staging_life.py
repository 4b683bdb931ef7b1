"""The staging folder's life, without FUSE: the writer lock and who holds it, dropping everything
staged (with the count ``tfrfs discard`` reports), the folder removed once nothing is staged, and
what a writable mount does with its edits when it ends (``Mount.finish``)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

import pytest

from tfrfs.format import proto
from tfrfs.format import tfrecord
from tfrfs.errors import Busy, UsageError
from tfrfs.index.discovery import STAGING_DIR
from tfrfs.dataset.assembly import discard, open_mount, staged_in
from tfrfs.edit.journal import Staging

from inprocess import Session
from support import reference


def example(i: int) -> bytes:
    ex = proto.Example()
    ex.features.feature["label"].int64_list.value.append(i)
    return ex.SerializeToString(deterministic=True)


def write_shard(path: Path, n: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        w = tfrecord.StreamWriter(f, tfrecord.NONE)
        for i in range(n):
            w.write(example(i))
        w.close()


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    write_shard(root / "a.tfrecord", 3)
    write_shard(root / "b.tfrecord", 2)
    return root


def labels(path: Path) -> list[int]:
    return [reference.values(r, "label")[0] for r in reference.written_records(path)]


def session(src: Path, tmp_path: Path) -> Session:
    return Session(src, tmp_path / "cache")


def test_nothing_staged_leaves_no_staging_folder(src: Path, tmp_path: Path) -> None:
    s = session(src, tmp_path)
    assert (src / STAGING_DIR / "lock").exists()
    s.close()
    assert not (src / STAGING_DIR).exists()


def test_a_commit_of_everything_leaves_no_staging_folder(src: Path, tmp_path: Path) -> None:
    s = session(src, tmp_path)
    s.write("/a.tfrecord/000001/label.json", b"[7]")
    s.commit()
    s.close()
    assert labels(src / "a.tfrecord") == [0, 7, 2]
    assert not (src / STAGING_DIR).exists()


def test_staged_edits_and_scratch_keep_the_folder(src: Path, tmp_path: Path) -> None:
    s = session(src, tmp_path)
    s.write("/a.tfrecord/000001/label.json", b"[7]")
    s.close()
    assert [p.shard for p in staged_in(str(src))] == ["a.tfrecord"]

    s = session(src, tmp_path)
    s.commit()
    s.mkdir("/b.tfrecord/000000/notes")     # a folder of the user's own: it lives in the staging folder
    s.close()
    assert (src / STAGING_DIR).is_dir()
    s = session(src, tmp_path)
    assert "notes" in [name for name, _ in s.tree.names(s.tree.lookup("/b.tfrecord/000000"))]
    s.close()


def test_discard_counts_every_shard_it_drops(src: Path, tmp_path: Path) -> None:
    s = session(src, tmp_path)
    s.write("/a.tfrecord/000001/label.json", b"[7]")
    s.mkdir("/b.tfrecord/000000/notes")     # nothing staged for b but a folder of the user's
    s.close()
    assert discard(str(src)).shards == 2
    assert not (src / STAGING_DIR).exists()
    assert discard(str(src)).shards == 0     # and nothing is made to find that out
    assert not (src / STAGING_DIR).exists()
    s = session(src, tmp_path)
    assert "notes" not in [name for name, _ in s.tree.names(s.tree.lookup("/b.tfrecord/000000"))]
    s.close()


def test_discard_is_refused_while_mounted_writable(src: Path, tmp_path: Path) -> None:
    s = session(src, tmp_path)
    s.mount.attach(str(tmp_path / "mnt"))
    s.write("/a.tfrecord/000001/label.json", b"[7]")
    with pytest.raises(UsageError, match=f"mounted writable at {tmp_path / 'mnt'}"):
        discard(str(src))
    with pytest.raises(Busy, match=f"mounted at {tmp_path / 'mnt'}, process {os.getpid()}"):
        Staging(src).acquire()
    s.close()
    assert [p.shard for p in staged_in(str(src))] == ["a.tfrecord"]


def test_the_lock_at_the_path_is_the_one_that_counts(src: Path) -> None:
    """A mount that ends with nothing staged removes the lock file; a mount that opened that file
    just before takes the lock again on the file that is at the path."""
    first = Staging(src)
    first.acquire()
    os.unlink(src / STAGING_DIR / "lock")    # as an ending mount's tidy does
    second = Staging(src)
    second.acquire()                         # a new lock file: not held by anyone
    with pytest.raises(Busy):
        Staging(src).acquire()
    first.release()
    second.release()
    assert not (src / STAGING_DIR).exists()


def test_finish_after_a_signal_keeps_the_edits(src: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    before = (src / "a.tfrecord").read_bytes()
    s = session(src, tmp_path)
    s.write("/a.tfrecord/000001/label.json", b"[7]")
    with caplog.at_level(logging.INFO, logger="tfrfs"):
        s.mount.finish(False, "stopped by SIGTERM")
    s.close()
    assert (src / "a.tfrecord").read_bytes() == before
    assert [p.shard for p in staged_in(str(src))] == ["a.tfrecord"]
    assert f"stopped by SIGTERM: 1 shard(s)' edits stay staged (a.tfrecord); tfrfs commit {src} or mount again" \
        in caplog.text


def test_finish_after_an_unmount_commits_or_discards(src: Path, tmp_path: Path) -> None:
    s = session(src, tmp_path)
    s.write("/a.tfrecord/000001/label.json", b"[7]")
    s.mount.finish(True, "unmounted")
    s.close()
    assert labels(src / "a.tfrecord") == [0, 7, 2]
    assert s.mount.last_commit is not None and s.mount.last_commit.records_changed == 1

    s = session(src, tmp_path)
    s.write("/a.tfrecord/000001/label.json", b"[8]")
    s.write("/.tfrfs/commit", b"discard\n")    # tfrfs umount --discard
    s.mount.finish(True, "unmounted")
    s.close()
    assert labels(src / "a.tfrecord") == [0, 7, 2] and not (src / STAGING_DIR).exists()

    s = session(src, tmp_path)
    s.write("/a.tfrecord/000001/label.json", b"[9]")
    s.write("/.tfrfs/commit", b"discard\n")
    s.write("/.tfrfs/commit", b"keep\n")       # the unmount failed: commit at a later one again
    s.mount.finish(True, "unmounted")
    s.close()
    assert labels(src / "a.tfrecord") == [0, 9, 2]


def test_a_word_written_while_the_last_ones_release_is_still_to_come_is_read_alone(src: Path, tmp_path: Path) -> None:
    """tfrfs umount --discard whose unmount fails writes "discard", then "keep", each with
    O_WRONLY and its own close. The kernel sends a descriptor's release after close() returns,
    so the daemon may see the second open and write before the first release: "keep" must not
    be written over what is left of "discard" ("keep\nrd"), or the unmount drops the edits."""
    s = session(src, tmp_path)
    s.write("/a.tfrecord/000001/label.json", b"[9]")
    first = s.files.open("/.tfrfs/commit", os.O_WRONLY)
    first.write(b"discard\n", 0)
    first.flush()                  # its close() returned; its release has not come yet
    second = s.files.open("/.tfrfs/commit", os.O_WRONLY)
    second.write(b"keep\n", 0)
    second.flush()
    first.flush(final=True)        # the releases, late
    first.release()
    second.flush(final=True)
    second.release()
    assert not s.mount.discard_at_unmount   # "keep", read as written
    assert s.mount.last_commit is None and not (s.mount.committer and s.mount.committer.running)   # no commit now
    s.mount.finish(True, "unmounted")
    s.close()
    assert labels(src / "a.tfrecord") == [0, 9, 2]


def test_commit_result_says_what_changed(src: Path, tmp_path: Path) -> None:
    s = session(src, tmp_path)
    s.write("/a.tfrecord/000001/label.json", b"[7]")
    for call in s.rm_r_calls("/b.tfrecord/000000"):
        s.do(call)
    s.mkdir("/b.tfrecord/new")
    s.write("/b.tfrecord/new/label.json", b"[5]")
    doc = json.loads(json.dumps(s.mount.commit().to_json()))
    s.close()
    assert doc["records_changed"] == 3
    assert {p["shard"]: (p["edited"], p["deleted"], p["added"]) for p in doc["staged"]} == \
        {"a.tfrecord": (1, 0, 0), "b.tfrecord": (0, 1, 1)}


def test_status_keeps_the_last_refused_writes(src: Path, tmp_path: Path) -> None:
    s = session(src, tmp_path)
    for i in range(25):
        with pytest.raises(ValueError):
            s.write("/a.tfrecord/000001/label.json", f"[{i}".encode())
    rejected = s.mount.status().to_json()["rejected"]
    s.close()
    assert len(rejected) == 20 and all(r["path"] == "a.tfrecord/000001/label.json" for r in rejected)
    assert "JSON" in rejected[-1]["reason"]


def test_commit_source_opens_the_source_writable(src: Path, tmp_path: Path) -> None:
    from tfrfs.dataset.assembly import commit_source
    from tfrfs.dataset.sources import index_source, open_source
    s = session(src, tmp_path)
    s.write("/a.tfrecord/000001/label.json", b"[7]")
    s.close()
    source = open_source(str(src), cache_dir=tmp_path / "cache")
    result = commit_source(source, index_source(source))
    source.close()
    assert result.ok and [r.relpath for r in result.shards] == ["a.tfrecord"]
    assert labels(src / "a.tfrecord") == [0, 7, 2] and not (src / STAGING_DIR).exists()


def test_open_mount_of_an_empty_folder(tmp_path: Path) -> None:
    from tfrfs.dataset.sources import open_source
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match="no TFRecord shard"):
        open_source(str(empty))
    m = open_mount(open_source(str(empty), empty_ok=True), writable=True, cache_dir=str(tmp_path / "cache"))
    assert m.store.shards == [] or len(m.store.shards) == 0
    m.close()
    assert os.listdir(empty) == []


@pytest.mark.parametrize("left", ["lock only", "sub-folders only", "empty folder", "tmp holds a file"])
def test_a_tidy_cut_short_leaves_a_journal_the_next_mount_reuses(left: str, src: Path, tmp_path: Path) -> None:
    """A crash part way through removing an empty staging folder leaves some of it: the next
    writable mount works, stages and commits as usual, and removes it at the end."""
    folder = src / STAGING_DIR
    folder.mkdir()
    if left == "lock only":
        (folder / "lock").write_bytes(b"")
    elif left == "sub-folders only":
        for sub in ("shards", "scratch", "tmp"):
            (folder / sub).mkdir()
    elif left == "tmp holds a file":
        (folder / "tmp").mkdir()
        (folder / "tmp" / "half-written").write_bytes(b"x")
    assert staged_in(str(src)) == ()
    s = session(src, tmp_path)
    s.write("/a.tfrecord/000002/label.json", b"[9]")
    s.commit()
    s.close()
    assert labels(src / "a.tfrecord") == [0, 1, 9]
    assert not folder.exists()


def test_mount_records_of_dead_daemons_are_pruned(tmp_path: Path) -> None:
    from tfrfs.fuse import mountrecord
    dead = _dead_pid()
    old = mountrecord.MountRecord(str(tmp_path / "old"), "/src", "/src", True, dead)
    mountrecord.write(old, base=tmp_path)
    assert mountrecord.read(str(tmp_path / "old"), base=tmp_path) == \
        mountrecord.MountRecord(str(tmp_path / "old"), "/src", "/src", True, dead)
    live = mountrecord.MountRecord(str(tmp_path / "new"), "/src", "/src", False, os.getpid())
    mountrecord.write(live, base=tmp_path)
    assert mountrecord.read(str(tmp_path / "old"), base=tmp_path) is None
    assert mountrecord.read(str(tmp_path / "new"), base=tmp_path) == live
    mountrecord.remove(str(tmp_path / "new"), os.getpid(), base=tmp_path)
    assert list((tmp_path / "mounts").iterdir()) == []


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
