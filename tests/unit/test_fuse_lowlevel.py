"""libfuse's low-level API, without a mount: the request loop's signals, the names the daemon keeps
for the kernel (and lets go of on FORGET), and listings packed in the kernel's layout."""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import time
import tracemalloc
from typing import Any, Iterator

import pytest

from tfrfs.errors import NotFound
from tfrfs.fuse import inodes, loop, requests, turns
from tfrfs.fuse.edge import Refused
from tfrfs.fuse.inodes import ROOT, Nodes, record_ino
from tfrfs.fuse.requests import Requests, entries


@pytest.mark.parametrize("module", ["tfrfs.view.tree", "tfrfs.fuse.edge", "tfrfs.fuse.inodes", "tfrfs.fuse.loop",
                                    "tfrfs.fuse.direct", "tfrfs.fuse.turns"])
def test_only_the_adapter_loads_libfuse(module: str) -> None:
    code = (f"import sys, {module}; "
            "assert 'tfrfs.fuse.libfuse' not in sys.modules, 'libfuse was loaded'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("sig", loop.STOP_SIGNALS)
def test_a_stop_signal_is_read_from_the_wakeup_pipe(sig: int) -> None:
    """While the request loop runs, SIGTERM, SIGINT and SIGHUP neither kill the daemon nor raise
    KeyboardInterrupt: their number arrives on the pipe the loop watches. Afterwards the handlers
    are as they were."""
    before = {s: signal.getsignal(s) for s in loop.STOP_SIGNALS}
    with loop.stop_signals() as wakeup:
        assert wakeup is not None
        os.kill(os.getpid(), sig)
        assert loop.signal_name(loop.read_signal(wakeup)) == signal.Signals(sig).name
    assert {s: signal.getsignal(s) for s in loop.STOP_SIGNALS} == before
    assert signal.set_wakeup_fd(-1) == -1   # and no wakeup pipe is left set


def test_only_an_unmount_is_an_unmount() -> None:
    assert loop.End("unmounted").unmounted
    for end in (loop.End("signal", "SIGTERM"), loop.End("failed"), loop.End("exited")):
        assert not end.unmounted
    assert str(loop.End("signal", "SIGINT")) == "stopped by SIGINT"


# -- the names the kernel holds --------------------------------------------------------

def test_a_node_is_kept_while_the_kernel_holds_it() -> None:
    nodes = Nodes()
    a = nodes.looked_up(ROOT, "a", 1234)
    b = nodes.looked_up(a, "b.json", 99)
    assert nodes.looked_up(ROOT, "a", 1234) == a   # the same name: the same id, one more lookup
    assert nodes.path(b) == "/a/b.json" and nodes.child_path(b, "c") == "/a/b.json/c"
    nodes.forget(a, 1)
    assert nodes.path(a) == "/a"
    nodes.forget(a, 1)   # all of a's lookups forgotten, but b (below it) is still held
    assert nodes.path(b) == "/a/b.json"
    nodes.forget(b, 1)
    assert len(nodes) == 0
    with pytest.raises(NotFound):
        nodes.path(b)


def test_renamed_and_unlinked_nodes() -> None:
    nodes = Nodes()
    d = nodes.looked_up(ROOT, "d", 1)
    f = nodes.looked_up(d, "f", 2)
    g = nodes.looked_up(ROOT, "g", 3)
    nodes.renamed(d, "f", ROOT, "g")   # over g: g's node has no name any more
    assert nodes.path(f) == "/g"
    with pytest.raises(NotFound):
        nodes.path(g)
    nodes.unlinked(ROOT, "g")
    with pytest.raises(NotFound):
        nodes.path(f)
    for n in (f, g, d):
        nodes.forget(n, 1)
    assert len(nodes) == 0


def test_records_of_a_read_only_mount_cost_nothing() -> None:
    nodes = Nodes(record_path=lambda shard, index, binary: f"/s{shard}/{index:04d}{'.bin' if binary else ''}")
    rec, binary = record_ino(3, 41), record_ino(3, 42, True)
    assert inodes.record_of(rec) == (3, 41, False) and inodes.record_of(binary) == (3, 42, True)
    assert nodes.looked_up(ROOT, "0041", rec) == rec and len(nodes) == 0
    assert nodes.path(rec) == "/s3/0041" and nodes.path(binary) == "/s3/0042.bin"
    feature = nodes.looked_up(rec, "label.json", 77)
    assert nodes.path(feature) == "/s3/0041/label.json"
    nodes.forget(rec, 5)   # nothing to forget
    nodes.forget(feature, 1)
    assert len(nodes) == 0


def test_a_folders_names_looked_up_at_once_count_as_each_looked_up() -> None:
    nodes = Nodes(record_path=lambda shard, index, binary: f"/s{shard}/{index:04d}")
    rec = record_ino(0, 7)
    label = nodes.looked_up(rec, "label.json", 77)   # held once already
    image, again, record = nodes.looked_up_all(rec, [("image", 5), ("label.json", 77), ("0008", record_ino(0, 8))])
    assert again == label and record == record_ino(0, 8) and image not in (label, record)
    assert nodes.path(image) == "/s0/0007/image"
    encoded, = nodes.looked_up_all(image, [("encoded.jpg", 9)])
    assert nodes.path(encoded) == "/s0/0007/image/encoded.jpg"
    for n, count in ((label, 2), (image, 1)):
        nodes.forget(n, count)
    assert len(nodes) == 2   # image stays named while encoded.jpg below it is held
    nodes.forget(encoded, 1)
    assert len(nodes) == 0


def test_forget_gives_back_the_memory_of_the_names() -> None:
    """After the kernel forgets the names of a listing, the memory they took is given back (a dict
    keeps its size when entries go: the tables are made to fit again). Python's own allocations
    are counted, whatever the allocator later gives back to the system."""
    nodes = Nodes()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ids = [nodes.looked_up(ROOT, f"{k:07d}", k + 2) for k in range(60_000)]
        held = tracemalloc.get_traced_memory()[0] - before
        for nodeid in ids:
            nodes.forget(nodeid, 1)
        del ids
        after = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(nodes) == 0
    assert held > 6_000_000            # (the names do cost something while held)
    assert after < held / 10, (held, after)


# -- listings in the kernel's layout ----------------------------------------------------

class _Ops:
    """Operations of a folder of ``n`` files and one shard folder of ``n`` records."""

    def __init__(self, n: int) -> None:
        self.n = n

    def getattr(self, path: str) -> dict[str, int]:
        if path.endswith("/missing"):
            raise Refused(errno.ENOENT)
        return {"st_ino": 5, "st_mode": stat.S_IFREG | 0o444, "st_size": 3}

    def readdir(self, path: str, offset: int, plus: bool) -> Iterator[tuple[int, str, Any]]:
        base = {"st_mode": stat.S_IFDIR | 0o555, "st_nlink": 1, "st_size": 0, "st_mtime": 5 * 10**9 + 7}
        for pos in range(offset + 1, self.n + 1):
            if path == "/shard":
                yield pos, f"{pos:06d}", (base, record_ino(0, pos), 0)
            else:
                yield pos, f"file-{pos}.json", {"st_ino": 1000 + pos, "st_mode": stat.S_IFREG | 0o444,
                                                 "st_size": pos, "st_mtime": 0}


def _requests(ops: Any) -> Requests:
    return Requests(ops, writable=False, entry_timeout=86400.0, attr_timeout=86400.0, negative_timeout=60.0,
                    record_path=lambda shard, index, binary: f"/shard/{index:06d}")


def test_a_listing_goes_page_by_page_and_counts_only_what_it_sent() -> None:
    r = _requests(_Ops(100))
    folder = r.lookup(ROOT, "folder").nodeid
    seen: list[tuple[int, str, int, int]] = []
    offset = 0
    while True:
        page = r.readdir(folder, 4096, offset, None, True)
        assert len(page) <= 4096
        if not page:
            break
        got = list(entries(page, True))
        seen += got
        offset = got[-1][3]
    assert [name for _, name, _, _ in seen] == [f"file-{k}.json" for k in range(1, 101)]
    assert [ino for _, _, ino, _ in seen] == [1000 + k for k in range(1, 101)]
    assert len(r.nodes) == 101   # the folder and each name sent: one lookup each, to be forgotten
    for nodeid, _, _, _ in seen:
        r.forget(nodeid, 1)
    r.forget(folder, 1)
    assert len(r.nodes) == 0


def test_the_page_after_a_folders_last_is_answered_without_listing_it_again(monkeypatch: Any) -> None:
    """The kernel asks once more after a folder's last page; that empty page comes from the note
    the last page left, for a second. A page from anywhere else, or later, is listed as ever."""
    ops = _Ops(3)
    r = _requests(ops)
    folder = r.lookup(ROOT, "folder").nodeid
    listed: list[int] = []
    real = ops.readdir
    monkeypatch.setattr(ops, "readdir", lambda path, offset, plus: (listed.append(offset), real(path, offset, plus))[1])
    last = list(entries(r.readdir(folder, 4096, 0, None, True), True))[-1][3]
    assert last == 3 and listed == [0]
    assert r.readdir(folder, 4096, last, None, True) == b""
    assert listed == [0]
    assert list(entries(r.readdir(folder, 4096, 1, None, True), True))[0][1] == "file-2.json"
    assert listed == [0, 1]
    clock = [1000.0]
    monkeypatch.setattr(requests.time, "monotonic", lambda: clock[0])
    r.readdir(folder, 4096, 0, None, True)
    clock[0] += 1.5
    assert r.readdir(folder, 4096, last, None, True) == b""
    assert listed == [0, 1, 0, 3]   # too late for the note: asked of the folder again


def test_a_shard_folders_records_are_listed_with_their_own_numbers_and_kept_nowhere() -> None:
    r = _requests(_Ops(50))
    shard = r.lookup(ROOT, "shard").nodeid
    got = list(entries(r.readdir(shard, 1 << 16, 0, None, True), True))
    assert [nodeid for nodeid, _, _, _ in got] == [record_ino(0, k) for k in range(1, 51)]
    assert len(r.nodes) == 1   # the shard folder only
    assert r.nodes.path(got[0][0]) == "/shard/000001"


def test_a_missing_name_is_remembered_by_the_kernel_for_a_while() -> None:
    entry = _requests(_Ops(1)).lookup(ROOT, "missing")
    assert entry.nodeid == 0 and entry.entry_timeout == 60.0


def test_a_read_only_mount_refuses_opens_so_the_kernel_stops_asking() -> None:
    r = _requests(_Ops(1))
    for call in (lambda: r.open(ROOT, os.O_RDONLY), lambda: r.opendir(ROOT, 0), lambda: r.flush(ROOT, 0)):
        with pytest.raises(Refused) as e:
            call()
        assert e.value.errno == errno.ENOSYS


@pytest.mark.parametrize("full", [requests.FULL_ENTRIES, 517])
@pytest.mark.parametrize("width", [6, 11])
@pytest.mark.parametrize("plus", [True, False])
def test_a_run_of_records_packs_as_its_records_one_by_one(plus: bool, width: int, full: int, monkeypatch: Any) -> None:
    """A shard folder's records handed over in bulk (``RecordRun``) fill pages with the same bytes
    as the same records given one at a time, page after page; past the folder's first
    ``FULL_ENTRIES``, records are listed by name alone (node id 0), mid-page too."""
    monkeypatch.setattr(requests, "FULL_ENTRIES", full)
    base = {"st_mode": stat.S_IFDIR | 0o555, "st_nlink": 1, "st_size": 0, "st_uid": 7, "st_gid": 8,
            "st_blksize": 131072, "st_mtime": 5 * 10**9 + 7}

    class Bulk(_Ops):
        def readdir(self, path: str, offset: int, plus: bool) -> Iterator[Any]:
            yield inodes.RecordRun(2, max(0, offset - 2), 1000, width, base)

    class OneByOne(_Ops):
        def readdir(self, path: str, offset: int, plus: bool) -> Iterator[Any]:
            for i in range(max(0, offset - 2), 1000):
                yield i + 3, f"{i:0{width}d}", (base, record_ino(2, i), 0)

    pages = []
    for ops in (Bulk(0), OneByOne(0)):
        r = _requests(ops)
        got, offset = [], 0
        while True:
            page = r.readdir(ROOT, 4096, offset, None, plus)
            if not page:
                break
            got.append(page)
            offset = list(entries(page, plus))[-1][3]
        pages.append(got)
        assert len(r.nodes) == 0
    assert pages[0] == pages[1] and len(pages[0]) >= 8   # (several pages)
    listed = [e for page in pages[0] for e in entries(page, plus)]
    assert [name for _, name, _, _ in listed] == [f"{i:0{width}d}" for i in range(1000)]
    assert [ino for _, _, ino, _ in listed] == [record_ino(2, i) for i in range(1000)]
    if plus:
        assert [nodeid for nodeid, _, _, _ in listed] == [record_ino(2, i) if i < full else 0 for i in range(1000)]


def test_a_helper_takes_a_turn_only_while_the_reader_is_held_up() -> None:
    """While the reader answers a request quickly, or no request waits, a helper leaves the
    device alone; once the reader has spent longer than HELP_AFTER_S on one and another waits,
    the helper takes it."""
    t = turns.Turns(poll_us=0)
    waiting = [False]

    def pending(timeout_ms: int) -> bool:
        return waiting[0]

    t.begin()
    waiting[0] = True
    assert not t.helper_turn(pending)   # the reader began just now
    time.sleep(turns.HELP_AFTER_S * 2)
    assert t.helper_turn(pending)
    waiting[0] = False
    assert not t.helper_turn(pending)   # nothing waits
    t.done()
    waiting[0] = True
    assert not t.helper_turn(pending)   # the reader is free: it takes the request
