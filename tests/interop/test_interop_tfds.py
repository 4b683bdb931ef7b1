"""TFDS interop (SPEC 7, "TFDS metadata"): a dataset written by the real ``tensorflow-datasets``
(a tiny ``GeneratorBasedBuilder``: two splits of two shards each), edited in a ``--rw`` mount and
committed, is then loaded by ``tfds.builder_from_directory``: every split lists its shard files
with the records each holds, and ``as_dataset`` reads exactly the records the shards hold.

TFDS is imported only in subprocesses (one to build, one per check): its import takes seconds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tfrfs.format import proto
from tfrfs.format import tfrecord

from conftest import REPO, run_tfrfs

pytestmark = [pytest.mark.tf, pytest.mark.mount]

# Run as ``python -c TFDS_SCRIPT build DIR`` (writes the dataset under DIR, prints its folder) or
# ``... read DIR [SPLIT ...]`` (prints what TFDS sees of each split, as JSON).
TFDS_SCRIPT = r'''
import json, sys
import numpy as np
import tensorflow_datasets as tfds


class Toy(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"n": np.int64, "text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(0, 10), "test": self._generate_examples(100, 6)}

    def _generate_examples(self, start, count):
        for i in range(start, start + count):
            yield f"key{i}", {"n": i, "text": f"record {i}"}


command, folder, *splits = sys.argv[1:]
if command == "build":
    builder = Toy(data_dir=folder)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=2))
    print(builder.data_dir)
else:
    builder = tfds.builder_from_directory(folder)
    out = {}
    for name, split in builder.info.splits.items():
        if splits and name not in splits:
            continue
        rows = list(builder.as_dataset(split=name).as_numpy_iterator())
        out[name] = {"num_examples": split.num_examples, "shard_lengths": list(split.shard_lengths),
                     "num_bytes": split.num_bytes, "filenames": list(split.filenames), "read": len(rows),
                     "n": sorted(int(r["n"]) for r in rows),
                     "text": sorted(r["text"].decode() for r in rows)}
    print(json.dumps(out))
'''


def _need_tfds_and_fuse() -> None:
    for module, package in (("tensorflow", "TensorFlow"), ("tensorflow_datasets", "tensorflow-datasets")):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{package} is not installed")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")


def run_tfds(*args: str) -> str:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", TFDS_SCRIPT, *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise AssertionError(f"tfds {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dataset as TFDS wrote it (built once; each test edits a copy)."""
    _need_tfds_and_fuse()
    folder = Path(run_tfds("build", str(tmp_path_factory.mktemp("tfds"))))
    assert sorted(p.name for p in folder.glob("toy-*")) == [
        "toy-test.tfrecord-00000-of-00002", "toy-test.tfrecord-00001-of-00002",
        "toy-train.tfrecord-00000-of-00002", "toy-train.tfrecord-00001-of-00002"]
    return folder


@pytest.fixture
def dataset(built: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built, tmp_path / "toy" / "1.0.0"))


def records_of(path: Path) -> list[tuple[int, str]]:
    """(n, text) of each record of a shard file, read here without TensorFlow."""
    out = []
    for data in tfrecord.iter_records(path):
        f = proto.Example.FromString(data).features.feature
        out.append((f["n"].int64_list.value[0], f["text"].bytes_list.value[0].decode()))
    return out


def check_in_step(folder: Path, view: dict) -> None:
    """What TFDS sees of each split is what its shard files hold."""
    for name, split in view.items():
        files = [records_of(folder / f) for f in split["filenames"]]
        assert split["shard_lengths"] == [len(f) for f in files], name
        assert split["num_examples"] == split["read"] == sum(map(len, files)), name
        assert split["n"] == sorted(n for f in files for n, _ in f), name
        data = sum(len(r) for f in split["filenames"] for r in tfrecord.iter_records(folder / f))
        assert split["num_bytes"] == data, name


def commit(mnt: Path) -> list[str]:
    """``tfrfs commit``; returns the commit's notes (from ``.tfrfs/commit``)."""
    proc = run_tfrfs("commit", str(mnt))
    assert proc.returncode == 0, proc.stderr       # notes never fail a commit
    return json.loads((mnt / ".tfrfs" / "commit").read_text())["notes"]


def umount(mnt: Path) -> None:
    proc = run_tfrfs("umount", str(mnt))
    assert proc.returncode == 0, proc.stderr


def sh(command: str, cwd: Path) -> None:
    subprocess.run(["sh", "-ec", command], cwd=cwd, check=True, capture_output=True)


