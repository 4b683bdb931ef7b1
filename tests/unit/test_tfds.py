"""TFDS metadata following the shards (SPEC 7, "TFDS metadata"): ``dataset_info.json`` in, the same
JSON out, as TFDS would need it to find and count each split's shards; then a commit of an
in-process writable mount (no FUSE), which updates it after the shards, crash-safely.

TFDS finds a split's files by formatting its ``filepathTemplate`` for shards ``0 .. N-1`` of
``N = len(shardLengths)`` (numbers padded to five digits), so the expected names below are
spelled out by hand, as TFDS writes them.
"""

from __future__ import annotations

import copy
import json
import os
from array import array
from pathlib import Path

import pytest

from tfrfs.storage import durable
from tfrfs.format import proto
from tfrfs.index import tfds_info as tfds
from tfrfs.format import tfrecord
from tfrfs.index.shard_index import ShardIndex
from tfrfs.index.discovery import ShardFile
from tfrfs.edit.repack import TMP_PREFIX
from tfrfs.index.tfds_info import ShardFigures as F

from inprocess import Session
from support import reference

XOFY = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
INDEXED = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}"


def info(*splits: dict) -> dict:
    return {"fileFormat": "tfrecord", "name": "toy", "splits": list(splits), "version": "1.0.0"}


def split(name: str, lengths: list, num_bytes: object = "0", template: str = XOFY) -> dict:
    return {"filepathTemplate": template, "name": name, "numBytes": num_bytes, "shardLengths": lengths}


def follow(doc: dict, shards: dict[str, F], changed=None) -> tuple[dict, tfds.Followed]:
    doc = copy.deepcopy(doc)
    return doc, tfds.follow(doc, shards, changed)


TRAIN = split("train", ["5", "5"], "500")
TEST = split("test", ["3"], "300")
BOTH = info(TRAIN, TEST)
IN_STEP = {"toy-train.tfrecord-00000-of-00002": F(5, 250), "toy-train.tfrecord-00001-of-00002": F(5, 250),
           "toy-test.tfrecord-00000-of-00001": F(3, 300)}


def test_in_step_is_left_alone() -> None:
    got, done = follow(BOTH, IN_STEP, changed={"toy-test.tfrecord-00000-of-00001"})
    assert got == BOTH and not done.changes and not done.problems


def test_lengths_and_bytes_follow_a_commit() -> None:
    shards = dict(IN_STEP, **{"toy-train.tfrecord-00001-of-00002": F(3, 170)})
    got, done = follow(BOTH, shards, changed={"toy-train.tfrecord-00001-of-00002"})
    assert got["splits"][0]["shardLengths"] == ["5", "3"]          # strings, as TFDS writes int64
    assert got["splits"][0]["numBytes"] == "420"
    assert got["splits"][1] == TEST
    assert done.changes == ["split 'train': 1 shard length changed, 10 -> 8 records, numBytes 500 -> 420"]
    assert not done.problems


def test_an_edit_that_keeps_the_count_updates_num_bytes() -> None:
    shards = dict(IN_STEP, **{"toy-test.tfrecord-00000-of-00001": F(3, 310)})
    got, _ = follow(BOTH, shards, changed={"toy-test.tfrecord-00000-of-00001"})
    assert got["splits"][1]["shardLengths"] == ["3"] and got["splits"][1]["numBytes"] == "310"
    assert got["splits"][0] == TRAIN


def test_without_a_commit_num_bytes_follows_only_changed_lengths() -> None:
    """repair passes no ``changed``: a split whose lengths hold keeps what its file says."""
    shards = dict(IN_STEP, **{"toy-test.tfrecord-00000-of-00001": F(3, 310)})
    got, done = follow(BOTH, shards)
    assert got == BOTH and not done.changes


