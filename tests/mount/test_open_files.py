"""Files behave like files while open (SPEC 7): a Hypothesis state machine that does what xfstests'
``fsx`` does, on a feature file and on a scratch file of a ``--rw`` mount, against a bytearray.

A feature file's content is checked and staged when it is closed or fsynced, but while it is open
it is a file: every descriptor reads what any of them wrote (also through ``mmap``), and ``fstat``
and ``stat`` give its size. The rules write, extend, truncate (``ftruncate`` and by path), read,
map the file to read and to write (``msync``), ``fsync``, close and reopen (up to three descriptors
at once, read-write or read-only), and ``copy_file_range`` between the two files and within one.
After every step each file's size (by ``fstat`` on every open descriptor, and by path) and content
must be the model's. A commit (every descriptor closed, then ``tfrfs commit``) must leave the model's
bytes in the shard as the feature's value; both files are then made again.

The model is a bytearray per file and imports no tfrfs code; the shard is built and read back with
the TFRecord framing and message definitions (``tfrfs.format.tfrecord``, ``tfrfs.format.proto``), as the other
mount tests do.
"""

from __future__ import annotations

import mmap
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tfrfs.format import proto
from tfrfs.format import tfrecord

from conftest import force_unmount, is_mounted, run_tfrfs
from support.machines import machine_settings
from support import example_pb, reference

