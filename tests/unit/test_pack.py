"""``tfrfs pack`` (SPEC 10) without a mount: record folders made by hand and image folders into
shards, read back through the library (``tfrfs.open``) and checked against the values the files
hold; every file that cannot be packed named with its reason and nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import tfrfs
from tfrfs.cli.parser import main
from tfrfs.edit.packing import Hints, Problems, record_bytes
from tfrfs.format import proto

JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 20


def _write(root: Path, files: dict[str, bytes | str]) -> Path:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
    return root


def _examples(dest: Path, cache: Path) -> dict[str, list[dict]]:
    with tfrfs.open(str(dest), cache_dir=str(cache)) as d:
        return {s.path: [d.example(s.path, i) for i in range(s.records)] for s in d.shards}


def test_records_made_by_hand(tmp_path: Path) -> None:
    src = _write(tmp_path / "folder", {
        "rec2/image.jpg": JPEG, "rec2/label.json": "[2]\n", "rec2/caption.txt": "a dog\n",
        "rec10/image.jpg": JPEG, "rec10/label.json": "[10]", "rec10/caption.txt": "two\nlines\n\n",
        "rec10/image/object/bbox/xmin.json": "[0.25, 0.5]\n", "rec10/tags.json": '["a", "b"]',
        "rec10/.scratch.swp": "left out", "rec10/notes~": "left out too",
        "rec10/empty.json": "null\n",
    })
    assert main(["pack", str(src), str(tmp_path / "dest"), "--workers", "1"]) == 0
    got = _examples(tmp_path / "dest", tmp_path / "cache")
    assert list(got) == ["folder.tfrecord"]
    first, second = got["folder.tfrecord"]   # natural order: rec2 before rec10
    assert first == {"image": [JPEG], "label": [2], "caption": [b"a dog"]}   # the editor's newline dropped
    assert second["label"] == [10] and second["caption"] == [b"two\nlines\n\n"]   # two kept, as written
    assert second["image/object/bbox/xmin"] == [0.25, 0.5] and second["tags"] == [b"a", b"b"]
    assert second["empty"] is None
    assert not (tmp_path / "dest").joinpath(".tfrfs-commit-reshard-dest").exists()
    assert (tmp_path / "dest" / ".tfrfs-manifest").is_file()
    assert (tmp_path / "dest" / "folder.tfrecord.tfrfs-idx").is_file()


def test_shard_folders_and_shards_option(tmp_path: Path) -> None:
    files = {f"ds/{s}/{r:03d}/n.json": f"[{s}{r}]" for s in ("a", "b") for r in range(5)}
    files = {k: v.replace("[a", "[1").replace("[b", "[2") for k, v in files.items()}
    src = _write(tmp_path, files) / "ds"
    assert main(["pack", str(src), str(tmp_path / "one-each"), "--workers", "1"]) == 0
    got = _examples(tmp_path / "one-each", tmp_path / "c1")
    assert {k: [e["n"][0] for e in v] for k, v in got.items()} == \
        {"a.tfrecord": [10, 11, 12, 13, 14], "b.tfrecord": [20, 21, 22, 23, 24]}
    assert main(["pack", str(src), str(tmp_path / "three"), "--shards", "3", "--compression", "gzip",
                 "--workers", "1"]) == 0
    got = _examples(tmp_path / "three", tmp_path / "c2")
    assert list(got) == [f"ds-{i:05d}-of-00003.tfrecord.gz" for i in range(3)]
    assert [e["n"][0] for v in got.values() for e in v] == [10, 11, 12, 13, 14, 20, 21, 22, 23, 24]
    assert [len(v) for v in got.values()] == [4, 3, 3]


def test_shard_size(tmp_path: Path) -> None:
    """Shards of about SIZE bytes of the records' files: records of 100 bytes, 250 a shard."""
    src = _write(tmp_path / "sized", {f"r{i:02d}/blob.bin": bytes([i]) * 100 for i in range(7)})
    assert main(["pack", str(src), str(tmp_path / "dest"), "--shard-size", "250", "--workers", "1"]) == 0
    got = _examples(tmp_path / "dest", tmp_path / "c")
    assert list(got) == [f"sized-{i:05d}-of-00004.tfrecord" for i in range(4)]
    assert [len(v) for v in got.values()] == [2, 2, 2, 1]
    assert [e["blob"][0][0] for v in got.values() for e in v] == list(range(7))
    img = _write(tmp_path / "img", {f"c/{i}.jpg": JPEG + bytes(100) for i in range(3)})
    assert main(["pack", str(img), str(tmp_path / "dest2"), "--layout", "imagefolder", "--shard-size", "1",
                 "--workers", "1"]) == 0
    assert sorted(os.listdir(tmp_path / "dest2")) == sorted(
        [".tfrfs-manifest"] + [f"img-{i:05d}-of-00003.tfrecord{x}" for i in range(3) for x in ("", ".tfrfs-idx")])