def test_stale_lengths_are_put_right_by_a_commit_of_another_shard() -> None:
    """A crash between a shard's rename and the metadata: the next commit in the folder fixes it."""
    shards = dict(IN_STEP, **{"toy-train.tfrecord-00000-of-00002": F(7, 350)})   # committed, not recorded
    got, _ = follow(BOTH, shards, changed={"toy-train.tfrecord-00001-of-00002"})
    assert got["splits"][0]["shardLengths"] == ["7", "5"] and got["splits"][0]["numBytes"] == "600"


def test_ints_stay_ints() -> None:
    doc = info(split("train", [5, 5], 500))
    shards = {"toy-train.tfrecord-00000-of-00002": F(4, 200), "toy-train.tfrecord-00001-of-00002": F(5, 250)}
    got, _ = follow(doc, shards, changed={"toy-train.tfrecord-00000-of-00002"})
    assert got["splits"][0]["shardLengths"] == [4, 5] and got["splits"][0]["numBytes"] == 450


def test_shards_renamed_to_a_new_count_are_listed() -> None:
    """A third shard is added as TFDS would name it: all three named -of-00003."""
    shards = {f"toy-train.tfrecord-0000{i}-of-00003": F(i + 1, 10 * (i + 1)) for i in range(3)}
    shards["toy-test.tfrecord-00000-of-00001"] = F(3, 300)
    changed = set(shards) | {"toy-train.tfrecord-00000-of-00002", "toy-train.tfrecord-00001-of-00002"}
    got, done = follow(BOTH, shards, changed)
    assert got["splits"][0]["shardLengths"] == ["1", "2", "3"] and got["splits"][0]["numBytes"] == "60"
    assert done.changes == ["split 'train': 2 -> 3 shards, 10 -> 6 records, numBytes 500 -> 60"]
    assert not done.problems


def test_a_shard_removed_with_the_rest_renamed_is_listed() -> None:
    shards = {"toy-train.tfrecord-00000-of-00001": F(5, 250), "toy-test.tfrecord-00000-of-00001": F(3, 300)}
    changed = {"toy-train.tfrecord-00000-of-00001", "toy-train.tfrecord-00000-of-00002",
               "toy-train.tfrecord-00001-of-00002"}
    got, done = follow(BOTH, shards, changed)
    assert got["splits"][0]["shardLengths"] == ["5"] and got["splits"][0]["numBytes"] == "250"
    assert not done.problems


def test_a_shard_added_beside_names_of_another_count_is_reported() -> None:
    """-00002-of-00003 beside two -of-00002: TFDS could not find it (nor, if listed, the other two)."""
    new = "toy-train.tfrecord-00002-of-00003"
    shards = dict(IN_STEP, **{new: F(4, 40), "toy-train.tfrecord-00000-of-00002": F(6, 300)})
    got, done = follow(BOTH, shards, changed={new, "toy-train.tfrecord-00000-of-00002"})
    train = got["splits"][0]
    assert train["shardLengths"] == ["6", "5"] and train["numBytes"] == "550"   # the listed ones follow
    assert len(done.problems) == 1
    assert new in done.problems[0] and "not listed" in done.problems[0]
    assert "toy-train.tfrecord-00000-of-00003 .. toy-train.tfrecord-00002-of-00003" in done.problems[0]


def test_a_shard_removed_from_a_counted_split_is_reported() -> None:
    gone = "toy-train.tfrecord-00001-of-00002"
    shards = {k: v for k, v in IN_STEP.items() if k != gone}
    got, done = follow(BOTH, shards, changed={gone})
    assert got == BOTH                       # lengths of what is there hold; numBytes cannot be known
    assert len(done.problems) == 1 and gone in done.problems[0] and "removed but still listed" in done.problems[0]
    assert "toy-train.tfrecord-00000-of-00001" in done.problems[0]           # the name that would fit


