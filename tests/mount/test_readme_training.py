"""README's "Training from a tfrfs dataset": its two PyTorch examples, run as written (the mount
point and the source put in), on a mount of a small dataset of JPEG images and labels, and what
their DataLoaders give checked against the records written. Skipped where PyTorch is not
installed (scripts/bench --loader installs it; the suite does not)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tfrfs.format import proto
from tfrfs.format import tfrecord

from support.readme import python_blocks

pytestmark = pytest.mark.mount

SECTION = "## Training from a tfrfs dataset"
SIDE = 24


def _examples() -> list[str]:
    return python_blocks(SECTION, 2)


def _write(src: Path) -> list[tuple[int, int]]:
    """Two shards of 10 records, each an ``image`` (a JPEG of one colour) and a ``label``; the
    (label, red) pairs written."""
    from PIL import Image
    src.mkdir()
    written = []
    for s in range(2):
        frames = []
        for i in range(10):
            label, red = 100 * s + i, 20 * i + 10
            buf = io.BytesIO()
            Image.new("RGB", (SIDE, SIDE), (red, 128, 255 - red)).save(buf, "JPEG", quality=95)
            ex = proto.Example()
            ex.features.feature["image"].bytes_list.value.append(buf.getvalue())
            ex.features.feature["label"].int64_list.value.append(label)
            frames.append(tfrecord.frame(ex.SerializeToString()))
            written.append((label, red))
        (src / f"train-{s:05d}-of-00002.tfrecord").write_bytes(b"".join(frames))
    return written


def _read(loader) -> list[tuple[int, int]]:
    import torch
    got = []
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (SIDE, SIDE, 3)
        got += [(int(label), int(img[SIDE // 2, SIDE // 2, 0])) for img, label in zip(images, labels)]
    return got


def _same(got: list[tuple[int, int]], written: list[tuple[int, int]]) -> None:
    assert sorted(label for label, _ in got) == sorted(label for label, _ in written)
    red = dict(written)
    assert all(abs(r - red[label]) <= 8 for label, r in got), (got, written)   # JPEG rounds


def test_readme_training_examples_run_as_written(tmp_path: Path, tfrfs_mount, monkeypatch) -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed (scripts/bench --loader installs it)")
    mount_example, library_example = _examples()
    src = tmp_path / "data"
    written = _write(src)
    mnt = tfrfs_mount(src)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))   # tfrfs.open's default cache

    assert '"/mnt/data"' in mount_example
    ns: dict = {"__name__": "readme_mount"}
    exec(compile(mount_example.replace('"/mnt/data"', repr(str(mnt))), "README: from a mount", "exec"), ns)
    _same(_read(ns["loader"]), written)

    assert '"data/"' in library_example
    ns = {"__name__": "readme_library"}
    exec(compile(library_example.replace('"data/"', repr(str(src))), "README: without a mount", "exec"), ns)
    assert len(ns["loader"].dataset) == len(written)
    _same(_read(ns["loader"]), written)
