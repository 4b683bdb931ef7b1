"""``tfrfs://`` shows what the mount shows (SPEC 10): every path of the sample dataset and of
../shared/realdata walked through a real FUSE mount and through the fsspec filesystem, with the
same names, types, sizes, modes, times and bytes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

fsspec = pytest.importorskip("fsspec")


def _bytes(read) -> bytes | str:
    """A file's bytes, or the error reading it gives (a damaged record's files: EIO)."""
    try:
        return read()
    except OSError as exc:
        return f"errno {exc.errno}"


def _kept(name: str) -> bool:
    """Which folders are walked into: all but the hidden .tfrfs and, of a shard's record folders,
    those past the first few (the large shards hold 10,000: every shard folder is still listed
    whole, and every record of the small ones is compared)."""
    return name != ".tfrfs" and not (name.isdigit() and int(name) >= RECORDS_WALKED)


RECORDS_WALKED = 12


def _through_mount(mnt: Path) -> dict[str, tuple]:
    """Every path under ``mnt`` walked (``_kept``): (type, size, mode, mtime, bytes)."""
    out: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(mnt):
        rel = os.path.relpath(folder, mnt)
        rel = "" if rel == "." else rel
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            key = f"{rel}/{name}" if rel else name
            is_dir = stat.S_ISDIR(st.st_mode)
            data = None if is_dir else _bytes(lambda: Path(path).read_bytes())
            out[key] = ("directory" if is_dir else "file", None if is_dir else st.st_size,
                        stat.S_IMODE(st.st_mode), st.st_mtime_ns // 1000, data)
        dirs[:] = [d for d in dirs if _kept(d)]
    return out


def _through_fsspec(fs) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    listed: dict[str, dict] = {}
    for _, dirs, files in fs.walk("", detail=True):   # top-down: the folders left out are not walked
        for info in (*dirs.values(), *files.values()):
            listed[info["name"]] = info
        for name in [d for d in dirs if not _kept(d.rsplit("/", 1)[-1])]:
            del dirs[name]
    for path, info in listed.items():
        is_dir = info["type"] == "directory"
        data = None if is_dir else _bytes(lambda: fs.cat_file(path))
        if isinstance(data, bytes):
            assert len(data) == info["size"], path
        out[path] = (info["type"], None if is_dir else info["size"], stat.S_IMODE(info["mode"]),
                     round(info["mtime"] * 1e6), data)
    return out


def _compare(mounted: dict, listed: dict) -> None:
    assert sorted(listed) == sorted(mounted)
    for path in mounted:
        m, f = mounted[path], listed[path]
        assert m[:3] == f[:3], path
        assert abs(m[3] - f[3]) <= 1, path   # microseconds: float seconds hold no more
        assert m[4] == f[4], path


@pytest.mark.parametrize("which", ["sample", "realdata"])
def test_the_same_tree_as_the_mount(which: str, sample: Path, request: pytest.FixtureRequest, tfrfs_mount,
                                    tmp_path: Path) -> None:
    source = sample if which == "sample" else request.getfixturevalue("realdata")
    mnt = tfrfs_mount(source)
    mounted = _through_mount(mnt)
    assert len(mounted) > 50
    fs = fsspec.filesystem("tfrfs", fo=str(source), cache_dir=str(tmp_path / "cache-fsspec"))
    try:
        _compare(mounted, _through_fsspec(fs))
    finally:
        fs.close()
