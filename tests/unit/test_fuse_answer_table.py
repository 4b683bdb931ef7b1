"""The compiled table (``tfrfs/fuse/_answer.c``) without a mount: requests laid out by hand as
linux/fuse.h has them, answers read back from a pipe standing in for the device and taken apart
as the kernel does. Where the extension was not built these tests skip, unless
TFRFS_REQUIRE_COMPILED is set (scripts/test sets it: there, the compiled path must be tested)."""

from __future__ import annotations

import errno
import importlib
import os
import posixpath
import stat
import struct
import time
from typing import Any, Iterator

import pytest

from tfrfs.fuse.edge import Refused
from tfrfs.fuse.inodes import path_ino
from tfrfs.fuse.requests import entries
from test_fuse_direct import ATTRS, answers, attr_fields, read_in, request

try:
    _answer: Any = importlib.import_module("tfrfs.fuse._answer")
except ImportError:
    if os.environ.get("TFRFS_REQUIRE_COMPILED"):
        raise
    pytest.skip("tfrfs.fuse._answer was not built (no compiler here): the Python path answers", allow_module_level=True)

LOOKUP, GETATTR, READ, OPEN, READDIRPLUS = 1, 3, 15, 14, 44
FUSE_ATTR = struct.Struct("<QQQQQQIIIIIIIIII")
VALID = (86400, 5, 3600, 7)   # entry valid s, ns, attr valid s, ns


def packed(a: dict[str, int]) -> bytes:
    return FUSE_ATTR.pack(*attr_fields(a))


@pytest.fixture()
def device() -> Iterator[tuple[int, int]]:
    r, w = os.pipe2(os.O_NONBLOCK)
    os.set_blocking(w, True)
    yield r, w
    os.close(r)
    os.close(w)


def table(w: int, capacity: int = 64) -> Any:
    return _answer.Table(w, capacity)


def test_a_lookup_answers_fuse_entry_out_and_is_counted(device: tuple[int, int]) -> None:
    r, w = device
    t = table(w)
    assert t.add(9, b"encoded.jpg", 77, packed(ATTRS), *VALID, b"jpeg", -1, 0, 0)
    assert t.answer(request(LOOKUP, 9, b"encoded.jpg\0", unique=5))
    [(error, unique, body)] = answers(r)
    assert (error, unique) == (0, 5)
    nodeid, generation, ev, av, evn, avn, *attr = struct.unpack("<QQQQII" + "QQQQQQIIIIIIIIII", body)
    assert (nodeid, generation, ev, evn, av, avn) == (77, 0, 86400, 5, 3600, 7)
    assert tuple(attr) == attr_fields(ATTRS)
    assert t.answer(request(LOOKUP, 9, b"encoded.jpg\0"))
    answers(r)
    # a FORGET takes the lookups the table answered, and no more
    assert t.forget(77, 3) == 2
    assert t.forget(77, 1) == 0


def test_getattr_answers_fuse_attr_out(device: tuple[int, int]) -> None:
    r, w = device
    t = table(w)
    t.add(9, b"label.json", 78, packed(ATTRS), *VALID, b"[3]", -1, 0, 0)
    assert t.answer(request(GETATTR, 78, struct.pack("<IIQ", 0, 0, 0), unique=6))
    [(error, unique, body)] = answers(r)
    valid, valid_ns, _, *attr = struct.unpack("<QII" + "QQQQQQIIIIIIIIII", body)
    assert (error, unique, valid, valid_ns) == (0, 6, 3600, 7)
    assert tuple(attr) == attr_fields(ATTRS)


def test_reads_from_memory_and_from_a_file_within_their_length(device: tuple[int, int], tmp_path: Any) -> None:
    r, w = device
    t = table(w)
    t.add(9, b"text.txt", 80, packed(ATTRS), *VALID, b"hello world", -1, 0, 0)
    shard = tmp_path / "shard"
    shard.write_bytes(b"HEADER" + b"0123456789" + b"FOOTER")
    fd = os.open(shard, os.O_RDONLY)
    t.add(9, b"image.jpg", 81, packed(ATTRS), *VALID, None, fd, 6, 10)
    os.close(fd)   # the table keeps its own descriptor
    got = []
    for nodeid, offset, size in [(80, 0, 4096), (80, 6, 3), (80, 11, 10), (80, 99, 10),
                                 (81, 0, 4096), (81, 8, 100), (81, 2, 3), (81, 10, 5)]:
        assert t.answer(request(READ, nodeid, read_in(0, offset, size)))
        [(error, _, body)] = answers(r)
        assert error == 0
        got.append(body)
    assert got == [b"hello world", b"wor", b"", b"", b"0123456789", b"89", b"234", b""]