def test_all_shards_of_a_split_removed_is_reported() -> None:
    shards = {"toy-test.tfrecord-00000-of-00001": F(3, 300)}
    got, done = follow(BOTH, shards, changed=set(IN_STEP) - set(shards))
    assert got == BOTH
    assert len(done.problems) == 1 and "split 'train'" in done.problems[0]


def test_a_name_outside_every_template_is_reported_when_committed() -> None:
    shards = dict(IN_STEP, **{"extra.tfrecord": F(2, 20), "toy-train.tfrecord-0000-of-0002": F(1, 1)})
    got, done = follow(BOTH, shards, changed={"extra.tfrecord", "toy-train.tfrecord-0000-of-0002"})
    assert got == BOTH
    assert len(done.problems) == 1
    assert "extra.tfrecord" in done.problems[0] and "toy-train.tfrecord-0000-of-0002" in done.problems[0]
    assert "fits no split's filepathTemplate" in done.problems[0]
    # A commit elsewhere in the folder does not report them again.
    _, done = follow(BOTH, shards, changed={"toy-test.tfrecord-00000-of-00001"})
    assert not done.problems


def test_a_partial_copy_follows_what_is_there() -> None:
    """Three of 1024 shards copied here: their lengths follow; nothing is reported."""
    doc = info(split("train", ["10"] * 1024, "99999"))
    shards = {f"toy-train.tfrecord-{i:05d}-of-01024": F(9, 90) for i in range(3)}
    got, done = follow(doc, shards, changed={"toy-train.tfrecord-00001-of-01024"})
    assert got["splits"][0]["shardLengths"] == ["9"] * 3 + ["10"] * 1021
    assert got["splits"][0]["numBytes"] == "99999"
    assert not done.problems


def test_a_split_with_no_shard_here_is_left_alone() -> None:
    """The public MNIST folder holds the test shard only; train stays as listed."""
    got, done = follow(BOTH, {"toy-test.tfrecord-00000-of-00001": F(2, 200)},
                       changed={"toy-test.tfrecord-00000-of-00001"})
    assert got["splits"][0] == TRAIN and got["splits"][1]["shardLengths"] == ["2"]
    assert not done.problems


def test_index_template_grows_and_shrinks_by_the_commit() -> None:
    doc = info(split("train", ["5", "5"], "100", INDEXED))
    names = [f"toy-train.tfrecord-{i:05d}" for i in range(3)]
    got, done = follow(doc, {n: F(5, 50) for n in names}, changed={names[2]})
    assert got["splits"][0]["shardLengths"] == ["5", "5", "5"] and not done.problems
    got, done = follow(doc, {names[0]: F(5, 50)}, changed={names[1]})
    assert got["splits"][0]["shardLengths"] == ["5"] and not done.problems
    # ... but not because a shard is missing here: that may be a partial copy.
    got, done = follow(doc, {names[0]: F(4, 40)}, changed={names[0]})
    assert got["splits"][0]["shardLengths"] == ["4", "5"] and not done.problems
    # A gap cannot be listed.
    doc3 = info(split("train", ["5", "5", "5"], "150", INDEXED))
    got, done = follow(doc3, {names[0]: F(5, 50), names[2]: F(5, 50)}, changed={names[1]})
    assert got == doc3 and len(done.problems) == 1 and "removed but still listed" in done.problems[0]


def test_other_templates() -> None:
    count = "{SPLIT}-{SHARD_INDEX}-of-{NUM_SHARDS}.{FILEFORMAT}"
    doc = info(split("train", ["1"], "1", count), split("val", ["1"], "1", "{SPLIT}/{SHARD_INDEX}.tfrecord"))
    shards = {"train-00000-of-00002.tfrecord": F(2, 2), "train-00001-of-00002.tfrecord": F(3, 3)}
    got, done = follow(doc, shards, changed=set(shards) | {"train-00000-of-00001.tfrecord"})
    assert got["splits"][0]["shardLengths"] == ["2", "3"] and not done.problems
    assert got["splits"][1] == doc["splits"][1]     # a template naming sub-folders is left to TFDS


