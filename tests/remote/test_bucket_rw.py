"""``tfrfs mount s3://... --rw`` (SPEC 7.1): edits of a bucket prefix are staged locally and
committed through the dataset's manifest. New shard objects go under names no manifest used; the
conditional write of the manifest is the commit; the objects the old version named stay for its
readers until the next commit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import tfrfs
from conftest import run_tfrfs
from tfrfs.format import proto

pytestmark = pytest.mark.mount

SHARD = "train/train-00000-of-00002.tfrecord"
LABEL = f"{SHARD}/000001/image/object/class/label.json"


def _records(source: str | Path, cache: Path) -> dict[str, list[bytes]]:
    """Every shard's records (their stored bytes), read by the library from the manifest."""
    with tfrfs.open(str(source), cache_dir=str(cache)) as d:
        return {s.path: [bytes(d.record(s.path, i)) for i in range(s.records)] for s in d.shards}


def _parsed(records: dict[str, list[bytes]]) -> dict[str, list]:
    out = {}
    for path, recs in records.items():
        msgs = []
        for data in recs:
            m = proto.Example()
            m.ParseFromString(data)
            msgs.append(m)
        out[path] = msgs
    return out


def _manifest(s3, prefix: str = "ds") -> dict:
    return json.loads(s3.get(f"{prefix}/.tfrfs-manifest"))


def _edit(mnt: Path) -> None:
    (mnt / LABEL).write_text("[7, 7]\n")


def _edited(sample: Path, s3, tfrfs_mount, tmp_path: Path) -> tuple[str, Path]:
    """The sample dataset in the bucket under ``ds/``, mounted --rw (cache folder ``cw``) and edited
    (``_edit``): its URL and the mount point."""
    s3.upload_tree(sample, "ds")
    url = s3.url("ds")
    mnt = tfrfs_mount(url, "--rw", "--cache-dir", str(tmp_path / "cw"))
    _edit(mnt)
    return url, mnt


def committed_locally(sample: Path, tfrfs_mount, tmp_path: Path) -> dict[str, list]:
    """What a bucket must come to: the records of a local copy of the sample that took ``_edit``
    and was committed."""
    local = tmp_path / "local"
    shutil.copytree(sample, local)
    mnt = tfrfs_mount(local, "--rw")
    _edit(mnt)
    assert run_tfrfs("umount", str(mnt)).returncode == 0
    return _parsed(_records(local, tmp_path / "lc"))


