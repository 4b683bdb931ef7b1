"""README's "Loaders over tfrfs://": its PyTorch, Hugging Face ``datasets`` and Grain examples,
run as written (the source put in) on a small dataset of JPEG images and labels, and what each
gives checked against the records written. Each is skipped where its library is not installed
(``scripts/loaders`` installs them; the suite does not)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from support.readme import python_blocks
from tfrfs.format import proto, tfrecord

pytest.importorskip("fsspec")
SECTION = "### Loaders over `tfrfs://`"
SIDE = 24


def _examples() -> list[str]:
    return python_blocks(SECTION, 3)


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[tuple[int, bytes]]]:
    """Two shards of 6 records, each an ``image`` (a JPEG of one colour) and a ``label``."""
    from PIL import Image
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))   # tfrfs:// indexes' default cache
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    src = tmp_path / "data"
    src.mkdir()
    written = []
    for s in range(2):
        frames = []
        for i in range(6):
            label = 100 * s + i
            buf = io.BytesIO()
            Image.new("RGB", (SIDE, SIDE), (20 * i + 10, 128, 40)).save(buf, "JPEG", quality=95)
            ex = proto.Example()
            ex.features.feature["image"].bytes_list.value.append(buf.getvalue())
            ex.features.feature["label"].int64_list.value.append(label)
            frames.append(tfrecord.frame(ex.SerializeToString()))
            written.append((label, buf.getvalue()))
        (src / f"train-{s:05d}-of-00002.tfrecord").write_bytes(b"".join(frames))
    return src, written


def _run(block: str, src: Path, name: str) -> dict:
    assert '"data/"' in block
    ns: dict = {"__name__": name}
    exec(compile(block.replace('"data/"', repr(str(src))), f"README: {name}", "exec"), ns)
    return ns


def test_pytorch(data) -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed (scripts/loaders installs it)")
    src, written = data
    ns = _run(_examples()[0], src, "pytorch")
    got = []
    for images, labels in ns["loader"]:
        assert images.shape[1:] == (SIDE, SIDE, 3)
        got += [int(label) for label in labels]
    assert sorted(got) == sorted(label for label, _ in written)


def test_hugging_face_datasets(data) -> None:
    pytest.importorskip("datasets", reason="datasets is not installed (scripts/loaders installs it)")
    src, written = data
    hf = _run(_examples()[1], src, "datasets")["hf"]
    assert len(hf) == len(written)
    assert sorted(row["label"] for row in hf) == sorted(label for label, _ in written)
    assert hf[0]["image"].size == (SIDE, SIDE)


def test_grain(data) -> None:
    pytest.importorskip("grain.python", reason="grain is not installed (scripts/loaders installs it)")
    src, written = data
    got = {row["label"]: row["jpeg"] for row in _run(_examples()[2], src, "grain")["grain_loader"]}
    assert got == dict(written)