def test_more_shards_than_five_digits() -> None:
    doc = info(split("train", ["1"] * 100000, "1"))
    shards = {f"toy-train.tfrecord-{i:06d}-of-100001": F(1, 1) for i in range(100001)}
    got, done = follow(doc, shards, changed={"toy-train.tfrecord-100000-of-100001"})
    assert len(got["splits"][0]["shardLengths"]) == 100001 and not done.problems


def test_not_a_tfds_file_is_left_alone() -> None:
    for doc in ({"shards": {"a.tfrecord": {"records": 3}}}, {"splits": "x"}, {"splits": [{"name": "train"}]}):
        got, done = follow(doc, {"a.tfrecord": F(2, 2)}, changed={"a.tfrecord"})
        assert got == doc and not done.changes and not done.problems


def test_place() -> None:
    assert tfds.place(BOTH, "toy-train.tfrecord-00001-of-00002") == (BOTH["splits"][0], 1)
    assert tfds.place(BOTH, "toy-train.tfrecord-00002-of-00003") is None
    assert tfds.place(BOTH, "toy-train.tfrecord-1-of-2") is None


# --- figures of an index ----------------------------------------------------------------------

def _index(offsets: list[int], ends: dict[int, int] | None = None) -> ShardIndex:
    shard = ShardFile(path="/x", relpath="x", compression=tfrecord.NONE, size=offsets[-1], mtime_ns=0)
    return ShardIndex(shard, "/x", array("Q", offsets), "example", ends=ends or {})


def test_figures_of_an_index() -> None:
    o = tfrecord.OVERHEAD
    assert tfds.figures_of(_index([0])) == F(0, 0)
    assert tfds.figures_of(_index([0, o + 10, 2 * o + 30])) == F(2, 30)
    # A gap of 7 bytes after record 0 (damage) is not data.
    assert tfds.figures_of(_index([0, o + 10 + 7, 2 * o + 37], {0: o + 10})) == F(2, 30)


# --- the file ------------------------------------------------------------------------------

def test_update_writes_like_a_shard_and_keeps_the_mode(tmp_path: Path) -> None:
    path = tmp_path / tfds.INFO
    path.write_text(json.dumps(BOTH))
    path.chmod(0o644)
    shards = dict(IN_STEP, **{"toy-train.tfrecord-00001-of-00002": F(3, 170)})
    calls: list[tuple[str, str]] = []
    durable.fault_hook = lambda op, p: calls.append((op, os.path.basename(p)))
    try:
        lines = tfds.update(str(tmp_path), shards, {"toy-train.tfrecord-00001-of-00002"}, label="v1/dataset_info.json")
    finally:
        durable.fault_hook = None
    assert lines == ["v1/dataset_info.json: split 'train': 1 shard length changed, 10 -> 8 records, "
                     "numBytes 500 -> 420"]
    assert json.loads(path.read_text())["splits"][0]["shardLengths"] == ["5", "3"]
    assert path.stat().st_mode & 0o777 == 0o644
    ops = [op for op, _ in calls]
    assert ops == ["write", "fsync", "rename", "fsync"] and calls[2][1] == tfds.INFO
    assert sorted(os.listdir(tmp_path)) == [tfds.INFO]


def test_update_that_cannot_write_says_so(tmp_path: Path) -> None:
    path = tmp_path / tfds.INFO
    path.write_text(json.dumps(BOTH))

    def fail(op: str, p: str) -> None:
        if op == "rename":
            raise OSError(28, "No space left on device")
    durable.fault_hook = fail
    try:
        lines = tfds.update(str(tmp_path), dict(IN_STEP, **{"toy-test.tfrecord-00000-of-00001": F(1, 1)}),
                            {"toy-test.tfrecord-00000-of-00001"})
    finally:
        durable.fault_hook = None
    assert len(lines) == 1 and "not updated (No space left on device)" in lines[0]
    assert json.loads(path.read_text()) == BOTH
    assert not [n for n in os.listdir(tmp_path) if n.startswith(TMP_PREFIX)]


