"""Edits inside ``KEY.list/``, ``KEY.steps/`` and a step's own ``N.list/`` (SPEC 3.2, 4, 7): each
changes the item it names and nothing else. Gaps that a removal leaves stay gaps until a commit
renumbers (SPEC 7, "until a commit, names stay stable"); a folder moved with gaps takes its values
along, and no value is made up for a missing number.

Each test edits a real ``--rw`` mount, checks what the mount shows, commits, and checks the shard's
records as stored (parsed with the message definitions only).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tfrfs.format import proto
from tfrfs.format import tfrecord

from conftest import run_tfrfs
from support import example_pb, reference

pytestmark = [pytest.mark.mount,
              pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse")]


def _jpeg(n: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (2, 2), (40 * n % 256, 255 - 30 * n % 256, 7 * n % 256)).save(buf, format="JPEG")
    return buf.getvalue()


JPEGS = [_jpeg(n) for n in range(9)]
assert len(set(JPEGS)) == len(JPEGS)
A = [[JPEGS[0], JPEGS[1]], [JPEGS[2], JPEGS[3]], [JPEGS[4], JPEGS[5]]]   # 3 steps of 2 images
NEW = JPEGS[6:]


def _sequence_source(tmp_path: Path, steps: list[list[bytes]]) -> Path:
    """One SequenceExample: context ``id``; lists ``frames/jpeg`` (steps of images) and ``n``."""
    seq = proto.SequenceExample()
    seq.context.feature["id"].bytes_list.value.append(b"clip")
    for values in steps:
        seq.feature_lists.feature_list["frames/jpeg"].feature.add().bytes_list.value.extend(values)
    for i in (1, 2):
        seq.feature_lists.feature_list["n"].feature.add().int64_list.value.append(i)
    src = tmp_path / "src"
    src.mkdir()
    (src / "s.tfrecord").write_bytes(tfrecord.frame(seq.SerializeToString()))
    return src


def _example_source(tmp_path: Path, items: list[bytes]) -> Path:
    ex = proto.Example()
    ex.features.feature["items"].bytes_list.value.extend(items)
    ex.features.feature["n"].int64_list.value.append(1)
    src = tmp_path / "src"
    src.mkdir()
    (src / "e.tfrecord").write_bytes(tfrecord.frame(ex.SerializeToString()))
    return src


def _stored(src: Path, shard: str) -> list[Any]:
    """The committed records, read by the test suite's own reader and message classes."""
    cls = example_pb.SequenceExample if shard.startswith("s") else example_pb.Example
    return [cls.FromString(r) for r in reference.written_records(src / shard)]