pytestmark = [pytest.mark.mount,
              pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse")]

SHARD = "d.tfrecord"
FEATURE = f"{SHARD}/000000/x.bin"          # any bytes are a valid value of a .bin
SCRATCH = f"{SHARD}/000000/.work/f0"       # a file in the user's own (scratch) folder
FILES = (FEATURE, SCRATCH)
MAX_FDS = 3
SPAN = 96 << 10                              # offsets and lengths stay below this

# Values that the SPEC would show as .txt (text) as well as binary ones: x.bin still finds them.
DATA = st.one_of(st.binary(min_size=1, max_size=6000),
                 st.text(alphabet="abc xyz\n", min_size=1, max_size=300).map(str.encode),
                 st.integers(1, 70000).map(lambda n: bytes((i * 7 + n) % 256 for i in range(n))))


def write_source(src: Path) -> None:
    ex = proto.Example()
    ex.features.feature["n"].int64_list.value.append(1)
    with open(src / SHARD, "wb") as f:
        w = tfrecord.StreamWriter(f)
        w.write(ex.SerializeToString())
        w.close()


def committed(src: Path) -> Any:
    """The committed record, read by the test suite's own reader and message classes."""
    (record,) = reference.written_records(src / SHARD)
    return example_pb.Example.FromString(record)


def _put(buf: bytearray, offset: int, data: bytes) -> None:
    if offset > len(buf):
        buf.extend(bytes(offset - len(buf)))
    buf[offset:offset + len(data)] = data


def _resize(buf: bytearray, length: int) -> None:
    if length < len(buf):
        del buf[length:]
    else:
        buf.extend(bytes(length - len(buf)))


class OpenFiles(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="tfrfs-open-"))
        self.src = self.tmp / "src"
        self.mnt = self.tmp / "mnt"
        self.log = self.tmp / "daemon.log"
        self.model: dict[str, bytearray] = {f: bytearray() for f in FILES}
        self.fds: dict[str, list[tuple[int, bool]]] = {f: [] for f in FILES}   # (fd, writable)

    # -- set-up and tear-down ---------------------------------------------------------------------

    @initialize()
    def mount(self) -> None:
        self.src.mkdir()
        self.mnt.mkdir()
        write_source(self.src)
        proc = run_tfrfs("mount", str(self.src), str(self.mnt), "--rw", "--cache-dir", str(self.tmp / "cache"),
                         "--log", str(self.log))
        assert proc.returncode == 0, proc.stderr
        self._make_files()

    def _make_files(self) -> None:
        os.mkdir(self.mnt / SHARD / "000000" / ".work")
        for f in FILES:   # made by open(O_CREAT) and kept open, as fsx does
            self.fds[f].append((os.open(self.mnt / f, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644), True))
            self.model[f].clear()

    def teardown(self) -> None:
        try:
            # The final commit, after a run that passed (Hypothesis calls teardown from a finally
            # block: an exception on its way out is the run's failure, or its early end).
            if sys.exc_info()[1] is None and is_mounted(self.mnt):
                self._commit_and_check()
        finally:
            self._unmount()

    def _unmount(self) -> None:
        try:
            for fds in self.fds.values():
                for fd, _ in fds:
                    os.close(fd)
            if is_mounted(self.mnt):
                run_tfrfs("umount", str(self.mnt))
        finally:
            force_unmount(self.mnt)
            log = self.log.read_text(errors="replace") if self.log.exists() else ""
            shutil.rmtree(self.tmp, ignore_errors=True)
        assert "Traceback" not in log, log[-4000:]

    # -- helpers ---------------------------------------------------------------------------------

    def _fd(self, data: st.DataObject, f: str, *, writable: bool = False) -> int:
        choices = [fd for fd, w in self.fds[f] if w or not writable]
        return data.draw(st.sampled_from(choices), label="descriptor")

    def _open_file(self, data: st.DataObject, *, writable: bool = False) -> str:
        files = [f for f in FILES if any(w or not writable for _, w in self.fds[f])]
        return data.draw(st.sampled_from(files), label="file")

    def _has_fd(self, writable: bool = False) -> bool:
        return any(w or not writable for fds in self.fds.values() for _, w in fds)

    # -- rules -----------------------------------------------------------------------------------

    @rule(data=st.data(), f=st.sampled_from(FILES), writable=st.booleans(), trunc=st.booleans())
    def open_again(self, data: st.DataObject, f: str, writable: bool, trunc: bool) -> None:
        if len(self.fds[f]) >= MAX_FDS:
            return
        flags = os.O_RDWR | (os.O_TRUNC if trunc else 0) if writable else os.O_RDONLY
        self.fds[f].append((os.open(self.mnt / f, flags), writable))
        event(f"{len(self.fds[f])} descriptors of one file open at once")
        if writable and trunc:
            self.model[f].clear()

    @precondition(lambda self: self._has_fd())
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        f = self._open_file(data)
        fd = self._fd(data, f)
        os.close(fd)
        self.fds[f] = [(d, w) for d, w in self.fds[f] if d != fd]

    @precondition(lambda self: self._has_fd(writable=True))
    @rule(data=st.data(), content=DATA)
    def write(self, data: st.DataObject, content: bytes) -> None:
        f = self._open_file(data, writable=True)
        offset = data.draw(st.integers(0, min(len(self.model[f]) + 5000, SPAN)), label="offset")
        assert os.pwrite(self._fd(data, f, writable=True), content, offset) == len(content)
        _put(self.model[f], offset, content)

    @precondition(lambda self: self._has_fd(writable=True))
    @rule(data=st.data(), length=st.integers(0, SPAN))
    def ftruncate(self, data: st.DataObject, length: int) -> None:
        f = self._open_file(data, writable=True)
        os.ftruncate(self._fd(data, f, writable=True), length)
        _resize(self.model[f], length)

    @rule(f=st.sampled_from(FILES), length=st.integers(0, SPAN))
    def truncate_by_path(self, f: str, length: int) -> None:
        os.truncate(self.mnt / f, length)
        _resize(self.model[f], length)

    @precondition(lambda self: self._has_fd())
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        f = self._open_file(data)
        offset = data.draw(st.integers(0, len(self.model[f]) + 100), label="offset")
        size = data.draw(st.integers(0, SPAN), label="size")
        assert os.pread(self._fd(data, f), size, offset) == bytes(self.model[f][offset:offset + size])

    @precondition(lambda self: self._has_fd())
    @rule(data=st.data())
    def mapped_read(self, data: st.DataObject) -> None:
        f = self._open_file(data)
        size = len(self.model[f])
        if not size:
            return
        offset = data.draw(st.integers(0, size - 1), label="offset")
        length = data.draw(st.integers(1, size - offset), label="length")
        with mmap.mmap(self._fd(data, f), size, access=mmap.ACCESS_READ) as m:
            assert m[offset:offset + length] == bytes(self.model[f][offset:offset + length])

    @precondition(lambda self: self._has_fd(writable=True))
    @rule(data=st.data(), content=DATA)
    def mapped_write(self, data: st.DataObject, content: bytes) -> None:
        """As fsx does it: extend the file first if the write goes past its end, map, copy, msync."""
        f = self._open_file(data, writable=True)
        fd = self._fd(data, f, writable=True)
        offset = data.draw(st.integers(0, min(len(self.model[f]) + 5000, SPAN)), label="offset")
        end = offset + len(content)
        if end > len(self.model[f]):
            os.ftruncate(fd, end)
            _resize(self.model[f], end)
        with mmap.mmap(fd, len(self.model[f]), access=mmap.ACCESS_WRITE) as m:
            m[offset:end] = content
            m.flush()
        event("mapped write")
        _put(self.model[f], offset, content)

    @precondition(lambda self: self._has_fd())
    @rule(data=st.data())
    def fsync(self, data: st.DataObject) -> None:
        f = self._open_file(data)
        os.fsync(self._fd(data, f))

    @precondition(lambda self: self._has_fd(writable=True))
    @rule(data=st.data())
    def copy_file_range(self, data: st.DataObject) -> None:
        """From one file (the other one, or itself) into a file open for writing; the copy must
        not overlap itself (copy_file_range's own rule)."""
        dst = self._open_file(data, writable=True)
        src = data.draw(st.sampled_from([f for f in FILES if self.fds[f]]), label="from")
        if not self.model[src]:
            return
        src_off = data.draw(st.integers(0, len(self.model[src]) - 1), label="from offset")
        count = data.draw(st.integers(1, len(self.model[src]) - src_off), label="count")
        dst_off = data.draw(st.integers(0, min(len(self.model[dst]) + 5000, SPAN)), label="to offset")
        if src == dst and src_off < dst_off + count and dst_off < src_off + count:
            return
        in_fd, out_fd = self._fd(data, src), self._fd(data, dst, writable=True)
        copied = 0
        while copied < count:
            n = os.copy_file_range(in_fd, out_fd, count - copied, src_off + copied, dst_off + copied)
            assert n > 0, "copy_file_range copied nothing before the end of the file"
            copied += n
        event("copy_file_range within one file" if src == dst else "copy_file_range between the files")
        _put(self.model[dst], dst_off, bytes(self.model[src][src_off:src_off + count]))

    @precondition(lambda self: self._has_fd())
    @rule(data=st.data())
    def copy_out(self, data: st.DataObject) -> None:
        """copy_file_range from a file of the mount to another one (a scratch file beside it)."""
        f = self._open_file(data)
        size = len(self.model[f])
        if not size:
            return
        out = self.mnt / SHARD / "000000" / ".work" / "out"
        fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            offset = data.draw(st.integers(0, size - 1), label="offset")
            copied = 0
            while copied < size - offset:
                n = os.copy_file_range(self._fd(data, f), fd, size - offset - copied, offset + copied, copied)
                assert n > 0, "copy_file_range copied nothing before the end of the file"
                copied += n
            assert os.pread(fd, size + 1, 0) == bytes(self.model[f][offset:])
        finally:
            os.close(fd)
            os.unlink(out)

    @rule()
    def close_all_and_commit(self) -> None:
        """Commit in the middle of a run (every descriptor closed first); both files are then made
        again, empty. Every run also ends with a commit (``teardown``)."""
        self._commit_and_check()
        # After a commit only the rules' name finds the value (x.txt for text); start again.
        rec = self.mnt / SHARD / "000000"
        for name in os.listdir(rec):
            if name.startswith("x."):
                os.unlink(rec / name)
        shutil.rmtree(rec / ".work", ignore_errors=True)
        self._make_files()

    def _commit_and_check(self) -> None:
        """Close every descriptor, ``tfrfs commit``: the shard holds the feature file's bytes, and
        the scratch file never became a feature."""
        for f in FILES:
            for fd, _ in self.fds[f]:
                os.close(fd)
            self.fds[f] = []
        assert (self.mnt / FEATURE).read_bytes() == bytes(self.model[FEATURE])
        run_tfrfs("commit", str(self.mnt), check=True)
        event(f"committed a value of {len(self.model[FEATURE]) // 10000 * 10000}+ bytes")
        ex = committed(self.src)
        assert sorted(ex.features.feature) == ["n", "x"]
        assert list(ex.features.feature["x"].bytes_list.value) == [bytes(self.model[FEATURE])]
        assert list(ex.features.feature["n"].int64_list.value) == [1]

    # -- what must hold after every step ----------------------------------------------------------

    @invariant()
    def sizes_and_content(self) -> None:
        for f in FILES:
            want = bytes(self.model[f])
            assert os.stat(self.mnt / f).st_size == len(want), f"{f}: stat by path"
            for fd, _ in self.fds[f]:
                assert os.fstat(fd).st_size == len(want), f"{f}: fstat"
            if self.fds[f]:
                got = os.pread(self.fds[f][0][0], len(want) + 1, 0)
            else:
                got = (self.mnt / f).read_bytes()
            assert got == want, f"{f}: content ({len(got)} bytes, model {len(want)})"