def test_edit_commit_and_the_bucket_holds_the_local_commit(sample: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    expected = committed_locally(sample, tfrfs_mount, tmp_path)

    s3.upload_tree(sample, "ds")
    before = set(s3.keys("ds/"))
    old_shard = s3.get(f"ds/{SHARD}")
    mnt = tfrfs_mount(s3.url("ds"), "--rw")
    _edit(mnt)
    assert json.loads((mnt / LABEL).read_text()) == [7, 7]       # shown at once
    proc = run_tfrfs("umount", str(mnt))
    assert proc.returncode == 0, proc.stderr

    body = _manifest(s3)
    entry = {e["path"]: e for e in body["shards"]}[SHARD]
    assert entry["object"].startswith(".tfrfs-objects/") and entry["object"].endswith(SHARD)
    assert body["tfrfs_manifest"] == 2 and body["made_by"].startswith("commit:")
    # The old objects stay (a reader of the version before reads them to the end) ...
    assert before <= set(s3.keys("ds/")) and s3.get(f"ds/{SHARD}") == old_shard
    # ... and the version before named them: retired, for the next commit to remove.
    assert SHARD in body["retired"]
    assert _parsed(_records(s3.url("ds"), tmp_path / "bc")) == expected


def test_the_next_commit_removes_what_the_one_before_retired(sample: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    s3.upload_tree(sample, "ds")
    mnt = tfrfs_mount(s3.url("ds"), "--rw")
    _edit(mnt)
    assert run_tfrfs("umount", str(mnt)).returncode == 0
    first = _manifest(s3)
    mnt = tfrfs_mount(s3.url("ds"), "--rw")
    (mnt / LABEL).write_text("[8]\n")
    assert run_tfrfs("umount", str(mnt)).returncode == 0
    second = _manifest(s3)
    keys = set(s3.keys("ds/"))
    assert all(f"ds/{r}" not in keys for r in first["retired"]), "the first commit's retired objects stay"
    held = {e["path"]: e for e in first["shards"]}[SHARD]["object"]
    assert f"ds/{held}" in keys and held in second["retired"]   # the first commit's object: for the next one
    assert _parsed(_records(s3.url("ds"), tmp_path / "c"))[SHARD][1].features.feature[
        "image/object/class/label"].int64_list.value == [8]


def test_a_web_server_stays_read_only(tmp_path: Path) -> None:
    proc = run_tfrfs("mount", "https://127.0.0.1:9/ds", str(tmp_path), "--rw")
    assert proc.returncode == 2 and "read-only" in proc.stderr


OTHER = "train/train-00001-of-00002.tfrecord/000000/image/object/class/label.json"
SAME_SHARD = f"{SHARD}/000002/image/object/class/label.json"


def _label(records: dict[str, list[bytes]], shard: str, i: int) -> list[int]:
    return list(_parsed(records)[shard][i].features.feature["image/object/class/label"].int64_list.value)


def test_two_writers_racing_one_wins_and_the_other_keeps_its_edits(sample: Path, s3, tfrfs_mount,
                                                                    tmp_path: Path) -> None:
    s3.upload_tree(sample, "ds")
    url = s3.url("ds")
    before = _records(url, tmp_path / "c0")
    a = tfrfs_mount(url, "--rw", "--cache-dir", str(tmp_path / "ca"))
    b = tfrfs_mount(url, "--rw", "--cache-dir", str(tmp_path / "cb"))
    (a / LABEL).write_text("[1]\n")
    (b / OTHER).write_text("[2]\n")        # a shard the other writer does not change
    (b / SAME_SHARD).write_text("[3]\n")   # and one it does
    assert run_tfrfs("umount", str(a)).returncode == 0
    won = _manifest(s3)

    proc = run_tfrfs("umount", str(b))
    assert proc.returncode == 1, proc.stderr
    assert "another writer committed" in proc.stderr and SHARD in proc.stderr, proc.stderr
    assert _manifest(s3) == won                                  # nothing of b's is committed
    assert json.loads((b / OTHER).read_text()) == [2]            # its edits are still there
    subprocess.run(["fusermount3", "-u", str(b)], check=True)    # the commit at unmount fails again
    status = run_tfrfs("status", url, "--cache-dir", str(tmp_path / "cb"))
    assert SHARD in status.stdout and "train-00001-of-00002.tfrecord" in status.stdout, status.stdout

    # Mounted again: the edits of the shard nobody else changed apply to the new version; those of
    # the shard the winner changed are set aside, named by shard and record.
    b = tfrfs_mount(url, "--rw", "--cache-dir", str(tmp_path / "cb"), mountpoint=b)
    log = tfrfs_mount.log_text(b)
    assert f"{SHARD}: changed by another commit" in log and "records 2" in log, log
    assert json.loads((b / OTHER).read_text()) == [2]
    assert json.loads((b / LABEL).read_text()) == [1]           # the winner's edit
    assert run_tfrfs("umount", str(b)).returncode == 0
    now = _records(url, tmp_path / "c1")
    assert _label(now, SHARD, 1) == [1] and _label(now, "train/train-00001-of-00002.tfrecord", 0) == [2]
    assert _label(now, SHARD, 2) == _label(before, SHARD, 2)
    aside = list((tmp_path / "cb" / "edits").glob("*/conflicts/*/shards/edit/2"))
    assert len(aside) == 1                                       # nothing lost: set aside whole


def test_a_reader_of_the_old_version_reads_it_to_the_end_while_a_commit_lands(sample: Path, s3, tfrfs_mount,
                                                                             tmp_path: Path) -> None:
    s3.upload_tree(sample, "ds")
    url = s3.url("ds")
    # A first commit gives the prefix its manifest; the reader mounts that version.
    w = tfrfs_mount(url, "--rw", "--cache-dir", str(tmp_path / "cw"))
    (w / OTHER).write_text("[4]\n")
    assert run_tfrfs("umount", str(w)).returncode == 0
    reader = tfrfs_mount(url, "--cache-dir", str(tmp_path / "cr"))
    shard = reader / SHARD
    names = sorted(os.listdir(shard))
    first = (shard / names[0] / "image" / "encoded.jpg").read_bytes()   # reading has begun
    old = {n: (shard / n / "image" / "object" / "class" / "label.json").read_bytes() for n in names}

    w = tfrfs_mount(url, "--rw", "--cache-dir", str(tmp_path / "cw"), mountpoint=w)
    (w / LABEL).write_text("[7, 7]\n")
    shutil.rmtree(w / f"{SHARD}/000000")
    assert run_tfrfs("umount", str(w)).returncode == 0   # committed: a new version of SHARD

    # The reader still reads the version it mounted, every record of it, from the objects that
    # version named (they stay until the next commit).
    assert sorted(os.listdir(shard)) == names
    assert (shard / names[0] / "image" / "encoded.jpg").read_bytes() == first
    for n in names:
        for f in (shard / n).rglob("*"):
            if f.is_file():
                f.read_bytes()
        assert (shard / n / "image" / "object" / "class" / "label.json").read_bytes() == old[n]
    assert (reader / ".tfrfs" / "errors").read_text() == ""
    # A reader that mounts now sees the new version.
    fresh = tfrfs_mount(url, "--cache-dir", str(tmp_path / "cf"))
    assert len(os.listdir(fresh / SHARD)) == len(names) - 1
    assert json.loads((fresh / SHARD / "000000" / "image" / "object" / "class" / "label.json").read_text()) == [7, 7]


def test_the_other_commands_read_a_committed_bucket_by_its_manifest_and_repair_clears_it(
        sample: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    url, mnt = _edited(sample, s3, tfrfs_mount, tmp_path)
    shutil.rmtree(mnt / f"{SHARD}/000000")
    assert run_tfrfs("umount", str(mnt)).returncode == 0
    want = _records(url, tmp_path / "c0")
    assert len(want[SHARD]) == 11
    s3.put("ds/.tfrfs-objects/0000deadbeef0000/train/x.tfrecord", b"an upload no commit named")

    # verify, inspect and index --beside: of the dataset the manifest names, not of the old objects.
    assert run_tfrfs("verify", url, "--cache-dir", str(tmp_path / "c1")).returncode == 0
    inspect = json.loads(run_tfrfs("inspect", url, "--json", "--cache-dir", str(tmp_path / "c2")).stdout)
    assert {s["shard"]: s["records"] for s in inspect["shards"]}[SHARD] == 11
    assert run_tfrfs("index", url, "--beside", "--cache-dir", str(tmp_path / "c3")).returncode == 0
    body = _manifest(s3)
    assert {e["path"]: e for e in body["shards"]}[SHARD]["object"].startswith(".tfrfs-objects/")
    assert _records(url, tmp_path / "c4") == want

    # repair: nothing damaged, and what no version names any more is deleted at once.
    assert SHARD in body["retired"] and f"ds/{SHARD}" in s3.keys("ds/")
    proc = run_tfrfs("repair", url, "--cache-dir", str(tmp_path / "c5"))
    assert proc.returncode == 0, proc.stderr
    keys = set(s3.keys("ds/"))
    assert f"ds/{SHARD}" not in keys and "ds/.tfrfs-objects/0000deadbeef0000/train/x.tfrecord" not in keys
    assert _manifest(s3)["retired"] == []
    assert _records(url, tmp_path / "c6") == want


def test_tfds_metadata_follows_a_bucket_commit_as_a_local_one(s3, tfrfs_mount, tmp_path: Path) -> None:
    from support import jobdata
    from tfrfs.format import tfrecord
    info = {"name": "a", "fileFormat": "tfrecord",
            "splits": [{"name": "train", "numBytes": "1", "shardLengths": ["10", "10"]}]}
    src = tmp_path / "tfds"
    src.mkdir()
    for n in range(2):
        (src / f"a-train.tfrecord-0000{n}-of-00002").write_bytes(
            b"".join(tfrecord.frame(jobdata.example(i)) for i in range(10 * n, 10 * n + 10)))
    (src / "dataset_info.json").write_text(json.dumps(info))
    local = shutil.copytree(src, tmp_path / "local")
    mnt = tfrfs_mount(local, "--rw")
    shutil.rmtree(mnt / "a-train.tfrecord-00000-of-00002" / "000004")
    assert run_tfrfs("umount", str(mnt)).returncode == 0
    expected = json.loads((local / "dataset_info.json").read_text())
    assert expected["splits"][0]["shardLengths"] == ["9", "10"]

    s3.upload_tree(src, "ds")
    mnt = tfrfs_mount(s3.url("ds"), "--rw", "--cache-dir", str(tmp_path / "cw"))
    shutil.rmtree(mnt / "a-train.tfrecord-00000-of-00002" / "000004")
    assert run_tfrfs("umount", str(mnt)).returncode == 0
    body = _manifest(s3)
    held = {f["path"]: f for f in body["files"]}["dataset_info.json"]
    assert held["object"].startswith(".tfrfs-objects/")              # a new object for the new version
    assert json.loads(s3.get("ds/dataset_info.json")) == info         # the old version's, for its readers
    fresh = tfrfs_mount(s3.url("ds"), "--cache-dir", str(tmp_path / "cr"))
    assert json.loads((fresh / "dataset_info.json").read_text()) == expected
    # A manifest written anew (index --beside) keeps naming the commit's object, not the old file.
    assert run_tfrfs("index", s3.url("ds"), "--beside", "--cache-dir", str(tmp_path / "ci")).returncode == 0
    assert {f["path"]: f for f in _manifest(s3)["files"]}["dataset_info.json"] == held
    again = tfrfs_mount(s3.url("ds"), "--cache-dir", str(tmp_path / "cr2"))
    assert json.loads((again / "dataset_info.json").read_text()) == expected


def test_a_shard_left_alone_by_the_next_commit_comes_back_to_its_path(sample: Path, s3, tfrfs_mount,
                                                                      tmp_path: Path) -> None:
    url, mnt = _edited(sample, s3, tfrfs_mount, tmp_path)
    assert run_tfrfs("umount", str(mnt)).returncode == 0
    held = {e["path"]: e for e in _manifest(s3)["shards"]}[SHARD]["object"]
    moved = s3.get(f"ds/{held}")
    # The next commit changes another shard only: SHARD's new bytes are copied (on the store's
    # side) back to its own path, which the commit before retired, and named there again.
    mnt = tfrfs_mount(url, "--rw", "--cache-dir", str(tmp_path / "cw"), mountpoint=mnt)
    (mnt / OTHER).write_text("[4]\n")
    assert json.loads((mnt / LABEL).read_text()) == [7, 7]
    assert run_tfrfs("umount", str(mnt)).returncode == 0
    body = _manifest(s3)
    entry = {e["path"]: e for e in body["shards"]}[SHARD]
    assert "object" not in entry and s3.get(f"ds/{SHARD}") == moved
    assert held in body["retired"] and f"ds/{held}" in s3.keys("ds/")   # for readers of the version before
    want = _records(url, tmp_path / "c0")
    assert _label(want, SHARD, 1) == [7, 7] and _label(want, "train/train-00001-of-00002.tfrecord", 0) == [4]
    fresh = tfrfs_mount(url, "--cache-dir", str(tmp_path / "cr"))
    assert json.loads((fresh / LABEL).read_text()) == [7, 7]
    assert (fresh / ".tfrfs" / "errors").read_text() == ""     # its index file, moved along, is used as it is


def test_a_first_commit_lists_a_compressed_shard_it_never_inflated(sample: Path, s3, tfrfs_mount,
                                                                   tmp_path: Path) -> None:
    # Index files beside the shards and no manifest: a compressed shard's stream is inflated only
    # when one of its records is read, which this mount never does.
    s3.upload_tree(sample, "ds")
    url = s3.url("ds")
    assert run_tfrfs("index", url, "--beside", "--cache-dir", str(tmp_path / "ci")).returncode == 0
    s3.delete("ds/.tfrfs-manifest")
    mnt = tfrfs_mount(url, "--rw", "--cache-dir", str(tmp_path / "cw"))
    _edit(mnt)
    proc = run_tfrfs("umount", str(mnt))
    assert proc.returncode == 0, proc.stderr
    entry = {e["path"]: e for e in _manifest(s3)["shards"]}["tabular.tfrecord.gz"]
    assert "object" not in entry and entry["stream_size"] > entry["size"]
    assert len(_records(url, tmp_path / "c0")["tabular.tfrecord.gz"]) == entry["count"] == 50


def test_a_manifest_write_that_fails_commits_nothing_and_keeps_the_edits(sample: Path, s3, tfrfs_mount,
                                                                         tmp_path: Path) -> None:
    url, mnt = _edited(sample, s3, tfrfs_mount, tmp_path)
    s3.proxy.fail(503, match=".tfrfs-manifest", method="PUT")   # every attempt, retries included
    proc = run_tfrfs("commit", str(mnt))
    assert proc.returncode == 1 and "nothing was committed" in proc.stderr, proc.stderr
    assert ".tfrfs-manifest" not in {k.rsplit("/", 1)[-1] for k in s3.keys("ds/")}
    assert json.loads((mnt / LABEL).read_text()) == [7, 7]       # still staged, still shown
    s3.proxy.clear_faults()
    assert run_tfrfs("umount", str(mnt)).returncode == 0          # the next commit writes it
    assert _label(_records(url, tmp_path / "c0"), SHARD, 1) == [7, 7]


def test_edits_survive_a_killed_daemon_and_discard_drops_them(sample: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    from conftest import daemon_pids, force_unmount, wait_ended
    s3.upload_tree(sample, "ds")
    url, cache = s3.url("ds"), str(tmp_path / "cw")
    before = set(s3.keys("ds/"))
    mnt = tfrfs_mount(url, "--rw", "--cache-dir", cache)
    _edit(mnt)
    for pid in daemon_pids(mnt):
        os.kill(pid, 9)
        wait_ended(pid)
    force_unmount(mnt)
    status = run_tfrfs("status", url, "--cache-dir", cache)
    assert SHARD in status.stdout, status.stdout
    mnt = tfrfs_mount(url, "--rw", "--cache-dir", cache, mountpoint=mnt)
    assert json.loads((mnt / LABEL).read_text()) == [7, 7]        # staged durably, shown again
    assert run_tfrfs("umount", "--discard", str(mnt)).returncode == 0
    assert set(s3.keys("ds/")) == before                          # nothing written to the bucket
    assert "nothing staged" in run_tfrfs("status", url, "--cache-dir", cache).stdout

    mnt = tfrfs_mount(url, "--rw", "--cache-dir", cache, mountpoint=mnt)
    (mnt / OTHER).write_text("[1]\n")
    for pid in daemon_pids(mnt):
        os.kill(pid, 15)
        wait_ended(pid)
    proc = run_tfrfs("discard", url, "--cache-dir", cache)
    assert proc.returncode == 0 and "1 shard" in proc.stdout, proc.stdout
    assert set(s3.keys("ds/")) == before


def test_a_commit_uploads_the_changed_shard_and_its_index_only(sample: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    from remote_support import request_path
    url, mnt = _edited(sample, s3, tfrfs_mount, tmp_path)
    s3.proxy.reset()
    assert run_tfrfs("commit", str(mnt)).returncode == 0
    writes = [r for r in s3.proxy.requests if r.method in ("PUT", "POST", "DELETE")]
    written = {request_path(r).removeprefix("/data/ds/") for r in writes}
    held = {e["path"]: e for e in _manifest(s3)["shards"]}[SHARD]["object"]
    # The new shard (in parts or whole), its index file and the manifest: nothing else is written,
    # and no other shard is copied or read back.
    assert written == {held, held + ".tfrfs-idx", ".tfrfs-manifest"}, sorted(written)
    new = len(s3.get(f"ds/{held}"))
    sent = sum(r.sent for r in writes if request_path(r).endswith(held))
    assert sent == new, (sent, new)
    assert not [r for r in s3.proxy.requests if r.method == "GET" and request_path(r).endswith(held)]
