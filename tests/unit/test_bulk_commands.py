"""The commands that walk every record give the same output on the compiled walker
(tfrfs/format/_records.c) and on the Python path (``TFRFS_PURE=1``): ``verify --json``, the index
files of ``index --beside`` (offsets, problems, checked records and schema), ``reshard``'s
shards, index files and manifest, and the shards ``repair`` writes, on a SOURCE with damage, records of unusual encodings, records
that do not parse, text, images and raw pixels; and ``repair`` of shards damaged in every way it
mends (tests/support/damaged_shards.py), which the compiled path copies within the kernel."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from support import damaged_shards, reference
from support.compiled import compiled_or_skip
from support.schema_reference import PNG
from tfrfs.format import bulk, codec, proto, tfrecord

compiled_or_skip(bulk._C, "tfrfs.format._records")


def _example(values: dict[str, codec.Value]) -> bytes:
    m = proto.Example()
    for key, value in values.items():
        codec.value_to_proto(value, m.features.feature[key])
    return m.SerializeToString()


def _record(i: int) -> bytes:
    kind = i % 9
    if kind == 0:
        return _example({"id": codec.Value("int64_list", (i, -i)), "text": codec.Value("bytes_list", (b"line\n",))})
    if kind == 1:
        return _example({"image/encoded": codec.Value("bytes_list", (PNG,)), "label": codec.Value("int64_list", (i,))})
    if kind == 2:   # raw pixels: 2 x 3 x 1
        return _example({"image": codec.Value("bytes_list", (bytes(6),)), "height": codec.Value("int64_list", (2,)),
                         "width": codec.Value("int64_list", (3,))})
    if kind == 3:   # a key twice: protobuf keeps the last
        entry = b"\x0a\x0a\x0a\x01a\x12\x05\x1a\x03\x0a\x01" + bytes([i % 100])
        return b"\x0a" + bytes([2 * len(entry)]) + entry * 2
    if kind == 4:   # an int64 list not packed
        return b"\x0a\x0b\x0a\x09\x0a\x01b\x12\x04\x1a\x02\x08" + bytes([i % 100])
    if kind == 5 and i % 60 >= 20:   # (past the records a shard's kind is judged by)
        return b"\xff\xfe not a message"
    if kind == 6:
        return _example({"scores": codec.Value("float_list", (0.5, float(i))), "none": codec.Value("none", ())})
    if kind == 7:
        return _example({"words": codec.Value("bytes_list", (b"a", b"b\n", "é".encode()))})
    return _example({"blob": codec.Value("bytes_list", (b"\x00\x01", b"x"))})


def _source(root: Path) -> None:
    root.mkdir()
    for s in range(3):
        frames = [tfrecord.frame(_record(s * 60 + i)) for i in range(60)]
        buf = bytearray(b"".join(frames))
        if s == 1:
            at = sum(map(len, frames[:7]))
            buf[at + tfrecord.HEADER + 1] ^= 0x40       # a data checksum fails
            at = sum(map(len, frames[:30]))
            buf[at + 2] ^= 1                            # a header fails: a gap
        (root / f"src-{s:05d}-of-00003.tfrecord").write_bytes(bytes(buf))


def _tfrfs(*args: str, pure: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("TFRFS_PURE", None)
    if pure:
        env["TFRFS_PURE"] = "1"
    proc = subprocess.run([sys.executable, "-m", "tfrfs", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def _index_files(folder: Path) -> dict[str, tuple[dict, list[int]]]:
    out = {}
    for p in sorted(folder.glob("*.tfrfs-idx")):
        head, offsets = reference.read_index_file(p.read_bytes())
        for varies in ("identity", "mtime_ns"):   # the file's, not what it holds
            head.pop(varies, None)
        out[p.name] = (head, offsets)
    return out


def _said(out: str, root: Path) -> str:
    """A command's output without what differs between two runs: where, and how long it took."""
    return re.sub(r" in [0-9.]+ ?m?s\b", "", out.replace(str(root), "ROOT"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    base = tmp_path_factory.mktemp("bulk")
    out: dict[str, dict] = {}
    for path in ("compiled", "python"):
        pure = path == "python"
        root = base / path
        root.mkdir()
        _source(root / "src")
        verify = _tfrfs("verify", str(root / "src"), "--json", "--cache-dir", str(root / "cache"), pure=pure)
        shutil.copytree(root / "src", root / "beside")
        index = _tfrfs("index", str(root / "beside"), "--beside", "--cache-dir", str(root / "cache2"), pure=pure)
        reshard = _tfrfs("reshard", str(root / "src"), str(root / "dest"), "--shards", "4", "--cache-dir",
                         str(root / "cache3"), pure=pure)
        shutil.copytree(root / "src", root / "repaired")
        repair = _tfrfs("repair", str(root / "repaired"), "--cache-dir", str(root / "cache4"), pure=pure)
        out[path] = {"repair": (repair.returncode, _said(repair.stdout, root)),
                     "repaired": {p.name: p.read_bytes() for p in sorted((root / "repaired").glob("*.tfrecord"))},
                     "verify": (verify.returncode, json.loads(verify.stdout)), "index": index.returncode,
                     "beside": _index_files(root / "beside"), "reshard": (reshard.returncode, _said(reshard.stdout, root)),
                     "dest": {p.name: p.read_bytes() for p in sorted((root / "dest").glob("*.tfrecord"))},
                     "dest_index": _index_files(root / "dest"),
                     "schema": reference.read_manifest(root / "dest").get("schema")}
    return out


def test_verify_says_the_same(runs: dict[str, dict]) -> None:
    assert runs["compiled"]["verify"] == runs["python"]["verify"]
    code, report = runs["compiled"]["verify"]
    assert code == 1
    reasons = [p["reason"] for shard in report["shards"] for p in shard["problems"]]
    assert sum("data checksum failed" in r for r in reasons) == 1
    unparsable = [i for i in range(180) if i % 9 == 5 and i % 60 >= 20]
    assert sum("does not parse" in r for r in reasons) == len(unparsable) == 14


def test_index_files_are_the_same(runs: dict[str, dict]) -> None:
    assert runs["compiled"]["index"] == runs["python"]["index"] == 1   # (the damage found)
    assert runs["compiled"]["beside"] == runs["python"]["beside"]
    heads = [head for head, _ in runs["compiled"]["beside"].values()]
    assert len(heads) == 3 and all("schema" in h for h in heads)


def test_reshard_writes_the_same_dataset(runs: dict[str, dict]) -> None:
    fast, slow = runs["compiled"], runs["python"]
    assert fast["reshard"] == slow["reshard"]
    assert fast["reshard"][0] == 1   # the damage is reported
    assert fast["dest"] == slow["dest"] and len(fast["dest"]) == 4
    assert fast["dest_index"] == slow["dest_index"]
    assert fast["schema"] == slow["schema"] and fast["schema"] is not None


def test_repair_writes_the_same_shards(runs: dict[str, dict]) -> None:
    fast, slow = runs["compiled"], runs["python"]
    assert fast["repair"] == slow["repair"] and fast["repair"][0] == 0, fast["repair"]
    assert fast["repaired"] == slow["repaired"]
    whole = [tfrecord.frame(_record(i)) for i in range(60, 120) if i not in (67, 90)]   # the lost ones
    assert fast["repaired"]["src-00001-of-00003.tfrecord"] == b"".join(whole)


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, damaged_shards.Damaged], dict[str, dict]]:
    """``repair`` of the shards of tests/support/damaged_shards.py on each path."""
    base = tmp_path_factory.mktemp("damaged")
    shapes = damaged_shards.shards()
    out: dict[str, dict] = {}
    for path in ("compiled", "python"):
        root = base / path
        root.mkdir()
        for name, shard in shapes.items():
            (root / name).write_bytes(shard.data)
        repair = _tfrfs("repair", str(root), "--cache-dir", str(base / f"cache-{path}"), pure=path == "python")
        out[path] = {"repair": (repair.returncode, _said(repair.stdout, root)),
                     "repaired": {p.name: p.read_bytes() for p in sorted(root.glob("*.tfrecord"))},
                     "kept": {p.name: p.read_bytes() for p in sorted((root / ".tfrfs-damaged").glob("*"))}}
    return shapes, out


def test_repair_of_every_damage_writes_the_same_shards(damaged: tuple[dict, dict[str, dict]]) -> None:
    shapes, runs = damaged
    fast, slow = runs["compiled"], runs["python"]
    assert fast["repair"] == slow["repair"] and fast["repair"][0] == 0, fast["repair"]
    assert fast["repaired"] == slow["repaired"] == {name: s.repaired for name, s in shapes.items()}
    assert fast["kept"] == slow["kept"] == {name: s.data for name, s in shapes.items()}
    for name, shard in shapes.items():
        assert f"{name}: repaired: kept {shard.kept:,} records" in fast["repair"][1]
