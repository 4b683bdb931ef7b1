"""``tfrfs://`` in one process (SPEC 10): found by fsspec through its entry point, chained before
another filesystem, ranges and seeks, read-only, and what pyarrow and pandas ask of it."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

fsspec = pytest.importorskip("fsspec")

JPEG = "train/train-00000-of-00002.tfrecord/000000/image/encoded.jpg"
HEIGHT = "train/train-00000-of-00002.tfrecord/000000/image/height.json"


@pytest.fixture
def fs(sample: Path, tmp_path: Path):
    made = fsspec.filesystem("tfrfs", fo=str(sample), cache_dir=str(tmp_path / "cache"))
    yield made
    made.close()


def _height_of(sample: Path, tmp_path: Path) -> list[int]:
    """Record 0's image/height, as the library reads it (not through tfrfs://)."""
    import tfrfs
    with tfrfs.open(str(sample), cache_dir=str(tmp_path / "lib-cache")) as d:
        return list(d.example("train/train-00000-of-00002.tfrecord", 0)["image/height"])


def _height(fs) -> list[int]:
    return _height_of(Path(fs.mount.source.name), Path(fs.mount.source.cache_dir))


def test_found_through_the_entry_point() -> None:
    from tfrfs.fsspec_fs import TfrfsFileSystem
    assert fsspec.get_filesystem_class("tfrfs") is TfrfsFileSystem


def test_ls_info_and_bytes(fs) -> None:
    top = fs.ls("", detail=False)
    assert "train" in top and "val" in top and "dataset_info.json" in top
    shard = fs.info("train/train-00000-of-00002.tfrecord")
    assert shard["type"] == "directory" and shard["mode"] == 0o40555
    info = fs.info(JPEG)
    assert info["type"] == "file" and info["mode"] == 0o100444 and info["size"] > 100
    data = fs.cat_file(JPEG)
    assert data[:2] == b"\xff\xd8" and len(data) == info["size"]
    assert fs.cat_file(JPEG, 2, 10) == data[2:10]
    assert fs.cat_file(JPEG, -4) == data[-4:]
    assert json.loads(fs.cat_file(HEIGHT)) == _height(fs)
    with fs.open(JPEG) as f:
        f.seek(5)
        assert f.read(7) == data[5:12]
        f.seek(-3, 2)
        assert f.read() == data[-3:]


def test_missing_paths_and_folders(fs) -> None:
    with pytest.raises(FileNotFoundError):
        fs.info("train/nope")
    with pytest.raises(IsADirectoryError):
        fs.cat_file("train")
    with pytest.raises(IsADirectoryError):
        fs.open("train")


def test_read_only(fs) -> None:
    for call in (lambda: fs.open(HEIGHT, "wb"), lambda: fs.rm(HEIGHT), lambda: fs.mkdir("x"),
                 lambda: fs.mv(HEIGHT, "y")):
        with pytest.raises(PermissionError) as got:
            call()
        assert got.value.errno == errno.EROFS


def test_chained_url(sample: Path, tmp_path: Path) -> None:
    url = f"tfrfs://{JPEG}::file://{sample}"
    with fsspec.open(url, tfrfs={"cache_dir": str(tmp_path / "cache")}) as f:
        data = f.read()
    assert data[:2] == b"\xff\xd8"
    fs2, path = fsspec.core.url_to_fs(f"tfrfs://train::file://{sample}", tfrfs={"cache_dir": str(tmp_path / "c")})
    try:
        assert path == "train" and fs2.isdir(path)
    finally:
        fs2.close()


def test_a_protocol_it_cannot_read_through_is_one_clear_error(tmp_path: Path) -> None:
    from tfrfs.errors import UsageError
    with pytest.raises(UsageError, match="ftp://"):
        fsspec.filesystem("tfrfs", fo="host/ds", target_protocol="ftp", cache_dir=str(tmp_path))


def test_pyarrow_lists_a_shard_folder(fs) -> None:
    pafs = pytest.importorskip("pyarrow.fs")
    pfs = pafs.PyFileSystem(pafs.FSSpecHandler(fs))
    infos = pfs.get_file_info(pafs.FileSelector("train/train-00000-of-00002.tfrecord", recursive=False))
    names = sorted(i.base_name for i in infos)
    assert names[:2] == ["000000", "000001"] and all(i.type == pafs.FileType.Directory for i in infos)
    [jpeg] = pfs.get_file_info([JPEG])
    assert jpeg.type == pafs.FileType.File and jpeg.size == fs.info(JPEG)["size"]
    with pfs.open_input_file(JPEG) as f:
        assert f.read(2) == b"\xff\xd8"


def test_pandas_reads_a_json_feature(sample: Path, tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    got = pd.read_json(f"tfrfs://{HEIGHT}::file://{sample}", typ="series",
                       storage_options={"tfrfs": {"cache_dir": str(tmp_path / "cache")}})
    assert list(got) == _height_of(sample, tmp_path)