def test_what_the_table_does_not_hold_is_left_to_python(device: tuple[int, int]) -> None:
    r, w = device
    t = table(w)
    t.add(9, b"image", 90, packed(dict(ATTRS, st_mode=0o40555)), *VALID, None, -1, 0, 0)   # a folder
    assert not t.answer(request(LOOKUP, 9, b"other\0"))
    assert not t.answer(request(LOOKUP, 10, b"image\0"))        # another folder's
    assert not t.answer(request(GETATTR, 91, struct.pack("<IIQ", 0, 0, 0)))
    assert not t.answer(request(READ, 90, read_in(0, 0, 10)))   # a folder has no bytes
    assert not t.answer(request(OPEN, 90, struct.pack("<II", os.O_RDONLY, 0)))
    assert not t.answer(b"short")
    assert answers(r) == []


def test_the_oldest_entries_leave_a_full_table_with_their_lookups(device: tuple[int, int], tmp_path: Any) -> None:
    r, w = device
    t = table(w, capacity=2)
    shard = tmp_path / "shard"
    shard.write_bytes(b"x" * 100)
    fd = os.open(shard, os.O_RDONLY)
    assert t.add(1, b"a", 11, packed(ATTRS), *VALID, None, fd, 0, 10)
    assert t.add(1, b"b", 12, packed(ATTRS), *VALID, None, fd, 10, 10)
    assert t.files() == 1   # one descriptor for the file, whatever the entries
    assert not t.add(1, b"a", 13, packed(ATTRS), *VALID, b"", -1, 0, 0)   # the name is there
    assert not t.add(1, b"c", 12, packed(ATTRS), *VALID, b"", -1, 0, 0)   # the node is there
    t.answer(request(LOOKUP, 1, b"a\0"))
    t.answer(request(LOOKUP, 1, b"a\0"))
    assert t.evicted() == []
    assert t.add(1, b"c", 13, packed(ATTRS), *VALID, b"c", -1, 0, 0)
    assert t.evicted() == [(11, 2)] and len(t) == 2 and t.files() == 1
    assert not t.answer(request(LOOKUP, 1, b"a\0"))
    assert t.add(1, b"d", 14, packed(ATTRS), *VALID, b"d", -1, 0, 0)
    assert t.evicted() == [(12, 0)] and t.files() == 0
    os.close(fd)
    t.clear()
    assert sorted(t.evicted()) == [(13, 0), (14, 0)] and len(t) == 0
    answers(r)


def test_a_failed_write_to_the_device_is_not_the_readers(device: tuple[int, int]) -> None:
    """The kernel refuses the answer to an interrupted request (ENOENT): nothing to raise."""
    r, w = device
    t = table(w)
    t.add(9, b"x", 70, packed(ATTRS), *VALID, b"x", -1, 0, 0)
    os.close(r)
    try:
        assert t.answer(request(GETATTR, 70, struct.pack("<IIQ", 0, 0, 0)))   # EPIPE, ignored
    finally:
        os.dup2(w, r)   # (for the fixture's close)


def test_the_capacity_is_checked() -> None:
    with pytest.raises(ValueError):
        _answer.Table(3, 0)
    with pytest.raises(ValueError):
        _answer.Table(3, 8).add(1, b"a", 2, b"short", *VALID, None, -1, 0, 0)
    with pytest.raises(OSError) as e:
        _answer.Table(3, 8).add(1, b"a", 2, packed(ATTRS), *VALID, None, 10**6, 0, 0)
    assert e.value.errno == errno.EBADF


# -- a record put in the table (tfrfs.fuse.answers) -------------------------------------

