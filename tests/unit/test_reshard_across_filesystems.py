"""``tfrfs reshard`` where SOURCE and DEST lie on file systems that cannot copy between them
within the kernel (``copy_file_range`` answers EXDEV, as from a tmpfs to an ext4 disk): the bytes
are written instead, and DEST is the same, checked copy or ``--no-check``."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from support import reference
from tfrfs.cli.parser import main
from tfrfs.format import proto


def _source(root: Path) -> None:
    root.mkdir()
    for s in range(3):
        records = []
        for i in range(s * 50, (s + 1) * 50):
            ex = proto.Example()
            ex.features.feature["id"].int64_list.value.append(i)
            ex.features.feature["text"].bytes_list.value.append(b"t" * (i % 41))
            records.append(ex.SerializeToString())
        (root / f"src-{s:05d}-of-00003.tfrecord").write_bytes(b"".join(reference.frame(r) for r in records))


def _shards(folder: Path) -> dict[str, bytes]:
    """The new shards' bytes (their index files and the manifest hold the files' times too)."""
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.tfrecord"))}


@pytest.mark.parametrize("extra", [(), ("--no-check",)])
def test_a_copy_the_kernel_refuses_is_written_instead(extra: tuple[str, ...], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    _source(src)
    cache = tmp_path / "cache"
    assert main(["index", str(src), "--cache-dir", str(cache)]) == 0

    def reshard(dest: Path) -> None:
        assert main(["reshard", str(src), str(dest), "--shards", "4", "--workers", "1",
                     "--cache-dir", str(cache), *extra]) == 0

    reshard(tmp_path / "copied")
    refused: list[int] = []

    def exdev(*args: object) -> int:
        refused.append(1)
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
    monkeypatch.setattr(os, "copy_file_range", exdev)
    reshard(tmp_path / "written")
    assert refused, "the copy was not tried"
    assert len(_shards(tmp_path / "copied")) == 4
    assert _shards(tmp_path / "written") == _shards(tmp_path / "copied")
    monkeypatch.undo()
    assert main(["verify", str(tmp_path / "written"), "--cache-dir", str(tmp_path / "c2")]) == 0