def test_update_of_an_unreadable_or_missing_file(tmp_path: Path) -> None:
    assert tfds.update(str(tmp_path), IN_STEP, set(IN_STEP)) == []
    (tmp_path / tfds.INFO).write_text("{not json")
    lines = tfds.update(str(tmp_path), IN_STEP, set(IN_STEP))
    assert len(lines) == 1 and "not updated: cannot read it" in lines[0]
    assert (tmp_path / tfds.INFO).read_text() == "{not json"


# --- a commit (in process, no FUSE) ---------------------------------------------------------

def example(i: int) -> bytes:
    ex = proto.Example()
    ex.features.feature["n"].int64_list.value.append(i)
    return ex.SerializeToString()


def write_shard(path: Path, records: list[bytes]) -> None:
    with open(path, "wb") as f:
        w = tfrecord.StreamWriter(f, tfrecord.NONE)
        for r in records:
            w.write(r)
        w.close()


def toy(root: Path) -> None:
    """Two splits of two shards each, and their dataset_info.json, as TFDS writes them."""
    root.mkdir()
    doc = info()
    for name, start in (("train", 0), ("test", 100)):
        lengths = []
        for k in range(2):
            recs = [example(start + 10 * k + i) for i in range(5)]
            write_shard(root / f"toy-{name}.tfrecord-{k:05d}-of-00002", recs)
            lengths.append(str(len(recs)))
        total = sum(len(example(start + 10 * k + i)) for k in range(2) for i in range(5))
        doc["splits"].append(split(name, lengths, str(total)))
    (root / tfds.INFO).write_text(json.dumps(doc, indent=2))


