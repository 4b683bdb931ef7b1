"""``repair`` of a local uncompressed shard copies its sound records within the kernel
(``copy_file_range``): each stretch of sound records at once, the same bytes a write of them
gives (SPEC 6). Where the call is missing or refused it writes them as before; a full disk, a
shard that ends early or changes under the copy fail it, leaving nothing behind.

Expected shards come from tests/support/damaged_shards.py, built from the records, never by
tfrfs's walk.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
from pathlib import Path
from typing import Callable

import pytest

from support import damaged_shards
from support.compiled import compiled_or_skip
from support.damaged_shards import Damaged
from tfrfs import cli
from tfrfs.edit.repack import TMP_PREFIX
from tfrfs.format import bulk

compiled_or_skip(bulk._C, "tfrfs.format._records")

if not hasattr(os, "copy_file_range"):
    pytest.skip("no os.copy_file_range here: repair writes what it reads", allow_module_level=True)
_REAL_COPY = os.copy_file_range
SHAPES = damaged_shards.shards()


class Copies:
    """A stand-in for ``os.copy_file_range`` that notes each call (source file, offset, count,
    bytes copied) and does what ``act`` says: the real copy by default."""

    def __init__(self, act: Callable[[int, int, int, int], int] | None = None) -> None:
        self.calls: list[tuple[str, int, int, int]] = []
        self.act = act or (lambda src, dst, count, offset: _REAL_COPY(src, dst, count, offset))

    def __call__(self, src: int, dst: int, count: int, offset_src: int | None = None,
                 offset_dst: int | None = None) -> int:
        assert offset_src is not None and offset_dst is None
        assert len(self.calls) < 100_000, "copy_file_range called again and again"
        name = os.path.basename(os.readlink(f"/proc/self/fd/{src}"))
        assert os.path.basename(os.readlink(f"/proc/self/fd/{dst}")) == f"{TMP_PREFIX}repair-{name}"
        self.calls.append((name, offset_src, count, -1))
        got = self.act(src, dst, count, offset_src)
        self.calls[-1] = (name, offset_src, count, got)
        return got

    def of(self, name: str) -> list[tuple[int, int, int]]:
        return [(offset, count, got) for n, offset, count, got in self.calls if n == name]


def _source(root: Path, shapes: dict[str, Damaged] = SHAPES) -> Path:
    root.mkdir()
    for name, shard in shapes.items():
        (root / name).write_bytes(shard.data)
    return root


def _repair(root: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``tfrfs repair`` with its jobs in this process (where the stand-ins are)."""
    code = cli.main(["repair", "--workers", "1", *args, str(root)])
    out, err = capsys.readouterr()
    return code, out.replace(str(root), "ROOT"), err.replace(str(root), "ROOT")


def _check_repaired(root: Path, shapes: dict[str, Damaged] = SHAPES) -> None:
    for name, shard in shapes.items():
        assert (root / name).read_bytes() == shard.repaired, name
        assert (root / ".tfrfs-damaged" / name).read_bytes() == shard.data, name
    assert not [p for p in os.listdir(root) if p.startswith(TMP_PREFIX)]


def _untouched(root: Path, name: str, data: bytes) -> None:
    """The shard as it was, no backup of it, no temporary file."""
    assert (root / name).read_bytes() == data
    assert not (root / ".tfrfs-damaged" / name).exists()
    assert not [p for p in os.listdir(root) if p.startswith(TMP_PREFIX)]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str]:
    """What repair says of the shards with copy_file_range as it is: exit code, output (its jobs
    in worker processes)."""
    root = _source(tmp_path_factory.mktemp("plain") / "src")
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        code = cli.main(["repair", str(root)])
    _check_repaired(root)
    return code, said.getvalue().replace(str(root), "ROOT")


def test_each_stretch_of_sound_records_is_one_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str], plain: tuple[int, str]) -> None:
    copies = Copies()
    monkeypatch.setattr(os, "copy_file_range", copies)
    root = _source(tmp_path / "src")
    code, out, _ = _repair(root, capsys)
    assert (code, out) == plain and code == 0
    _check_repaired(root)
    for name, shard in SHAPES.items():
        calls = copies.of(name)
        # A call that starts a stretch asks for all of it; one that continues a short copy, the rest.
        spans, at, left = [], -1, 0
        for offset, count, got in calls:
            assert 0 < got <= count
            if left:
                assert (offset, count) == (at, left), name
            else:
                spans.append((offset, offset + count))
            at, left = offset + got, count - got
        assert left == 0 and tuple(spans) == shard.spans, name
        assert f"{name}: repaired: kept {shard.kept:,} records" in out
    assert cli.main(["verify", str(root)]) == 0


@pytest.mark.parametrize("code", [errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL], ids=errno.errorcode.get)
def test_a_refused_copy_writes_the_same_shards(code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str], plain: tuple[int, str]) -> None:
    """Another file system, an old kernel: the first call is refused, and the shard is written
    from its records instead, whole, with the same report."""
    def refuse(src: int, dst: int, count: int, offset: int) -> int:
        raise OSError(code, os.strerror(code))
    copies = Copies(refuse)
    monkeypatch.setattr(os, "copy_file_range", copies)
    root = _source(tmp_path / "src")
    got = _repair(root, capsys)
    _check_repaired(root)
    for name, shard in SHAPES.items():
        assert len(copies.of(name)) == (1 if shard.spans else 0), name   # then no more tries
    assert got[:2] == plain


def test_without_copy_file_range_the_shards_are_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str],
                                                          plain: tuple[int, str]) -> None:
    monkeypatch.delattr(os, "copy_file_range")
    root = _source(tmp_path / "src")
    got = _repair(root, capsys)
    _check_repaired(root)
    assert got[:2] == plain