def test_every_file_that_cannot_be_packed_is_named_and_nothing_is_written(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    src = _write(tmp_path / "bad", {
        "r1/label.json": "[1]", "r2/label.json": "{not json", "r2/tags.json": "[]",
        "r3/label.json": "[3]", "r3/label.txt": "3", "r4/weird.xyz": "?", "r5/%zz.json": "[1]",
    })
    dest = tmp_path / "dest"
    assert main(["pack", str(src), str(dest), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{src}/r2/label.json: not valid JSON" in err
    assert f"{src}/r2/tags.json: [] tells no kind" in err
    assert f"{src}/r3/label.txt: a second file for the key 'label' (the first: {src}/r3/label.json)" in err
    assert f"{src}/r4/weird.xyz: a feature file needs a suffix" in err
    assert f"{src}/r5/%zz.json:" in err
    assert "5 file(s) cannot be packed; nothing was written" in err
    assert not dest.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".tfrfs")]


def test_the_schema_tells_what_the_files_cannot(tmp_path: Path) -> None:
    src = _write(tmp_path / "f", {"r/tags.json": "[]\n", "r/note.txt": "kept newline\n", "r/scores.json": "[1, 2]"})
    schema = {"features": {
        "tags": {"kind": "int64_list", "shown_as": [".json"]},
        "note": {"kind": "bytes_list", "ending_in_newline": 3, "shown_as": [".txt"]},
        "scores": {"kind": "float_list", "shown_as": [".json"]}}}
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    assert main(["pack", str(src), str(tmp_path / "dest"), "--schema", str(tmp_path / "schema.json"),
                 "--workers", "1"]) == 0
    [rec] = _examples(tmp_path / "dest", tmp_path / "c")["f.tfrecord"]
    assert rec == {"tags": [], "note": [b"kept newline\n"], "scores": [1.0, 2.0]}
    ex = proto.Example()
    ex.ParseFromString(record_bytes(str(src / "r"), "example", Hints.from_schema(schema)))
    assert ex.features.feature["tags"].WhichOneof("kind") == "int64_list"
    assert ex.features.feature["scores"].WhichOneof("kind") == "float_list"


def test_sequence_example_folders(tmp_path: Path) -> None:
    src = _write(tmp_path / "clips", {
        "c0/context/id.txt": "clip0", "c0/feature_lists/frames.steps/0.jpg": JPEG,
        "c0/feature_lists/frames.steps/1.jpg": JPEG + b"1", "c0/feature_lists/labels.json": "[[1], [2, 3]]",
    })
    data = record_bytes(str(src / "c0"), "sequence")
    seq = proto.SequenceExample()
    seq.ParseFromString(data)
    assert seq.context.feature["id"].bytes_list.value == [b"clip0"]
    assert [f.bytes_list.value[0] for f in seq.feature_lists.feature_list["frames"].feature] == [JPEG, JPEG + b"1"]
    assert [list(f.int64_list.value) for f in seq.feature_lists.feature_list["labels"].feature] == [[1], [2, 3]]
    with pytest.raises(Problems) as got:
        record_bytes(str(_write(tmp_path / "x", {"c/stray.json": "[1]"}) / "c"), "sequence")
    assert "a SequenceExample record holds only context/ and feature_lists/" in got.value.problems[0]


def test_image_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _write(tmp_path / "pets", {"dog/b.jpg": JPEG + b"b", "cat/a2.jpg": JPEG + b"2", "cat/a10.jpg": JPEG + b"10",
                                     "dog/.DS_Store": "left out"})
    assert main(["pack", str(src), str(tmp_path / "dest"), "--layout", "imagefolder", "--workers", "1"]) == 0
    got = _examples(tmp_path / "dest", tmp_path / "c")["pets.tfrecord"]
    assert got == [
        {"image": [JPEG + b"2"], "label": [0], "label_name": [b"cat"], "filename": [b"a2.jpg"]},
        {"image": [JPEG + b"10"], "label": [0], "label_name": [b"cat"], "filename": [b"a10.jpg"]},
        {"image": [JPEG + b"b"], "label": [1], "label_name": [b"dog"], "filename": [b"b.jpg"]},
    ]
    (src / "dog" / "readme.txt").write_text("no")
    assert main(["pack", str(src), str(tmp_path / "dest2"), "--layout", "imagefolder", "--workers", "1"]) == 2
    assert f"{src}/dog/readme.txt: not an image" in capsys.readouterr().err
    assert not (tmp_path / "dest2").exists()


def test_dest_must_be_new_or_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _write(tmp_path / "f", {"r/n.json": "[1]"})
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "x").write_text("mine")
    assert main(["pack", str(src), str(tmp_path / "dest")]) == 2
    assert "DEST is not empty" in capsys.readouterr().err
    assert (tmp_path / "dest" / "x").read_text() == "mine"