def _steps(seq: Any, key: str = "frames/jpeg") -> list[list[bytes]]:
    return [list(f.bytes_list.value) for f in seq.feature_lists.feature_list[key].feature]


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``: relative path -> bytes."""
    out = {}
    for dirpath, _, files in os.walk(folder):
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(folder))] = p.read_bytes()
    return out


def _commit(mnt: Path) -> None:
    run_tfrfs("commit", str(mnt), check=True)


def _untouched_rest(seq: Any) -> None:
    """The parts of the SequenceExample no test edits."""
    assert list(seq.context.feature["id"].bytes_list.value) == [b"clip"]
    assert [list(f.int64_list.value) for f in seq.feature_lists.feature_list["n"].feature] == [[1], [2]]


def test_removing_one_image_of_a_step_removes_that_image_only(tmp_path: Path, tfrfs_mount: Any) -> None:
    src = _sequence_source(tmp_path, A)
    mnt = tfrfs_mount(src, "--rw")
    steps = mnt / "s.tfrecord" / "000000" / "feature_lists" / "frames" / "jpeg.steps"
    os.unlink(steps / "1.list" / "0.jpg")
    assert _files(steps) == {"0.list/0.jpg": A[0][0], "0.list/1.jpg": A[0][1], "1.list/1.jpg": A[1][1],
                             "2.list/0.jpg": A[2][0], "2.list/1.jpg": A[2][1]}
    _commit(mnt)
    [seq] = _stored(src, "s.tfrecord")
    assert _steps(seq) == [A[0], [A[1][1]], A[2]]
    _untouched_rest(seq)
    # The commit renumbers: step 1 holds one image, shown as one file.
    assert sorted(_files(steps)) == ["0.list/0.jpg", "0.list/1.jpg", "1.jpg", "2.list/0.jpg", "2.list/1.jpg"]


def test_removing_a_whole_step_keeps_the_others_and_their_names(tmp_path: Path, tfrfs_mount: Any) -> None:
    src = _sequence_source(tmp_path, A)
    mnt = tfrfs_mount(src, "--rw")
    steps = mnt / "s.tfrecord" / "000000" / "feature_lists" / "frames" / "jpeg.steps"
    subprocess.run(["rm", "-r", str(steps / "0.list")], check=True)
    assert sorted(os.listdir(steps)) == ["1.list", "2.list"]
    assert _files(steps) == {"1.list/0.jpg": A[1][0], "1.list/1.jpg": A[1][1],
                             "2.list/0.jpg": A[2][0], "2.list/1.jpg": A[2][1]}
    _commit(mnt)
    [seq] = _stored(src, "s.tfrecord")
    assert _steps(seq) == [A[1], A[2]]
    _untouched_rest(seq)


def test_removing_the_last_image_of_a_step_removes_the_step_its_folder_stays(tmp_path: Path,
                                                                              tfrfs_mount: Any) -> None:
    """As a feature goes with the last file of its KEY.list/, a step goes with the last file of
    its N.list/; the folder stays until rmdir."""
    src = _sequence_source(tmp_path, A)
    mnt = tfrfs_mount(src, "--rw")
    steps = mnt / "s.tfrecord" / "000000" / "feature_lists" / "frames" / "jpeg.steps"
    os.unlink(steps / "1.list" / "0.jpg")
    os.unlink(steps / "1.list" / "1.jpg")
    assert sorted(os.listdir(steps)) == ["0.list", "1.list", "2.list"]
    assert os.listdir(steps / "1.list") == []
    os.rmdir(steps / "1.list")
    _commit(mnt)
    [seq] = _stored(src, "s.tfrecord")
    assert _steps(seq) == [A[0], A[2]]


def test_writing_into_a_steps_own_list(tmp_path: Path, tfrfs_mount: Any) -> None:
    """A file written to an existing number replaces that value; a new number goes in among the
    others of that step; a new N.list/ folder is a new step, among the others by number."""
    src = _sequence_source(tmp_path, A)
    mnt = tfrfs_mount(src, "--rw")
    steps = mnt / "s.tfrecord" / "000000" / "feature_lists" / "frames" / "jpeg.steps"
    (steps / "0.list" / "1.jpg").write_bytes(NEW[0])
    (steps / "1.list" / "5.jpg").write_bytes(NEW[1])
    os.mkdir(steps / "7.list")
    (steps / "7.list" / "0.jpg").write_bytes(NEW[2])
    assert _files(steps) == {"0.list/0.jpg": A[0][0], "0.list/1.jpg": NEW[0],
                             "1.list/0.jpg": A[1][0], "1.list/1.jpg": A[1][1], "1.list/5.jpg": NEW[1],
                             "2.list/0.jpg": A[2][0], "2.list/1.jpg": A[2][1], "7.list/0.jpg": NEW[2]}
    _commit(mnt)
    [seq] = _stored(src, "s.tfrecord")
    assert _steps(seq) == [[A[0][0], NEW[0]], A[1] + [NEW[1]], A[2], [NEW[2]]]
    _untouched_rest(seq)


def test_a_record_with_steps_of_several_images_copies_back_equal(tmp_path: Path, tfrfs_mount: Any) -> None:
    """cp -r (here copytree) makes each step's N.list/ folder and writes its files (SPEC 7)."""
    src = _sequence_source(tmp_path, A)
    mnt = tfrfs_mount(src, "--rw")
    shard = mnt / "s.tfrecord"
    shutil.copytree(shard / "000000", shard / "copy")
    _commit(mnt)
    first, copy = _stored(src, "s.tfrecord")
    assert copy == first