def test_a_long_stretch_is_copied_as_the_walk_goes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str], plain: tuple[int, str]) -> None:
    """A stretch of sound records longer than what is held back before a copy (64 MiB; here a
    few bytes) is copied in pieces as the walk reads on (a block of 4 MiB at a time; here 4 KiB),
    the pieces end to end, the shards and the report the same."""
    from tfrfs.format import salvage
    from tfrfs.jobs import repair
    monkeypatch.setattr(repair, "_COPY_AHEAD", 1)
    monkeypatch.setattr(salvage, "BLOCK", 4096)
    copies = Copies()
    monkeypatch.setattr(os, "copy_file_range", copies)
    root = _source(tmp_path / "src")
    assert _repair(root, capsys)[:2] == plain
    _check_repaired(root)
    pieces = 0
    for name, shard in SHAPES.items():
        joined: list[tuple[int, int]] = []
        for offset, count, got in copies.of(name):
            assert got == count, name
            if joined and joined[-1][1] == offset:
                joined[-1] = (joined[-1][0], offset + got)
            else:
                joined.append((offset, offset + got))
        assert tuple(joined) == shard.spans, name
        pieces += len(copies.of(name)) - len(shard.spans)
    assert pieces > 0   # some stretch was cut


def test_short_copies_are_taken_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    def short(src: int, dst: int, count: int, offset: int) -> int:
        return _REAL_COPY(src, dst, min(count, 1 + offset % 5000), offset)
    copies = Copies(short)
    monkeypatch.setattr(os, "copy_file_range", copies)
    shapes = {k: SHAPES[k] for k in ("middle.tfrecord", "zeros.tfrecord", "large.tfrecord")}
    root = _source(tmp_path / "src", shapes)
    assert _repair(root, capsys)[0] == 0
    _check_repaired(root, shapes)
    assert len(copies.calls) > 2000


def test_a_shard_that_ends_during_the_copy_is_not_repaired(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(os, "copy_file_range", Copies(lambda src, dst, count, offset: 0))
    name = "middle.tfrecord"
    root = _source(tmp_path / "src", {name: SHAPES[name]})
    code, _, err = _repair(root, capsys)
    assert code == 1
    assert f"{name}: NOT repaired: the shard ends at byte 0, before byte {SHAPES[name].spans[0][1]} it was " \
           f"to be copied up to (it changed during the repair): ROOT/{name}\n" in err, err
    _untouched(root, name, SHAPES[name].data)


@pytest.mark.parametrize("where", ["first copy", "later copy", "python write"])
def test_a_full_disk_is_one_clear_error_and_leaves_nothing(where: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """No room: the same error whether the kernel's copy or a write of the Python path meets it."""
    def full(src: int, dst: int, count: int, offset: int) -> int:
        if where == "later copy" and offset == 0:
            return _REAL_COPY(src, dst, count, offset)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    copies = Copies(full)
    monkeypatch.setattr(os, "copy_file_range", copies)
    if where == "python write":
        from tfrfs.edit.repack import FaultedFile
        monkeypatch.setattr(bulk, "_C", None)
        monkeypatch.setattr(FaultedFile, "write", lambda self, data: full(0, 0, 0, -1))
    name = "middle.tfrecord"
    root = _source(tmp_path / "src", {name: SHAPES[name]})
    code, _, err = _repair(root, capsys)
    assert code == 1 and f"{name}: NOT repaired: No space left on device\n" in err, err
    _untouched(root, name, SHAPES[name].data)
    assert len(copies.calls) == {"first copy": 1, "later copy": 2, "python write": 0}[where]


def test_a_shard_changed_under_the_copy_is_caught_by_the_read_back(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The copy reads the shard again: bytes that changed after the walk checked them are found
    when the new file is read back, and nothing is replaced."""
    name = "middle.tfrecord"
    shard = SHAPES[name]
    root = _source(tmp_path / "src", {name: shard})
    changed = bytearray(shard.data)
    changed[shard.spans[-1][1] - 5] ^= 0x01            # the last record's last data byte

    def change_then_copy(src: int, dst: int, count: int, offset: int) -> int:
        (root / name).write_bytes(bytes(changed))      # (the same file: written in place)
        return _REAL_COPY(src, dst, count, offset)
    monkeypatch.setattr(os, "copy_file_range", Copies(change_then_copy))
    code, _, err = _repair(root, capsys)
    assert code == 1
    assert f"{name}: NOT repaired: data checksum failed for the record at offset " in err, err
    _untouched(root, name, bytes(changed))


def test_no_copy_without_the_compiled_walker_in_a_dry_run_or_a_gzip_shard(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import gzip
    copies = Copies()
    monkeypatch.setattr(os, "copy_file_range", copies)
    shapes = {k: SHAPES[k] for k in ("middle.tfrecord", "garbage.tfrecord")}
    root = _source(tmp_path / "src", shapes)
    assert _repair(root, capsys, "--dry-run")[0] == 0
    assert all((root / n).read_bytes() == s.data for n, s in shapes.items())
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "m.tfrecord.gz").write_bytes(gzip.compress(SHAPES["middle.tfrecord"].data))
    assert _repair(tmp_path / "gz", capsys)[0] == 0
    assert gzip.decompress((tmp_path / "gz" / "m.tfrecord.gz").read_bytes()) == SHAPES["middle.tfrecord"].repaired
    monkeypatch.setattr(bulk, "_C", None)
    assert _repair(root, capsys)[0] == 0
    _check_repaired(root, shapes)
    assert copies.calls == []