TRAIN = "toy-train.tfrecord-0000{}-of-0000{}"
TEST = "toy-test.tfrecord-0000{}-of-0000{}"


def test_edits_are_seen_by_tfds_after_a_commit(dataset: Path, tfrfs_mount) -> None:
    t0, t1, s0, s1 = TRAIN.format(0, 2), TRAIN.format(1, 2), TEST.format(0, 2), TEST.format(1, 2)
    deleted = {records_of(dataset / t0)[i][0] for i in (1, 3)}
    edited = records_of(dataset / s0)[0][0]
    mnt = tfrfs_mount(dataset, "--rw")
    sh(f"rm -r {t0}/000001 {t0}/000003 "                             # records deleted
       f"&& cp -r {t1}/000000 {t1}/new && printf '[1000]' > {t1}/new/n.json "   # one added
       f"&& printf edited > {s0}/000000/text.txt "                   # one edited, same count
       f"&& mkdir {s1}/fresh && printf '[2000]' > {s1}/fresh/n.json "         # one made from nothing
       f"&& printf made > {s1}/fresh/text.txt", mnt)
    notes = commit(mnt)
    # The mount shows the new file.
    assert (mnt / "dataset_info.json").read_bytes() == (dataset / "dataset_info.json").read_bytes()
    umount(mnt)
    view = json.loads(run_tfds("read", str(dataset)))
    check_in_step(dataset, view)
    assert [n.split(":")[:2] for n in notes] == [["dataset_info.json", " split 'train'"],
                                               ["dataset_info.json", " split 'test'"]], notes
    assert view["train"]["shard_lengths"] == [3, 6]
    assert view["train"]["n"] == sorted(set(range(10)) - deleted | {1000})
    assert view["test"]["n"] == sorted(set(range(100, 106)) | {2000})
    assert view["test"]["text"] == sorted({f"record {i}" for i in range(100, 106) if i != edited} | {"edited", "made"})


def test_shards_removed_and_added_by_the_template(dataset: Path, tfrfs_mount) -> None:
    """train: one of two shards removed and the other renamed 0-of-1; test: a third shard added,
    the two others renamed -of-00003 (TFDS finds shards by name, so all names change)."""
    mnt = tfrfs_mount(dataset, "--rw")
    sh(f"rm -r {TRAIN.format(1, 2)} && mv {TRAIN.format(0, 2)} {TRAIN.format(0, 1)} "
       f"&& mkdir {TEST.format(2, 3)} && cp -r {TEST.format(0, 2)}/000000 {TEST.format(2, 3)}/a "
       f"&& mv {TEST.format(0, 2)} {TEST.format(0, 3)} && mv {TEST.format(1, 2)} {TEST.format(1, 3)}", mnt)
    notes = commit(mnt)
    umount(mnt)
    view = json.loads(run_tfds("read", str(dataset)))
    check_in_step(dataset, view)
    assert len(notes) == 2 and "split 'train': 2 -> 1 shards" in notes[0] and "split 'test': 2 -> 3 shards" in notes[1]
    assert view["train"]["filenames"] == [TRAIN.format(0, 1)] and view["train"]["read"] == 5
    assert view["test"]["filenames"] == [TEST.format(i, 3) for i in range(3)] and view["test"]["read"] == 7


def test_shards_that_do_not_fit_are_reported(dataset: Path, tfrfs_mount) -> None:
    """A shard named for 3 beside two named for 2, a shard removed from a split, a shard named
    outside every template: the commit is done, and says what the metadata could not follow."""
    mnt = tfrfs_mount(dataset, "--rw")
    before = json.loads((dataset / "dataset_info.json").read_text())
    sh(f"mkdir {TRAIN.format(2, 3)} extra.tfrecord && cp -r {TRAIN.format(0, 2)}/000000 {TRAIN.format(2, 3)}/a "
       f"&& cp -r {TRAIN.format(0, 2)}/000000 extra.tfrecord/a && rm -r {TEST.format(1, 2)}", mnt)
    notes = commit(mnt)
    assert len(notes) == 3, notes
    assert TRAIN.format(2, 3) in notes[0] and "not listed" in notes[0]
    assert TEST.format(1, 2) in notes[1] and "removed but still listed" in notes[1]
    assert "extra.tfrecord" in notes[2] and "fits no split's filepathTemplate" in notes[2]
    umount(mnt)
    assert json.loads((dataset / "dataset_info.json").read_text()) == before   # nothing it could say
    assert (dataset / TRAIN.format(2, 3)).exists() and not (dataset / TEST.format(1, 2)).exists()
    check_in_step(dataset, json.loads(run_tfds("read", str(dataset), "train")))  # train reads as listed