def test_mv_of_a_list_folder_with_gaps_moves_its_values(tmp_path: Path, tfrfs_mount: Any) -> None:
    items = [JPEGS[0], b"\0one", b"\0two", JPEGS[1]]
    src = _example_source(tmp_path, items)
    mnt = tfrfs_mount(src, "--rw")
    rec = mnt / "e.tfrecord" / "000000"
    os.unlink(rec / "items.list" / "1.bin")
    os.rename(rec / "items.list", rec / "moved.list")
    assert sorted(os.listdir(rec)) == ["moved.list", "n.json"]
    assert _files(rec / "moved.list") == {"0.jpg": JPEGS[0], "2.bin": b"\0two", "3.jpg": JPEGS[1]}
    _commit(mnt)
    [ex] = _stored(src, "e.tfrecord")
    assert sorted(ex.features.feature) == ["moved", "n"]
    assert list(ex.features.feature["moved"].bytes_list.value) == [JPEGS[0], b"\0two", JPEGS[1]]


def test_mv_of_an_item_to_a_free_number_makes_up_no_values(tmp_path: Path, tfrfs_mount: Any) -> None:
    items = [JPEGS[0], b"\0one", b"\0two"]
    src = _example_source(tmp_path, items)
    mnt = tfrfs_mount(src, "--rw")
    folder = mnt / "e.tfrecord" / "000000" / "items.list"
    os.rename(folder / "0.jpg", folder / "7.jpg")
    assert _files(folder) == {"1.bin": b"\0one", "2.bin": b"\0two", "7.jpg": JPEGS[0]}
    os.rename(folder / "1.bin", folder / "2.bin")     # over another item: that one is replaced
    assert _files(folder) == {"2.bin": b"\0one", "7.jpg": JPEGS[0]}
    _commit(mnt)
    [ex] = _stored(src, "e.tfrecord")
    assert list(ex.features.feature["items"].bytes_list.value) == [b"\0one", JPEGS[0]]


def test_mv_of_one_step_and_of_a_steps_folder_with_gaps(tmp_path: Path, tfrfs_mount: Any) -> None:
    src = _sequence_source(tmp_path, A)
    mnt = tfrfs_mount(src, "--rw")
    lists = mnt / "s.tfrecord" / "000000" / "feature_lists"
    steps = lists / "frames" / "jpeg.steps"
    os.unlink(steps / "1.list" / "0.jpg")
    os.rename(steps / "0.list", steps / "5.list")     # a step to a new number: it goes last
    assert _files(steps) == {"1.list/1.jpg": A[1][1], "2.list/0.jpg": A[2][0], "2.list/1.jpg": A[2][1],
                             "5.list/0.jpg": A[0][0], "5.list/1.jpg": A[0][1]}
    os.rename(steps, lists / "shots.steps")
    assert sorted(os.listdir(lists)) == ["frames", "n.json", "shots.steps"]    # frames/ stays until rmdir
    assert _files(lists / "shots.steps") == {"1.list/1.jpg": A[1][1], "2.list/0.jpg": A[2][0],
                                             "2.list/1.jpg": A[2][1], "5.list/0.jpg": A[0][0],
                                             "5.list/1.jpg": A[0][1]}
    _commit(mnt)
    [seq] = _stored(src, "s.tfrecord")
    assert sorted(seq.feature_lists.feature_list) == ["n", "shots"]
    assert _steps(seq, "shots") == [[A[1][1]], A[2], A[0]]
    _untouched_rest(seq)