OpenFiles.TestCase.settings = machine_settings("TFRFS_OPEN", examples=10, steps=50)

TestOpenFiles = OpenFiles.TestCase


# --- the smallest cases, each as the issue saw it ---------------------------------------------------

def _record(tmp_path: Path, tfrfs_mount: Any) -> tuple[Path, Path]:
    src = tmp_path / "src"
    src.mkdir()
    write_source(src)
    mnt = tfrfs_mount(src, "--rw")
    return src, mnt / SHARD / "000000"


def test_size_and_content_after_fsync(tmp_path: Path, tfrfs_mount: Any) -> None:
    """fsync stages the file, which stays open as it was: a write after it extends the file."""
    src, rec = _record(tmp_path, tfrfs_mount)
    fd = os.open(rec / "x.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"0123456789")
        os.fsync(fd)
        os.pwrite(fd, b"abcdefghij", 10)
        assert os.fstat(fd).st_size == 20
        assert os.stat(rec / "x.bin").st_size == 20
        assert os.pread(fd, 100, 0) == b"0123456789abcdefghij"
    finally:
        os.close(fd)
    assert (rec / "x.bin").read_bytes() == b"0123456789abcdefghij"


def test_a_second_descriptor_sees_what_the_first_wrote(tmp_path: Path, tfrfs_mount: Any) -> None:
    src, rec = _record(tmp_path, tfrfs_mount)
    (rec / "x.bin").write_bytes(b"\0old")
    writer = os.open(rec / "x.bin", os.O_RDWR)
    reader = os.open(rec / "x.bin", os.O_RDONLY)
    try:
        os.pwrite(writer, b"\0new and longer", 0)
        assert os.pread(reader, 100, 0) == b"\0new and longer"
        assert os.fstat(reader).st_size == 15
    finally:
        os.close(writer)
        os.close(reader)


def test_a_file_opens_again_by_the_name_it_was_written_through(tmp_path: Path, tfrfs_mount: Any) -> None:
    """Empty or text content written to x.bin is listed as x.txt (SPEC 3.2), and x.bin still
    finds it until a commit, so the program that wrote it can open it again (fsx -c)."""
    src, rec = _record(tmp_path, tfrfs_mount)
    (rec / "x.bin").write_bytes(b"")
    assert sorted(os.listdir(rec)) == ["n.json", "x.txt"]
    assert (rec / "x.bin").read_bytes() == b""
    with open(rec / "x.bin", "r+b") as f:
        f.write(b"text")
    assert (rec / "x.txt").read_bytes() == (rec / "x.bin").read_bytes() == b"text"
    run_tfrfs("commit", str(rec.parent.parent), check=True)
    assert list(committed(src).features.feature["x"].bytes_list.value) == [b"text"]
    assert sorted(os.listdir(rec)) == ["n.json", "x.txt"]
    assert not (rec / "x.bin").exists()   # after a commit, only the rules' name


def test_files_made_in_a_scratch_folder_are_scratch(tmp_path: Path, tfrfs_mount: Any) -> None:
    """A tool's work folder (git, a build, fsstress) in a record: anything below it is scratch."""
    src, rec = _record(tmp_path, tfrfs_mount)
    work = rec / ".work"
    os.mkdir(work)
    (work / "f0").write_bytes(b"anything")
    os.mkdir(work / "objects")
    (work / "objects" / "ab").write_bytes(b"\0\1")
    os.rename(work / "f0", work / "objects" / "f1")
    (work / "notes.json").write_text("not json at all")
    assert sorted(os.listdir(work)) == ["notes.json", "objects"]
    assert sorted(os.listdir(work / "objects")) == ["ab", "f1"]
    assert (work / "objects" / "f1").read_bytes() == b"anything"
    run_tfrfs("commit", str(rec.parent.parent), check=True)
    assert sorted(committed(src).features.feature) == ["n"]


def test_a_file_removed_while_open_stays_removed(tmp_path: Path, tfrfs_mount: Any) -> None:
    """As on any file system: its descriptor keeps working, and what is written goes nowhere."""
    src, rec = _record(tmp_path, tfrfs_mount)
    (rec / "x.bin").write_bytes(b"\0old")
    old = os.open(rec / "x.bin", os.O_RDWR)
    new = os.open(rec / "y.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.unlink(rec / "x.bin")
        os.unlink(rec / "y.bin")
        os.pwrite(old, b"\0more", 4)
        os.pwrite(new, b"\0new", 0)
        assert os.pread(old, 100, 0) == b"\0old\0more"
        assert os.pread(new, 100, 0) == b"\0new"
    finally:
        os.close(old)
        os.close(new)
    assert sorted(os.listdir(rec)) == ["n.json"]
    run_tfrfs("commit", str(rec.parent.parent), check=True)
    assert sorted(committed(src).features.feature) == ["n"]
