"""A billion records: the dataset manifest, indexes loaded per shard touched and dropped again
within ``--index-memory``, shipped indexes checked, and commits keeping them in step (SPEC 1.2)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import crc32c
import pytest

from conftest import run_tfrfs
from support import reference
from support.daemons import daemon_pid
from tfrfs.index import idxfile
from tfrfs.index import manifest

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from test_index import example, write_shard  # noqa: E402

pytestmark = pytest.mark.mount

RECORDS = 300


def ident(path: Path) -> int:
    return json.loads(path.read_text())[0]


def make_dataset(root: Path, folders: dict[str, int]) -> dict[str, int]:
    """Shards of ``RECORDS`` Examples {id} in each folder; the first id of each shard, by path."""
    firsts = {}
    n = 0
    for folder, shards in folders.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for s in range(shards):
            rel = os.path.join(folder, f"part-{s:05d}-of-{shards:05d}.tfrecord")
            write_shard(root / rel, [example(id=n * 10_000 + i) for i in range(RECORDS)])
            firsts[rel] = n * 10_000
            n += 1
    (root / "dataset_info.json").write_text("{}\n")
    return firsts


def index_beside(root: Path, cache: Path) -> None:
    proc = run_tfrfs("index", str(root), "--beside", "--cache-dir", str(cache))
    assert proc.returncode == 0, proc.stderr
    assert "wrote the dataset's manifest" in proc.stdout


def open_paths(pid: int) -> set[str]:
    """Files the daemon has open or mapped now."""
    fds = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            fds.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    with open(f"/proc/{pid}/maps") as f:
        maps = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    return fds | maps


def under(paths: set[str], root: Path) -> set[str]:
    return {os.path.relpath(p, root) for p in paths if p.startswith(str(root) + "/")}


def error_reasons(mnt: Path) -> dict[str, str]:
    out = {}
    for line in (mnt / ".tfrfs" / "errors").read_text().splitlines():
        e = json.loads(line)
        out[e["shard"]] = e["reason"]
    return out


def test_a_mount_from_the_manifest_opens_a_shard_only_when_a_record_of_it_is_looked_up(
        tmp_path: Path, tfrfs_mount) -> None:
    root = tmp_path / "ds"
    firsts = make_dataset(root, {"train": 3, "test": 2})
    index_beside(root, tmp_path / "indexer")
    assert (root / manifest.NAME).stat().st_mode & 0o444 == 0o444, "readable by everyone who reads the shards"
    mnt = tfrfs_mount(root)   # another cache: only the manifest and the index files beside the shards help
    pid = daemon_pid(mnt)
    assert "from its manifest" in tfrfs_mount.log_text(mnt)
    assert sorted(os.listdir(mnt)) == ["dataset_info.json", "test", "train"], "the manifest itself is not shown"
    assert len(os.listdir(mnt / "train" / "part-00001-of-00003.tfrecord")) == RECORDS
    assert not under(open_paths(pid), root), "listing a shard folder needs neither the shard nor its index"
    assert ident(mnt / "train" / "part-00001-of-00003.tfrecord" / "000123" / "id.json") == \
        firsts["train/part-00001-of-00003.tfrecord"] + 123
    touched = under(open_paths(pid), root)
    assert touched == {"train/part-00001-of-00003.tfrecord",
                       "train/part-00001-of-00003.tfrecord" + idxfile.SUFFIX}, touched
    assert not (tmp_path / "cache" / "index").exists() or not os.listdir(tmp_path / "cache" / "index"), \
        "a local index file beside its shard is read in place, not copied into the cache"
    assert (mnt / ".tfrfs" / "errors").read_text() == ""
    schema = json.loads((mnt / ".tfrfs" / "schema.json").read_text())
    assert schema["features"]["id"]["records"] == 5 * RECORDS


def test_what_differs_from_the_manifest_is_shown_as_it_is_on_disk_and_reported(
        tmp_path: Path, tfrfs_mount) -> None:
    root = tmp_path / "ds"
    make_dataset(root, {"train": 3})
    index_beside(root, tmp_path / "indexer")
    train = root / "train"
    # Deleted; of another size; added (a shard, a plain file, a folder with a shard).
    (train / "part-00000-of-00003.tfrecord").unlink()
    write_shard(train / "part-00001-of-00003.tfrecord", [example(id=777_000 + i) for i in range(RECORDS - 1)])
    write_shard(train / "extra.tfrecord", [example(id=888_000 + i) for i in range(5)])
    (train / "notes.txt").write_text("new\n")
    (root / "later").mkdir()
    write_shard(root / "later" / "more.tfrecord", [example(id=999_000)])
    mnt = tfrfs_mount(root)
    assert sorted(os.listdir(mnt)) == ["dataset_info.json", "later", "train"]
    assert sorted(n for n in os.listdir(mnt / "train") if not n.endswith(idxfile.SUFFIX)) == \
        ["extra.tfrecord", "notes.txt", "part-00001-of-00003.tfrecord", "part-00002-of-00003.tfrecord"]
    resized = mnt / "train" / "part-00001-of-00003.tfrecord"
    assert len(os.listdir(resized)) == RECORDS - 1
    assert ident(resized / "000007" / "id.json") == 777_007
    assert ident(mnt / "train" / "extra.tfrecord" / "000004" / "id.json") == 888_004
    assert ident(mnt / "later" / "more.tfrecord" / "000000" / "id.json") == 999_000
    assert (mnt / "train" / "notes.txt").read_text() == "new\n"
    reasons = error_reasons(mnt)
    assert "not on disk" in reasons["train/part-00000-of-00003.tfrecord"]
    assert "size" in reasons["train/part-00001-of-00003.tfrecord"]
    assert "not in the manifest" in reasons["train/extra.tfrecord"]
    assert "not in the manifest" in reasons["later"]
    assert "part-00002-of-00003.tfrecord" not in " ".join(reasons), "what matches is not reported"
    log = tfrfs_mount.log_text(mnt)
    assert "train/part-00000-of-00003.tfrecord: differs from .tfrfs-manifest: named by the manifest but not on disk" \
        in log
    # Reported once, however often the folder is listed.
    os.listdir(mnt / "train")
    assert len(error_reasons(mnt)) == len(reasons)
    assert tfrfs_mount.log_text(mnt).count("not on disk") == 1


def test_an_index_is_dropped_and_loaded_again_under_index_memory_pressure_while_files_of_it_are_open(
        tmp_path: Path, tfrfs_mount) -> None:
    root = tmp_path / "ds"
    firsts = make_dataset(root, {"": 6})
    index_beside(root, tmp_path / "indexer")
    # Room for one shard's offsets (300 records: 1.2 KB): touching another drops the last one.
    mnt = tfrfs_mount(root, "--index-memory", "2K")
    pid = daemon_pid(mnt)
    shards = sorted(firsts)
    first = mnt / shards[0]
    held = [open(first / f"{i:06d}" / "id.json", "rb") for i in (1, 150, 299)]
    try:
        for rel in shards[1:]:
            for i in (0, 299, 77):
                assert ident(mnt / rel / f"{i:06d}" / "id.json") == firsts[rel] + i
        mapped = {p for p in open_paths(pid) if p.endswith(idxfile.SUFFIX)}
        assert len(mapped) <= 2, f"offsets of at most the last shards touched stay mapped: {sorted(mapped)}"
        for f, i in zip(held, (1, 150, 299)):
            f.seek(0)
            assert json.loads(f.read()) == [firsts[shards[0]] + i], "open files read on while their index is dropped"
        for i in range(0, RECORDS, 37):   # loaded again
            assert ident(first / f"{i:06d}" / "id.json") == firsts[shards[0]] + i
    finally:
        for f in held:
            f.close()
    assert (mnt / ".tfrfs" / "errors").read_text() == ""


def rewrite_same_size_and_count(path: Path, count: int) -> list[bytes]:
    """Another version of a shard: as many records and bytes, and (for the second case) the same
    modification time; five bytes moved from the first record to the middle one."""
    old = [example(id=i) for i in range(count)]
    lengths = [len(r) for r in old]
    lengths[0] -= 5
    lengths[count // 2] += 5
    new = [bytes([65 + i % 26]) * n for i, n in enumerate(lengths)]
    size = path.stat().st_size
    write_shard(path, new)
    assert path.stat().st_size == size
    return new


@pytest.mark.parametrize("same_time", [False, True], ids=["new-mtime", "same-mtime"])
@pytest.mark.parametrize("with_manifest", [False, True], ids=["listed", "manifest"])
def test_a_stale_shipped_index_is_rejected(tmp_path: Path, tfrfs_mount, same_time: bool,
                                           with_manifest: bool) -> None:
    root = tmp_path / "ds"
    root.mkdir()
    shard = root / "data.tfrecord"
    write_shard(shard, [example(id=i) for i in range(40)])
    index_beside(root, tmp_path / "indexer")
    st = shard.stat()
    new = rewrite_same_size_and_count(shard, 40)
    if same_time:
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    mnt = tfrfs_mount(root, *(() if with_manifest else ("--no-manifest",)))
    names = sorted(os.listdir(mnt / "data.tfrecord"))
    assert len(names) == 40
    # The new records do not parse as Examples: the shard is raw now, each record a .bin file
    # of its own bytes; the old index would have cut them at the old places.
    for i in (0, 1, 20, 39):
        assert (mnt / "data.tfrecord" / f"{i:06d}.bin").read_bytes() == new[i]
    log = tfrfs_mount.log_text(mnt)
    why = "does not check" if same_time else ("another version of the shard" if not with_manifest else
                                              "changed since the manifest")
    assert why in log, log[-3000:]


def test_commit_keeps_the_shipped_indexes_and_the_manifest_in_step(tmp_path: Path, tfrfs_mount) -> None:
    root = tmp_path / "ds"
    firsts = make_dataset(root, {"": 2})
    index_beside(root, tmp_path / "indexer")
    shards = sorted(firsts)
    rw = tfrfs_mount(root, "--rw")
    (rw / shards[1] / "000005" / "id.json").write_text("[42]\n")
    os.rename(rw / shards[1] / "000009", rw / shards[1] / "000300")   # a new place: still 300 records
    shutil.rmtree(rw / shards[0] / "000000")
    proc = run_tfrfs("umount", str(rw))
    assert proc.returncode == 0, proc.stderr
    body = json.loads((root / manifest.NAME).read_text())
    entries = {e["path"]: e for e in body["shards"]}
    for rel, count in ((shards[0], RECORDS - 1), (shards[1], RECORDS)):
        st = (root / rel).stat()
        data = (root / (rel + idxfile.SUFFIX)).read_bytes()
        meta, offsets = reference.read_index_file(data)    # the test suite's own reader
        assert (meta["size"], meta["count"]) == (st.st_size, count), "the index file beside it follows"
        assert offsets == reference.record_offsets(root / rel), "its offsets are the shard's records'"
        e = entries[rel]
        assert (e["size"], e["count"], e["mtime_ns"]) == (st.st_size, count, st.st_mtime_ns)
        assert e["index"]["crc32c"] == crc32c.crc32c(data) and e["index"]["size"] == len(data)
    mnt = tfrfs_mount(root, "--cache-dir", str(tmp_path / "fresh"))
    assert (mnt / ".tfrfs" / "errors").read_text() == "", "nothing differs from the manifest"
    assert ident(mnt / shards[1] / "000005" / "id.json") == 42
    assert len(os.listdir(mnt / shards[0])) == RECORDS - 1
    assert ident(mnt / shards[0] / "000000" / "id.json") == firsts[shards[0]] + 1


def test_repair_keeps_the_manifest_in_step(tmp_path: Path, tfrfs_mount) -> None:
    root = tmp_path / "ds"
    firsts = make_dataset(root, {"": 2})
    shard = root / sorted(firsts)[0]
    data = bytearray(shard.read_bytes())
    data[500:520] = b"\xff" * 20      # a record's bytes: its data checksum fails
    shard.write_bytes(bytes(data))
    proc = run_tfrfs("index", str(root), "--beside", "--cache-dir", str(tmp_path / "indexer"))
    assert proc.returncode == 1 and "wrote the dataset's manifest" in proc.stdout, proc.stdout + proc.stderr
    proc = run_tfrfs("repair", str(root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    entry = {e["path"]: e for e in json.loads((root / manifest.NAME).read_text())["shards"]}[shard.name]
    st = shard.stat()
    assert (entry["size"], entry["mtime_ns"], entry["problems"]) == (st.st_size, st.st_mtime_ns, [])
    mnt = tfrfs_mount(root, "--cache-dir", str(tmp_path / "fresh"))
    assert (mnt / ".tfrfs" / "errors").read_text() == ""
    assert len(os.listdir(mnt / shard.name)) == entry["count"] == RECORDS - 1
