"""``tfrfs repair`` is crash-safe (SPEC 6: "by the crash-safe commit path").

At every write, fsync, rename and unlink a repair makes (``durable.fault_hook``), a forked
process either dies right there (``os._exit``, as with ``kill -9``) or the step fails with EIO.
Then: the shard is wholly the damaged original or wholly the repaired shard, a kept original is
whole, a TFDS ``dataset_info.json`` is the old or the new one, never torn, and running repair
again finishes the job with nothing left behind.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from tfrfs import cli
from tfrfs.storage import durable
from tfrfs.format import proto
from tfrfs.edit.repack import TMP_PREFIX

from support import reference

NAME = "toy-train.tfrecord-00000-of-00001"
CRASHED = 86


def _records() -> list[bytes]:
    out = []
    for i in range(40):
        ex = proto.Example()
        ex.features.feature["n"].int64_list.value.append(i)
        ex.features.feature["blob"].bytes_list.value.append(bytes([i]) * 300)
        out.append(ex.SerializeToString())
    return out


RECORDS = _records()
# Framed by the test suite's own writer: REPAIRED below is what a repair must leave, byte for byte.
FRAMES = [reference.frame(r) for r in RECORDS]


def _damaged() -> bytes:
    buf = bytearray(b"".join(FRAMES))
    at = sum(map(len, FRAMES[:10]))
    buf[at + 9] ^= 1                                    # record 10's header
    at = sum(map(len, FRAMES[:20]))
    buf[at + 100] ^= 1                                  # record 20's data
    return bytes(buf)


DAMAGED = _damaged()
REPAIRED = b"".join(f for i, f in enumerate(FRAMES) if i not in (10, 20))
INFO = {"name": "toy", "splits": [{"name": "train", "numBytes": "1", "shardLengths": ["40"]}]}


def _source(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / NAME).write_bytes(DAMAGED)
    (root / "dataset_info.json").write_text(json.dumps(INFO))
    return root


def _repair(root: Path) -> int:
    return cli.main(["repair", str(root)])


def _count_calls(root: Path) -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []
    durable.fault_hook = lambda op, path: calls.append((op, path))
    try:
        assert _repair(root) == 0
    finally:
        durable.fault_hook = None
    return calls


def _crash_at(n: int, root: Path) -> None:
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            count = [0]

            def die(op: str, path: str) -> None:
                count[0] += 1
                if count[0] == n:
                    os._exit(CRASHED)
            durable.fault_hook = die
            _repair(root)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == CRASHED, status


def _check_whole(root: Path, where: str) -> None:
    shard = (root / NAME).read_bytes()
    assert shard in (DAMAGED, REPAIRED), f"{where}: the shard is torn"
    kept = root / ".tfrfs-damaged" / NAME
    if kept.exists():
        assert kept.read_bytes() == DAMAGED, f"{where}: the kept original is torn"
    info = json.loads((root / "dataset_info.json").read_text())
    assert info["splits"][0]["shardLengths"] in (["40"], ["38"]), where
    if shard == DAMAGED:
        assert info["splits"][0]["shardLengths"] == ["40"], f"{where}: metadata ahead of the shard"


def _check_finished(root: Path, where: str) -> None:
    assert _repair(root) == 0, where
    assert (root / NAME).read_bytes() == REPAIRED, where
    assert (root / ".tfrfs-damaged" / NAME).read_bytes() == DAMAGED, where
    assert not list((root / ".tfrfs-damaged").glob(NAME + "~*")), f"{where}: a second backup of the same damage"
    assert json.loads((root / "dataset_info.json").read_text())["splits"][0]["shardLengths"] == ["38"], where
    assert not [p for p in os.listdir(root) if p.startswith((TMP_PREFIX, ".tmp-"))], f"{where}: litter"


@pytest.fixture(autouse=True)
def _free_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    # Crashes and I/O errors, not power loss: the fsyncs still pass through the hook, for free.
    monkeypatch.setattr(durable.os, "fsync", lambda fd: None)


def test_repair_counts_its_durable_steps(tmp_path: Path) -> None:
    calls = _count_calls(_source(tmp_path / "count"))
    ops = [op for op, _ in calls]
    assert {"write", "fsync", "rename"} <= set(ops)
    renamed = [os.path.basename(p) for op, p in calls if op == "rename"]
    assert NAME in renamed and "dataset_info.json" in renamed
    assert renamed.index(NAME) < renamed.index("dataset_info.json")


@pytest.mark.parametrize("mode", ["crash", "error"])
def test_fault_at_every_repair_step(tmp_path: Path, mode: str, capsys: pytest.CaptureFixture) -> None:
    total = len(_count_calls(_source(tmp_path / "count")))
    assert total >= 6
    for n in range(1, total + 1):
        root = _source(tmp_path / f"{mode}{n}")
        where = f"{mode} at step {n}/{total}"
        if mode == "crash":
            _crash_at(n, root)
        else:
            seen = [0]

            def fail(op: str, path: str) -> None:
                seen[0] += 1
                if seen[0] == n:
                    raise OSError(errno.EIO, f"injected fault at {op} {path}")
            durable.fault_hook = fail
            try:
                code = _repair(root)
            finally:
                durable.fault_hook = None
            assert code in (0, 1), where
            err = capsys.readouterr().err
            assert "Traceback" not in err, err
        _check_whole(root, where)
        _check_finished(root, where)
        shutil.rmtree(root)


def test_a_rerun_brings_the_manifest_in_step_after_a_crash_before_it(tmp_path: Path) -> None:
    """Stopped after the shard was replaced, before its manifest entry: the next repair finds
    nothing damaged, and still puts the manifest (and the shard's index file) right."""
    root = _source(tmp_path / "src")
    cache = str(tmp_path / "cache")
    assert cli.main(["index", "--beside", "--cache-dir", cache, str(root)]) == 1   # damaged
    manifest = root / ".tfrfs-manifest"

    def entry() -> dict:
        return json.loads(manifest.read_text())["shards"][0]
    assert entry()["size"] == len(DAMAGED)

    def fail_at_manifest(op: str, path: str) -> None:
        if op == "rename" and path == str(manifest):
            raise OSError(errno.EIO, "injected")
    durable.fault_hook = fail_at_manifest
    try:
        assert cli.main(["repair", "--cache-dir", cache, str(root)]) == 0
    finally:
        durable.fault_hook = None
    assert (root / NAME).read_bytes() == REPAIRED
    assert entry()["size"] == len(DAMAGED)          # the manifest is behind the shard
    assert _repair(root) == 0
    assert entry()["size"] == len(REPAIRED) and entry()["count"] == 38 and not entry()["problems"]
    assert (root / (NAME + ".tfrfs-idx")).stat().st_size == entry()["index"]["size"]
