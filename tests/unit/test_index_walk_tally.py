"""``index`` with the schema reads a shard once: the tally is counted from the blocks the header
walk reads (``indexing._WalkTally``). Its cache entry must be byte for byte the one the two
reads give (the walk, then ``_tally_of_index``), on every kind of shard: sound ones cut by the
walk's blocks anywhere, large records the walk steps over, empty records, damaged ones (where it
gives up and the second read is made), sequences, raw records and realdata."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support import damaged_shards, reference
from tfrfs.format import proto, salvage
from tfrfs.index.discovery import _shard_file
from tfrfs.index.where import Where
from tfrfs.jobs import indexing

REALDATA = Path(__file__).resolve().parents[2].parent / "shared" / "realdata"


def _example(i: int, size: int) -> bytes:
    ex = proto.Example()
    ex.features.feature["id"].int64_list.value.append(i)
    ex.features.feature["text"].bytes_list.value.append(b"t%d " % i * size)
    return ex.SerializeToString()


def _sequence(i: int) -> bytes:
    seq = proto.SequenceExample()
    seq.context.feature["id"].int64_list.value.append(i)
    seq.feature_lists.feature_list["tok"].feature.add().int64_list.value.append(i)
    return seq.SerializeToString()


def _entry(path: Path, tmp: Path, fused: bool, monkeypatch: pytest.MonkeyPatch) -> bytes:
    shard = _shard_file(str(path), path.name, "NONE")
    monkeypatch.setattr(indexing._WalkTally, "suits", staticmethod(lambda s: fused))
    cache = tmp / ("fused" if fused else "read-twice")
    cache.mkdir(exist_ok=True)
    data = indexing.index_job(Where(os.sep, (), str(cache)), shard, True)
    assert isinstance(data, bytes)
    return data


def _same(path: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch, *, once: bool) -> None:
    """The two entries are equal; ``once``: the walk's tally was used (no second read)."""
    twice = _entry(path, tmp, False, monkeypatch)
    second_reads: list[int] = []
    real = indexing._tally_of_index

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        second_reads.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(indexing, "_tally_of_index", counted)
    assert _entry(path, tmp, True, monkeypatch) == twice, path.name
    assert (not second_reads) == once, (path.name, "read once" if once else "read twice")


SOUND = {
    "tiny": [_example(i, 1) for i in range(3000)],
    "cut by blocks": [_example(i, 1 + i * 13 % 60) for i in range(600)],
    "large ones stepped over": [_example(i, 30_000 if i % 7 == 6 and i > 20 else 4) for i in range(120)],
    "empty records among them": [b"" if i % 3 == 0 else _example(i, 5) for i in range(200)],
    "sequences": [_sequence(i) for i in range(300)],
    "raw": [bytes([i % 251]) * (i % 90) for i in range(400)],
}


@pytest.mark.parametrize("name", sorted(SOUND))
@pytest.mark.parametrize("block", [4096, 1 << 20])
def test_a_sound_shard_is_read_once_with_the_same_entry(name: str, block: int, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(salvage, "BLOCK", block)   # blocks that cut records everywhere, or hold many
    path = tmp_path / f"{name.replace(' ', '-')}.tfrecord"
    path.write_bytes(b"".join(reference.frame(r) for r in SOUND[name]))
    _same(path, tmp_path, monkeypatch, once=True)


def test_a_shard_of_few_records_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "few.tfrecord"
    path.write_bytes(b"".join(reference.frame(_example(i, 3)) for i in range(5)))
    _same(path, tmp_path, monkeypatch, once=True)


def test_too_few_records_in_the_first_block_to_choose_the_kind_read_twice(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(salvage, "BLOCK", 4096)
    path = tmp_path / "big-first.tfrecord"
    path.write_bytes(b"".join(reference.frame(_example(i, 2000 if i < 3 else 2)) for i in range(100)))
    _same(path, tmp_path, monkeypatch, once=False)


@pytest.mark.parametrize("name", sorted(damaged_shards.shards()))
def test_a_damaged_shard_gives_the_same_entry(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "damaged.tfrecord"
    path.write_bytes(damaged_shards.shards()[name].data)
    twice = _entry(path, tmp_path, False, monkeypatch)
    assert _entry(path, tmp_path, True, monkeypatch) == twice, name


def test_a_damaged_record_among_the_first_read_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    frames = [bytearray(reference.frame(_example(i, 4))) for i in range(50)]
    frames[3][-1] ^= 0xFF          # record 3's data checksum
    path = tmp_path / "bad-early.tfrecord"
    path.write_bytes(b"".join(frames))
    _same(path, tmp_path, monkeypatch, once=False)


def test_realdata_gives_the_same_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not REALDATA.is_dir():
        pytest.skip(f"{REALDATA}: not here (realdata comes with the project's shared folder)")
    from tfrfs.index.discovery import sniff_file
    shards = [p for p in sorted(REALDATA.rglob("*")) if p.is_file() and sniff_file(str(p)) == "NONE"]
    assert len(shards) >= 8
    for path in shards:
        twice = _entry(path, tmp_path, False, monkeypatch)
        assert _entry(path, tmp_path, True, monkeypatch) == twice, path
