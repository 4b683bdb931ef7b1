"""Many requests in flight at once: readers of one shard that never see a mix while a commit
publishes, listings that are never stale after a commit, and names the kernel forgets and asks
for again."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

import pytest

from conftest import run_tfrfs
from tfrfs.format import proto, tfrecord

pytestmark = pytest.mark.mount

RECORDS = 60


def _shard(folder: Path, records: int = RECORDS, repeat: int = 50) -> Path:
    folder.mkdir(parents=True)
    frames = []
    for i in range(records):
        ex = proto.Example()
        ex.features.feature["label"].int64_list.value.append(i)
        ex.features.feature["text"].bytes_list.value.append(f"record {i} ".encode() * repeat)
        frames.append(tfrecord.frame(ex.SerializeToString()))
    (folder / "a.tfrecord").write_bytes(b"".join(frames))
    return folder


def _label(path: Path) -> int:
    return json.loads(path.read_text())[0]


def test_readers_of_one_shard_see_the_old_or_the_new_record_while_a_commit_publishes(
        tmp_path: Path, tfrfs_mount) -> None:
    """Record 0 is removed and committed while eight threads read labels and texts of the other
    records: a path shows the record it showed before (names stay until the commit) or, once
    the commit is in, the record that follows it; its label and its text always of one record."""
    src = _shard(tmp_path / "src")
    mnt = tfrfs_mount(src, "--rw")
    shard = mnt / "a.tfrecord"
    os.system(f"rm -r {shard / '000000'}")
    stop = threading.Event()
    problems: list[str] = []
    reads = [0]

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            i = rng.randrange(1, RECORDS - 1)
            rec = shard / f"{i:06d}"
            try:
                label = _label(rec / "label.json")
                text = (rec / "text.txt").read_bytes()
            except FileNotFoundError:
                continue   # renumbered between the two reads: asked again
            except OSError as exc:
                problems.append(f"{rec}: {exc}")
                continue
            if label not in (i, i + 1):
                problems.append(f"{rec}: label {label}")
            elif text != f"record {label} ".encode() * 50 and text != f"record {label + 1} ".encode() * 50 \
                    and text != f"record {label - 1} ".encode() * 50:
                problems.append(f"{rec}: label {label} with text {text[:20]!r}")
            reads[0] += 1

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.3)
        run_tfrfs("commit", str(mnt), check=True)
        time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not problems, problems[:5]
    assert reads[0] > 50
    for i in range(RECORDS - 1):   # after the commit: every path shows the record after it
        assert _label(shard / f"{i:06d}" / "label.json") == i + 1


def test_a_listing_after_a_commit_is_never_stale(tmp_path: Path, tfrfs_mount) -> None:
    """A --rw mount's folders are listed afresh after a commit renumbers their records (also a
    folder opened before the commit, read again from its start after it)."""
    src = _shard(tmp_path / "src", 5)
    mnt = tfrfs_mount(src, "--rw")
    shard = mnt / "a.tfrecord"
    assert sorted(os.listdir(shard)) == [f"{i:06d}" for i in range(5)]
    os.system(f"rm -r {shard / '000001'} {shard / '000003'}")
    assert sorted(os.listdir(shard)) == ["000000", "000002", "000004"]   # names kept until the commit
    fd = os.open(shard, os.O_RDONLY | os.O_DIRECTORY)
    try:
        run_tfrfs("commit", str(mnt), check=True)
        assert sorted(os.listdir(shard)) == ["000000", "000001", "000002"]
        assert [_label(shard / f"{i:06d}" / "label.json") for i in range(3)] == [0, 2, 4]
        os.lseek(fd, 0, os.SEEK_SET)
        assert sorted(os.listdir(fd)) == ["000000", "000001", "000002"]
    finally:
        os.close(fd)


def test_names_the_kernel_forgot_are_found_again(tmp_path: Path, tfrfs_mount) -> None:
    """After the kernel drops what it holds of a read-only mount (FORGET for every name), every
    path is found again, with the same inode numbers."""
    if not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        pytest.skip("emptying the kernel's caches needs root")
    src = _shard(tmp_path / "src", 20)
    mnt = tfrfs_mount(src)
    before = {p: os.stat(p).st_ino for p in sorted(mnt.rglob("*"))}
    labels = {p: _label(p) for p in before if p.name == "label.json"}
    assert len(labels) == 20
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")   # dentries and inodes: the kernel forgets them, and tells the daemon
    time.sleep(0.2)
    assert {p: os.stat(p).st_ino for p in sorted(mnt.rglob("*"))} == before
    assert {p: _label(p) for p in labels} == labels


def test_many_readers_at_once_read_what_one_reads(tmp_path: Path, tfrfs_mount) -> None:
    """Eight threads reading every file of a read-only mount, in different orders, read the
    same bytes as one reader."""
    src = _shard(tmp_path / "src", RECORDS)
    mnt = tfrfs_mount(src)
    files = sorted(p for p in mnt.rglob("*") if p.is_file())
    want = {p: p.read_bytes() for p in files}
    wrong: list[str] = []

    def reader(seed: int) -> None:
        order = list(files)
        random.Random(seed).shuffle(order)
        for p in order:
            if p.read_bytes() != want[p]:
                wrong.append(str(p))

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, wrong[:5]


def test_a_read_waiting_on_the_store_does_not_hold_up_other_requests(tmp_path: Path, tfrfs_mount, http_server,
                                                                     http_proxy) -> None:
    """While one reader waits 4 s for a slow bucket, the mount answers other requests at once:
    names, attributes and listings it knows from the index."""
    src = _shard(tmp_path / "src", repeat=20_000)   # records of ~200 KB: the last is not read ahead
    run_tfrfs("index", str(src), "--beside", check=True)   # the mount reads no record until asked
    proxy = http_proxy(http_server(src))
    mnt = tfrfs_mount(proxy.url)
    shard = mnt / "a.tfrecord"
    proxy.latency = 4.0
    slow: list[float] = []
    waiting = threading.Thread(target=lambda: slow.append(_label(shard / f"{RECORDS - 1:06d}" / "label.json")))
    started = time.monotonic()
    waiting.start()
    try:
        time.sleep(0.5)   # the slow read is under way
        t0 = time.monotonic()
        assert len(os.listdir(shard)) == RECORDS
        assert os.stat(shard / "000002").st_mode & 0o040000
        assert os.stat(mnt / "a.tfrecord").st_nlink >= 1
        quick = time.monotonic() - t0
    finally:
        waiting.join(60)
        proxy.latency = 0.0
    assert slow == [RECORDS - 1] and time.monotonic() - started >= 4.0
    assert quick < 2.0, f"other requests took {quick:.1f} s while one waited on the store"
