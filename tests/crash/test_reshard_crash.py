"""``tfrfs reshard`` killed at every durable step (``durable.fault_hook``: the process dies right
there, ``os._exit``, as with ``kill -9``): DEST is absent or complete, never partial under its
final name, and the same command run again completes it with the right records and nothing left
behind. A bucket DEST (loopback S3) publishes its manifest last: one killed before it is reported
as an unfinished reshard by ``verify`` and ``inspect``, and the rerun completes it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tfrfs.storage import durable
from tfrfs.index import manifest
from tfrfs.format import proto
from tfrfs.cli.parser import main
from tfrfs.index.discovery import TMP_PREFIX

from support import reference

CRASHED = 86


def _records() -> list[bytes]:
    out = []
    for i in range(60):
        ex = proto.Example()
        ex.features.feature["n"].int64_list.value.append(i)
        ex.features.feature["blob"].bytes_list.value.append(bytes([i]) * (i * 7))
        out.append(ex.SerializeToString())
    return out


RECORDS = _records()


def _source(root: Path) -> Path:
    root.mkdir(parents=True)
    for s in range(3):
        (root / f"part-{s:05d}-of-00003.tfrecord").write_bytes(
            b"".join(reference.frame(r) for r in RECORDS[s * 20:(s + 1) * 20]))
    return root


def _reshard(src: Path, dest: str, cache: Path, *extra: str) -> int:
    return main(["reshard", str(src), dest, "--shards", "4", "--shuffle", "5", "--workers", "1",
                 "--cache-dir", str(cache), *extra])


@pytest.fixture(autouse=True)
def _free_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    # Crashes, not power loss: the fsyncs still pass through the hook, for free.
    monkeypatch.setattr(durable.os, "fsync", lambda fd: None)


def _count(src: Path, dest: str, cache: Path) -> int:
    calls: list[tuple[str, str]] = []
    durable.fault_hook = lambda op, path: calls.append((op, path))
    try:
        assert _reshard(src, dest, cache) == 0
    finally:
        durable.fault_hook = None
    return len(calls)


def _crash_at(n: int, src: Path, dest: str, cache: Path) -> None:
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
            _reshard(src, dest, cache)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == CRASHED, status


def _records_in(folder: Path) -> list[bytes]:
    """The records of the shards the manifest names, in its order, read by the test suite's own
    reader (which also checks each shard against its manifest entry and shipped index)."""
    return [r for records in reference.manifest_records(folder).values() for r in records]


def test_a_reshard_killed_at_every_step_leaves_dest_absent_or_complete(tmp_path: Path) -> None:
    src = _source(tmp_path / "src")
    cache = tmp_path / "cache"
    want = _records_in_after(src, tmp_path / "want", cache)
    total = _count(src, str(tmp_path / "count"), cache)
    assert total >= 12
    for n in range(1, total + 1):
        dest = tmp_path / f"out{n}"
        where = f"killed at step {n}/{total}"
        _crash_at(n, src, str(dest), cache)
        if dest.exists():
            assert _records_in(dest) == want, f"{where}: DEST is there but not complete"
        assert _reshard(src, str(dest), cache) == 0, where
        assert _records_in(dest) == want, where
        assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in (tmp_path / "want").iterdir()), where
        assert not [p for p in os.listdir(tmp_path) if p.startswith(TMP_PREFIX)], f"{where}: litter beside DEST"
        shutil.rmtree(dest)


def _records_in_after(src: Path, dest: Path, cache: Path) -> list[bytes]:
    assert _reshard(src, str(dest), cache) == 0
    got = _records_in(dest)
    assert sorted(got) == sorted(RECORDS) and got != RECORDS
    return got


def test_a_rerun_keeps_the_shards_of_the_jobs_that_finished(tmp_path: Path) -> None:
    # 16 small new shards on one worker: jobs of 4 shards each, one receipt per job
    # (``FIRST-LAST.json``). Killed after the second job's receipt, and again in the middle of
    # the third job: a rerun writes only the shards of the jobs that had not finished, all of them.
    src = _source(tmp_path / "src")
    cache = tmp_path / "cache"
    args = ("--shards", "16", "--workers", "1", "--cache-dir", str(cache))
    want = tmp_path / "want"
    assert main(["reshard", str(src), str(want), *args]) == 0
    receipts: list[str] = []
    shards: list[str] = []

    def seen(op: str, path: str) -> None:
        name = os.path.basename(path)
        if op != "write":
            return
        (receipts if "receipts" in path and name.endswith(".json") and name[0].isdigit() else shards).append(name)
    durable.fault_hook = seen
    try:
        assert main(["reshard", str(src), str(tmp_path / "count"), *args]) == 0
    finally:
        durable.fault_hook = None
    assert receipts == ["000000-000003.json", "000004-000007.json", "000008-000011.json", "000012-000015.json"]
    new = [n for n in shards if n.endswith(".tfrecord")]
    assert len(new) == 16
    dest = tmp_path / "out"

    def run(die_at: str | None) -> list[str]:
        """The new shards a run writes; with ``die_at``, killed as it writes that file."""
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                def hook(op: str, path: str) -> None:
                    if os.path.basename(path) == die_at:
                        os._exit(CRASHED)
                    if path.endswith(".tfrecord"):
                        with open(tmp_path / "written", "a") as f:
                            f.write(os.path.basename(path) + "\n")
                durable.fault_hook = hook
                code = main(["reshard", str(src), str(dest), *args])
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == (CRASHED if die_at else 0), status
        written = (tmp_path / "written").read_text().split()
        (tmp_path / "written").unlink()
        return written

    assert run(receipts[2]) == new[:12]      # killed as the third job's receipt is written
    assert run(new[9]) == new[8:9]           # ... again, as the third job begins its second shard
    assert run(None) == new[8:]              # the third job whole, then the fourth
    assert _records_in(dest) == _records_in(want)
    assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in want.iterdir())


def test_dest_rules(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = _source(tmp_path / "src")
    cache = tmp_path / "cache"
    (tmp_path / "empty").mkdir()
    assert _reshard(src, str(tmp_path / "empty"), cache) == 0          # an empty folder is filled
    assert _reshard(src, str(tmp_path / "empty"), cache) == 0          # the same again: done already
    assert "already complete" in capsys.readouterr().out
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert _reshard(src, str(tmp_path / "full"), cache) == 2
    assert "not empty" in capsys.readouterr().err
    assert _reshard(src, str(tmp_path / "empty"), cache, "--compression", "gzip") == 2   # another plan
    assert _reshard(src, str(src / "inside"), cache) == 2


# --- a bucket DEST ------------------------------------------------------------------------------

def test_a_bucket_reshard_killed_before_its_manifest_is_reported_unfinished(s3, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    src = _source(tmp_path / "src")
    cache = tmp_path / "cache"
    dest = s3.url("resharded")
    calls: list[str] = []
    durable.fault_hook = lambda op, path: calls.append(path)
    try:
        assert _reshard(src, dest, cache) == 0
    finally:
        durable.fault_hook = None
    assert manifest.NAME in [os.path.basename(p) for p in calls]
    keys = s3.keys("resharded/")
    assert "resharded/" + manifest.NAME in keys and not [k for k in keys if TMP_PREFIX in k]
    assert main(["verify", dest, "--cache-dir", str(tmp_path / "c2")]) == 0
    # Killed just before the manifest: what is there is reported unfinished.
    before = [n for n, p in enumerate(calls, 1) if p.endswith("/" + manifest.NAME)][0]
    dest2 = s3.url("again")
    _crash_at(before, src, dest2, cache)
    keys = s3.keys("again/")
    assert "again/" + manifest.NAME not in keys and "again/.tfrfs-commit-reshard" in keys
    capsys.readouterr()
    (tmp_path / "mnt").mkdir()
    for command in ("verify", "inspect", "mount"):
        extra = [str(tmp_path / "mnt")] if command == "mount" else []
        assert main([command, dest2, *extra, "--cache-dir", str(tmp_path / "c3")]) == 2, command
        err = capsys.readouterr().err
        assert "unfinished reshard" in err and len(err.strip().splitlines()) == 1, err
    assert not os.path.ismount(tmp_path / "mnt")
    assert _reshard(src, dest2, cache) == 0
    assert main(["verify", dest2, "--cache-dir", str(tmp_path / "c4")]) == 0
    got = sorted(k for k in s3.keys("again/") if k.endswith(".tfrecord"))
    assert [s3.get(k) for k in got] == [s3.get(k.replace("again/", "resharded/")) for k in got]
    # The manifest deleted, the marker put back: unfinished again.
    s3.put("again/.tfrfs-commit-reshard", b"{}")
    s3.delete("again/" + manifest.NAME)
    assert main(["verify", dest2, "--cache-dir", str(tmp_path / "c5")]) == 2
