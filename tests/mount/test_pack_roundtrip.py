"""``cp -a MNT/SHARD OUT && tfrfs pack OUT DEST`` gives records that parse equal to SHARD's
(SPEC 10): every shard of the sample dataset and every sound Example or SequenceExample shard of
../shared/realdata of at most 1,000 records (the larger ones are more of the same MNIST and
SequenceExamples, and each record is a cp of its folder: minutes), copied out of a real mount by
cp -a and packed back."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import tfrfs
from conftest import run_tfrfs
from tfrfs.format import proto


MAX_RECORDS = 1000


def _messages(source: Path, cache: Path) -> dict[str, tuple[str, list]]:
    """Each sound shard of ``source`` of at most MAX_RECORDS: (kind, its records parsed), read by
    the library."""
    out = {}
    with tfrfs.open(str(source), cache_dir=str(cache)) as d:
        for s in d.shards:
            if s.kind not in ("example", "sequence") or s.records > MAX_RECORDS:
                continue
            cls = proto.SequenceExample if s.kind == "sequence" else proto.Example
            msgs = []
            for i in range(s.records):
                try:
                    data = bytes(d.record(s.path, i))
                except Exception:   # noqa: BLE001 - a damaged shard: not one cp -a can copy whole
                    msgs = None
                    break
                m = cls()
                m.ParseFromString(data)
                msgs.append(m)
            if msgs is not None:
                out[s.path] = (s.kind, msgs)
    return out


@pytest.mark.parametrize("which", ["sample", "realdata"])
def test_cp_a_then_pack_gives_the_same_records(which: str, sample: Path, request: pytest.FixtureRequest,
                                               tfrfs_mount, tmp_path: Path) -> None:
    source = sample if which == "sample" else request.getfixturevalue("realdata")
    shards = _messages(source, tmp_path / "cache-lib")
    assert shards
    mnt = tfrfs_mount(source)
    # Every shard folder copied out side by side, numbered (realdata's shards share names), and
    # packed by one command: a new shard of each, named as its folder.
    out = tmp_path / "out"
    out.mkdir()
    names = {}
    for n, path in enumerate(sorted(shards)):
        copied = f"{n:02d}-{Path(path).name}"
        subprocess.run(["cp", "-a", str(mnt / path), str(out / copied)], check=True)
        names[path] = copied.removesuffix(".gz")   # packed uncompressed (no --compression)
    dest = tmp_path / "dest"
    proc = run_tfrfs("pack", str(out), str(dest))
    assert proc.returncode == 0, proc.stderr
    with tfrfs.open(str(dest), cache_dir=str(tmp_path / "cache-dest")) as d:
        packed = {s.path: s for s in d.shards}
        assert sorted(packed) == sorted(names.values())
        for path, (kind, msgs) in sorted(shards.items()):
            new = packed[names[path]]
            assert new.kind == kind and new.records == len(msgs), path
            cls = proto.SequenceExample if kind == "sequence" else proto.Example
            for i, want in enumerate(msgs):
                got = cls()
                got.ParseFromString(bytes(d.record(new.path, i)))
                assert got == want, (path, i)