class _Record:
    """Operations of ``count`` record folders, /shard/00000N (N from 1): label.json and image/encoded.jpg."""

    FILES = {"label.json": b"[7]", "image/encoded.jpg": b"\xff\xd8jpeg"}
    OWNED = {"st_mtime": 1_700_000_000_123_456_789, "st_atime": 1_700_000_000_123_456_789,
             "st_ctime": 1_700_000_000_123_456_789, "st_uid": 1000, "st_gid": 100, "st_blksize": 131072}
    FOLDERS = {"": ["image", "label.json"], "image": ["encoded.jpg"]}

    def __init__(self, count: int = 2) -> None:
        self.reads = 0
        self.fail = False
        self.count = count

    def _inner(self, path: str) -> str | None:
        for record in (f"/shard/{n:06d}" for n in range(1, self.count + 1)):
            if path == record:
                return ""
            if path.startswith(record + "/"):
                return path[len(record) + 1:]
        return None

    def _attrs(self, path: str) -> dict[str, int]:
        inner = self._inner(path)
        if inner in self.FILES:
            size = len(self.FILES[inner])
            return {"st_ino": hash(path) & 0xFFFF, "st_mode": 0o100444, "st_size": size, "st_nlink": 1,
                    "st_blocks": (size + 511) // 512, **self.OWNED}
        if inner in self.FOLDERS:
            return {"st_ino": hash(path) & 0xFFFF, "st_mode": 0o40555, "st_size": 0, "st_nlink": 2, "st_blocks": 0,
                    **self.OWNED}
        raise Refused(errno.ENOENT)

    def getattr(self, path: str) -> dict[str, int]:
        return self._attrs(path)

    def readdir(self, path: str, offset: int, plus: bool) -> Iterator[tuple[int, str, Any]]:
        names = self.FOLDERS[self._inner(path) or ""]
        yield 1, ".", {"st_ino": path_ino(path), "st_mode": stat.S_IFDIR}
        yield 2, "..", {"st_ino": path_ino(posixpath.dirname(path)), "st_mode": stat.S_IFDIR}
        for k, name in enumerate(names, 3):
            yield k, name, self._attrs(path + "/" + name)

    def record_folders(self, path: str, held: int = 0) -> Iterator[tuple[str, list[tuple[Any, ...]]]]:
        todo = [path]
        while todo:
            at = todo.pop()
            listed = []
            for k, name in enumerate(self.FOLDERS[self._inner(at) or ""], 3):
                inner = at + "/" + name
                node = _Node(inner, self._inner(inner) in self.FOLDERS)
                a = self._attrs(inner)
                where, data = None, None
                if not node.folder and a["st_size"] <= held:
                    where, data = self.read_node(node, a["st_size"], 0)
                listed.append((k, name, a["st_ino"], a["st_mode"], a["st_size"], a["st_blocks"], a["st_mtime"],
                               a["st_nlink"], node, where, data))
                if node.folder:
                    todo.append(inner)
            yield at, listed

    owned = (OWNED["st_uid"], OWNED["st_gid"], OWNED["st_blksize"])

    def records_in(self, shard: int) -> int:
        return self.count

    def read_node(self, node: "_Node", size: int, offset: int) -> tuple[Any, bytes]:
        self.reads += 1
        if self.fail and node.path.endswith("label.json"):
            raise Refused(errno.EIO)   # (as a damaged record's value does)
        return None, self.FILES[self._inner(node.path) or ""][offset:offset + size]


class _Node:
    def __init__(self, path: str, folder: bool) -> None:
        self.path, self.folder = path, folder


def _mounted(w: int, capacity: int = 64, count: int = 2) -> tuple[Any, Any, Any]:
    from tfrfs.fuse import answers, direct
    from tfrfs.fuse.inodes import record_ino
    from tfrfs.fuse.requests import Requests
    r = Requests(_Record(count), writable=False, entry_timeout=86400.0, attr_timeout=86400.0, negative_timeout=60.0,
                 record_path=lambda shard, index, binary: f"/shard/{index + 1:06d}")
    sheets = answers.Sheets(r, _answer.Table(w, capacity))
    return r, direct.Answerer(r, w, sheets), record_ino(0, 0)


def _entry_id(body: bytes) -> int:
    return int(struct.unpack_from("<Q", body)[0])


def test_a_record_looked_into_is_answered_by_the_table_and_its_lookups_given_back(device: tuple[int, int]) -> None:
    r, w = device
    requests, answerer, record = _mounted(w)
    assert answerer.answer(request(LOOKUP, record, b"image\0"))   # Python puts the record in the table
    [(error, _, body)] = answers(r)
    image = _entry_id(body)
    assert error == 0 and image == requests.nodes.id_of(record, "image")
    table = answerer.table
    assert len(table) == 4 and requests.ops.reads == 2   # 3 entries, and the record's listing
    # the rest of the record is the table's, in C
    assert table.answer(request(LOOKUP, image, b"encoded.jpg\0"))
    jpg = _entry_id(answers(r)[0][2])
    assert table.answer(request(READ, jpg, read_in(0, 0, 4096)))
    assert answers(r) == [(0, 42, b"\xff\xd8jpeg")]
    assert table.answer(request(LOOKUP, record, b"label.json\0"))
    label = _entry_id(answers(r)[0][2])
    for nodeid in (image, jpg, label):   # attributes packed in C as Python packs them
        assert table.answer(request(GETATTR, nodeid, struct.pack("<IIQ", 0, 0, 0)))
        [(error, _, body)] = answers(r)
        assert error == 0 and body[16:] == packed(requests.getattr(nodeid)[0])
    assert not table.answer(request(LOOKUP, record, b"missing\0"))   # Python's to answer
    assert answerer.answer(request(LOOKUP, record, b"missing\0"))
    assert _entry_id(answers(r)[0][2]) == 0
    # Listings: the page Python would have sent (each entry one lookup more), then the end.
    assert table.answer(request(READDIRPLUS, record, read_in(0, 0, 4096), unique=8))
    [(error, unique, page)] = answers(r)
    listed = [(nodeid, name) for nodeid, name, _, _ in entries(page, True)]
    assert (error, unique, listed) == (0, 8, [(0, "."), (0, ".."), (image, "image"), (label, "label.json")])
    assert page == requests.readdir(record, 4096, 0, None, True)   # (Python's own count of these:)
    requests.nodes.forget(image, 1)
    requests.nodes.forget(label, 1)
    assert table.answer(request(READDIRPLUS, record, read_in(0, 4, 4096), unique=9))
    assert answers(r) == [(0, 9, b"")]
    assert not table.answer(request(READDIRPLUS, record, read_in(0, 2, 4096)))   # part way: Python's
    # The kernel forgets what it was given: the table takes its own lookups, and keeps the names
    # (held once each) until its entries go; then nothing is left. A large BATCH_FORGET (after
    # drop_caches) comes through libfuse's callback, straight to the handler: the same.
    forgets = struct.pack("<II", 2, 0) + struct.pack("<QQQQ", image, 2, jpg, 1)
    assert answerer.answer(request(42, 0, forgets))   # BATCH_FORGET: taken, not answered
    requests.forget_many([(label, 2)])
    assert answers(r) == [] and len(requests.nodes) == 3
    answerer.sheets.clear()
    assert len(requests.nodes) == 0


def test_an_entry_that_leaves_the_table_hands_its_lookups_to_python(device: tuple[int, int]) -> None:
    r, w = device
    requests, answerer, first = _mounted(w, capacity=4)   # one record's 3 entries and listing
    answerer.answer(request(LOOKUP, first, b"label.json\0"))
    label = _entry_id(answers(r)[0][2])
    assert len(answerer.table) == 4 and len(requests.nodes) == 3
    # the second record pushes the first out of the table: the kernel's lookup of the first's
    # label.json, answered by the table, is now Python's to forget
    answerer.answer(request(LOOKUP, first + 1, b"label.json\0"))
    answers(r)
    assert not answerer.table.answer(request(LOOKUP, first, b"label.json\0"))
    assert len(requests.nodes) == 4   # the first's label.json, and the second's three
    answerer.answer(request(2, label, struct.pack("<Q", 1)))        # FORGET label.json, 1: Python's
    assert len(requests.nodes) == 3
    answerer.sheets.clear()
    assert len(requests.nodes) == 1   # the second's label.json: the kernel still holds it


def test_a_record_that_cannot_be_put_in_the_table_is_answered_by_python(device: tuple[int, int]) -> None:
    """A file that cannot be read part way through the record: nothing of it goes in the table,
    the lookups counted so far go back, and Python answers as without the table."""
    r, w = device
    requests, answerer, record = _mounted(w)
    requests.ops.fail = True
    assert answerer.answer(request(LOOKUP, record, b"image\0"))
    [(error, _, body)] = answers(r)
    image = _entry_id(body)
    assert error == 0 and image == requests.nodes.id_of(record, "image")
    assert len(answerer.table) == 0 and len(requests.nodes) == 1   # the kernel's lookup of image, no more
    requests.forget(image, 1)
    assert len(requests.nodes) == 0


def _row(position: int, name: bytes, nodeid: int, data: bytes | None = b"[1]") -> tuple[Any, ...]:
    mode = (stat.S_IFREG | 0o444) if data is not None else (stat.S_IFDIR | 0o555)
    size = len(data or b"")
    return (position, name, nodeid, nodeid + 1000, mode, size, (size + 511) // 512, 1_700_000_000_5, 1, 0, 0, 131072,
            data, -1, 0, 0)


def test_a_folder_added_at_once_gives_back_what_it_could_not_add(device: tuple[int, int]) -> None:
    r, w = device
    t = table(w)
    t.add(9, b"b.json", 22, packed(ATTRS), *VALID, b"[3]", -1, 0, 0)   # there already (another thread put it)
    with pytest.raises(TypeError):   # a bad row: nothing of the folder goes in
        t.add_folder(9, 9, 1, [_row(3, b"a.json", 20), ("bad",)], VALID)
    assert len(t) == 1
    assert t.add_folder(9, 9, 1, [_row(3, b"a.json", 20), _row(4, b"b.json", 22)], VALID) == [22]
    assert t.answer(request(READ, 20, read_in(0, 0, 4096)))
    assert answers(r)[0][2] == b"[1]"
    assert t.answer(request(READDIRPLUS, 9, read_in(0, 0, 4096)))   # the listing names both
    [(_, _, page)] = answers(r)
    assert [name for _, name, _, _ in entries(page, True)] == [".", "..", "a.json", "b.json"]
    # a folder of more than 64 entries: its entries go in, its listing is Python's
    many = [_row(3 + k, b"%d.json" % k, 100 + k) for k in range(65)]
    assert t.add_folder(50, 50, 1, many, VALID) == []
    assert t.answer(request(LOOKUP, 50, b"64.json\0"))
    answers(r)
    assert not t.answer(request(READDIRPLUS, 50, read_in(0, 0, 4096)))


def _in_table(table: Any, record: int, timeout: float = 10.0) -> bool:
    """Whether record folder ``record``'s label.json comes to be answered by the table."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if table.answer(request(LOOKUP, record, b"label.json\0")):
            return True
        time.sleep(0.01)
    return False


def test_records_after_two_in_order_are_put_in_the_table_ahead_of_the_reader(device: tuple[int, int]) -> None:
    from tfrfs.fuse.answers import AHEAD
    r, w = device
    requests, answerer, first = _mounted(w, capacity=1024, count=40)
    answerer.answer(request(LOOKUP, first + 5, b"label.json\0"))   # one record alone: nothing more
    answers(r)
    time.sleep(0.2)
    assert not answerer.table.answer(request(LOOKUP, first + 6, b"label.json\0"))
    answerer.answer(request(LOOKUP, first + 6, b"label.json\0"))   # the next, after it: in order
    answers(r)
    last = min(6 + AHEAD, 39)
    assert _in_table(answerer.table, first + last)   # put there by the thread looking ahead
    reads = requests.ops.reads
    for k in range(7, last + 1):   # answered in C: no read through Python
        assert answerer.table.answer(request(READ, requests.nodes.id_of(first + k, "label.json"), read_in(0, 0, 4096)))
    assert requests.ops.reads == reads
    assert not answerer.table.answer(request(LOOKUP, first + last + 1, b"label.json\0")) or last + 1 >= 40
    answers(r)
    # a record's folder looked up by name, the one before it in the table: from it on
    answerer.sheets.found(first + last + 1, 5)
    assert _in_table(answerer.table, first + min(last + AHEAD, 39))


def test_a_record_whose_neighbour_went_in_the_table_long_ago_sets_off_no_look_ahead(
        device: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """A shuffled reader (a training loop's sampler) comes to records whose neighbour it read long
    before: that is no reader in order, and nothing is read ahead of it."""
    from tfrfs.fuse import answers as answers_module
    monkeypatch.setattr(answers_module, "RECENT", 2)
    r, w = device
    requests, answerer, first = _mounted(w, capacity=1024, count=40)
    for k in (5, 20, 30, 6):   # 6 after 5, but two other records went in between
        answerer.answer(request(LOOKUP, first + k, b"label.json\0"))
        answers(r)
    time.sleep(0.2)
    assert not answerer.table.answer(request(LOOKUP, first + 7, b"label.json\0"))
    answerer.answer(request(LOOKUP, first + 7, b"label.json\0"))   # 7 right after 6: in order
    answers(r)
    assert _in_table(answerer.table, first + 8)
