"""tfrfs.fuse.mounttab over a mount table written by the test (no mount needed)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import pytest

from tfrfs.fuse import mounttab


def _table(path: Path, *mounts: tuple[str, str, str]) -> Path:
    """A mountinfo file listing ``mounts`` (point, type, source), points escaped as the kernel does."""
    lines = []
    for i, (point, fstype, source) in enumerate(mounts):
        escaped = point.replace("\\", "\\134").replace(" ", "\\040")
        lines.append(f"{20 + i} 1 0:{i} / {escaped} rw,relatime shared:{i} - {fstype} {source} rw\n")
    path.write_text("".join(lines))
    return path


@pytest.fixture
def tab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    base = tmp_path.resolve()
    (base / "mnt").mkdir()
    (base / "with space").mkdir()
    monkeypatch.setattr(mounttab, "MOUNTINFO", str(_table(
        tmp_path / "mountinfo",
        ("/", "ext4", "/dev/vda1"),
        (str(base / "mnt"), "fuse.other", "other"),
        (str(base / "mnt"), "fuse.tfrfs", "tfrfs"),       # mounted over: the last one counts
        (str(base / "with space"), "fuse.tfrfs", "ds"),
    )))
    return base


def test_entries_unescape_mount_points(tab: Path) -> None:
    points = [(e.point, e.fstype, e.source) for e in mounttab.entries()]
    assert (str(tab / "with space"), "fuse.tfrfs", "ds") in points
    assert len(points) == 4


def test_fstype_at_the_last_mount(tab: Path) -> None:
    assert mounttab.fstype_at(tab / "mnt") == "fuse.tfrfs"
    assert mounttab.is_tfrfs_mount(tab / "with space")
    assert mounttab.fstype_at(tab) is None
    assert not mounttab.is_tfrfs_mount(tab)


def test_fstype_at_a_relative_path_and_a_symlink(tab: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tab / "link").symlink_to(tab / "mnt")
    monkeypatch.chdir(tab)
    assert mounttab.fstype_at("mnt") == "fuse.tfrfs"
    assert mounttab.fstype_at("link") == "fuse.tfrfs"


def test_fstype_at_does_not_stat_the_mount_point(tab: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stat of a mount point waits for its daemon: with a hung daemon the question would hang.
    point = str(tab / "mnt")
    real_lstat, real_stat = os.lstat, os.stat

    def refuse(stat: Callable[..., os.stat_result]) -> Callable[..., os.stat_result]:
        def call(p: str | os.PathLike[str], *args: Any, **kw: Any) -> os.stat_result:
            assert os.fspath(p) != point, f"stat of the mount point {point}"
            return stat(p, *args, **kw)
        return call

    monkeypatch.setattr(os, "lstat", refuse(real_lstat))
    monkeypatch.setattr(os, "stat", refuse(real_stat))
    assert mounttab.fstype_at(point) == "fuse.tfrfs"


def test_fstype_holding_the_longest_mount_point_above(tab: Path) -> None:
    assert mounttab.fstype_holding(tab / "mnt" / "a" / "b") == "fuse.tfrfs"
    assert mounttab.fstype_holding(tab / "mnt") == "fuse.tfrfs"
    assert mounttab.fstype_holding(tab / "mntx") == "ext4"
    assert mounttab.fstype_holding(tab) == "ext4"
