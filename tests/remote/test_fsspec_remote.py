"""``tfrfs://`` chained over a bucket (SPEC 10): ``tfrfs://PATH::s3://bucket/prefix`` shows what a
mount of the same prefix shows: every path's type, size and bytes (the errno of a damaged
record's files), through fsspec in this process, against the loopback S3 server (or, with
``TFRFS_REMOTE_STORE=file``, a folder reached as ``file://``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

fsspec = pytest.importorskip("fsspec")

pytestmark = pytest.mark.mount


def _walk_mount(mnt: Path, top: str) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(mnt / top):
        rel = os.path.relpath(folder, mnt)
        for name in dirs:
            out[f"{rel}/{name}"] = ("directory",)
        for name in files:
            path = os.path.join(folder, name)
            try:
                data: bytes | str = Path(path).read_bytes()
            except OSError as exc:
                data = f"errno {exc.errno}"
            out[f"{rel}/{name}"] = ("file", os.stat(path).st_size, data)
    return out


def _walk_fs(fs, top: str) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    for path, info in fs.find(top, withdirs=True, detail=True).items():
        if path == top:
            continue
        if info["type"] == "directory":
            out[path] = ("directory",)
            continue
        try:
            data: bytes | str = fs.cat_file(path)
        except OSError as exc:
            data = f"errno {exc.errno}"
        out[path] = ("file", info["size"], data)
    return out


def test_chained_over_a_bucket_shows_what_the_mount_shows(realdata: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    s3.upload_tree(realdata / "Tensorflow-Ion-Detetection", "real")
    mnt = tfrfs_mount(s3.url("real"))
    tops = sorted(os.listdir(mnt))
    assert tops
    url = s3.url("real")
    protocol, _, rest = url.partition("://")
    fs, root = fsspec.core.url_to_fs(f"tfrfs://::{url}", tfrfs={"cache_dir": str(tmp_path / "cache")})
    try:
        assert root == ""
        assert sorted(fs.ls("", detail=False)) == sorted(t for t in tops)
        for top in tops:
            if top == ".tfrfs":
                continue
            assert _walk_fs(fs, top) == _walk_mount(mnt, top), top
        # One file by its chained URL, opened as any fsspec URL is.
        some = next(p for p, i in fs.find("", detail=True).items() if i["type"] == "file" and i["size"] > 0
                    and not p.startswith(".tfrfs"))
        with fsspec.open(f"tfrfs://{some}::{url}", tfrfs={"cache_dir": str(tmp_path / "cache2")}) as f:
            assert f.read() == (mnt / some).read_bytes()
    finally:
        fs.close()