def shard_figures(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for p in sorted(root.glob("toy-*")):
        recs = reference.written_records(p)
        out[p.name] = (len(recs), sum(map(len, recs)))
    return out


def test_commit_updates_dataset_info(tmp_path: Path) -> None:
    root, cache = tmp_path / "toy", tmp_path / "cache"
    toy(root)
    s = Session(root, cache)
    try:
        for call in s.rm_r_calls("toy-train.tfrecord-00001-of-00002/000003"):
            s.do(call)
        s.mkdir("toy-test.tfrecord-00000-of-00002/zz")
        s.write("toy-test.tfrecord-00000-of-00002/zz/n.json", b"[7]")
        s.mkdir("extra.tfrecord")
        s.mkdir("extra.tfrecord/a")
        s.write("extra.tfrecord/a/n.json", b"[1]")
        s.mount.commit()
        result = s.mount.last_commit
        assert result is not None and result.ok
        # What the mount shows of the file is the new file.
        node = s.tree.lookup(tfds.INFO)
        assert s.tree.open(node).read(1 << 20, 0) == (root / tfds.INFO).read_bytes()
    finally:
        s.close()
    doc = json.loads((root / tfds.INFO).read_text())
    got = shard_figures(root)
    for sp in doc["splits"]:
        names = [f"toy-{sp['name']}.tfrecord-{k:05d}-of-00002" for k in range(2)]
        assert sp["shardLengths"] == [str(got[n][0]) for n in names]
        assert sp["numBytes"] == str(sum(got[n][1] for n in names))
    assert doc["splits"][0]["shardLengths"] == ["5", "4"] and doc["splits"][1]["shardLengths"] == ["6", "5"]
    assert len(result.notes) == 3, result.notes
    assert result.notes[0].startswith(f"{tfds.INFO}: split 'train': 1 shard length changed")
    assert result.notes[1].startswith(f"{tfds.INFO}: split 'test': 1 shard length changed")
    assert result.notes[2].startswith(f"{tfds.INFO}: extra.tfrecord: fits no split's filepathTemplate")


def test_a_failed_commit_updates_the_metadata_of_what_it_committed(tmp_path: Path) -> None:
    """The second shard's commit fails (EIO at its rename): the first stays committed, and so does
    the metadata of it."""
    root, cache = tmp_path / "toy", tmp_path / "cache"
    toy(root)
    second = root / "toy-train.tfrecord-00001-of-00002"

    def fail(op: str, path: str) -> None:
        if op == "rename" and path == str(second):
            raise OSError(5, "Input/output error")
    s = Session(root, cache)
    try:
        for rec in ("toy-train.tfrecord-00000-of-00002/000000", "toy-train.tfrecord-00001-of-00002/000000"):
            for call in s.rm_r_calls(rec):
                s.do(call)
        durable.fault_hook = fail
        with pytest.raises(OSError):
            s.mount.commit()
        result = s.mount.last_commit
    finally:
        durable.fault_hook = None
        s.close()
    assert result is not None and not result.ok
    assert len(result.notes) == 1
    assert result.notes[0].startswith(f"{tfds.INFO}: split 'train': 1 shard length changed, 10 -> 9 records")
    assert json.loads((root / tfds.INFO).read_text())["splits"][0]["shardLengths"] == ["4", "5"]
    assert len(reference.written_records(second)) == 5


CRASHED = 86


def _stage_and_commit(root: Path, cache: Path, hook) -> None:
    s = Session(root, cache)
    try:
        for call in s.rm_r_calls("toy-train.tfrecord-00000-of-00002/000000"):
            s.do(call)
        durable.fault_hook = hook
        s.mount.commit()
    finally:
        durable.fault_hook = None
        s.close()


def _commit_dying_at(n: int, root: Path, cache: Path) -> None:
    """Commit in a forked child that dies (``os._exit``: no handler runs, as with ``kill -9``) at
    its ``n``-th durable call."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            seen = [0]

            def die(op: str, path: str) -> None:
                seen[0] += 1
                if seen[0] == n:
                    os._exit(CRASHED)
            _stage_and_commit(root, cache, die)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == CRASHED, status


def test_a_crash_while_writing_the_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The metadata is written after the shards; a crash at each of its durable steps leaves the old
    file or the new one, whole, and the next commit in the folder brings a stale one in step."""
    monkeypatch.setattr(durable.os, "fsync", lambda fd: None)   # crashes, not power loss: fsync is free
    calls: list[tuple[str, str]] = []
    toy(tmp_path / "probe")
    _stage_and_commit(tmp_path / "probe", tmp_path / "probe-cache", lambda op, path: calls.append((op, path)))
    # The commit's last four durable calls write the metadata: its temporary file, fsync, rename, folder.
    assert [op for op, _ in calls[-4:]] == ["write", "fsync", "rename", "fsync"]
    assert calls[-2][1].endswith(tfds.INFO)
    for n in range(len(calls) - 3, len(calls) + 1):
        root, cache = tmp_path / f"toy{n}", tmp_path / f"cache{n}"
        toy(root)
        before = (root / tfds.INFO).read_bytes()
        _commit_dying_at(n, root, cache)
        assert shard_figures(root)["toy-train.tfrecord-00000-of-00002"][0] == 4     # the shard is committed
        now = (root / tfds.INFO).read_bytes()
        assert now == before or json.loads(now)["splits"][0]["shardLengths"] == ["4", "5"], n
        s = Session(root, cache)
        try:
            s.write("toy-train.tfrecord-00001-of-00002/000000/n.json", b"[12345]")
            s.mount.commit()
        finally:
            s.close()
        doc = json.loads((root / tfds.INFO).read_text())
        got = shard_figures(root)
        assert doc["splits"][0]["shardLengths"] == ["4", "5"], n
        assert doc["splits"][0]["numBytes"] == str(got["toy-train.tfrecord-00000-of-00002"][1]
                                                   + got["toy-train.tfrecord-00001-of-00002"][1]), n
