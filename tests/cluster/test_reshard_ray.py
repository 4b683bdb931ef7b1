"""``tfrfs reshard --ray`` and ``tfrfs.ray.write`` on a Ray cluster started here (``ray_local``):
the same shards, byte for byte, as the local pool and one process; a Ray worker killed with
``kill -9`` while the jobs run changes nothing; the sink gives back the records it was given, in
order, and publishes all shards or none."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfrfs.format import proto

from support import reference

REPO = Path(__file__).resolve().parents[2]

ray = pytest.importorskip("ray")


def _record(i: int) -> bytes:
    ex = proto.Example()
    ex.features.feature["id"].int64_list.value.append(i)
    ex.features.feature["text"].bytes_list.value.append(f"record {i} ".encode() * (i % 5))
    return ex.SerializeToString()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("src")
    n = 0
    for s in range(8):
        recs = [_record(n + i) for i in range(2500)]
        n += len(recs)
        (root / f"train-{s:05d}-of-00008.tfrecord").write_bytes(b"".join(reference.frame(r) for r in recs))
    return root


def _reshard(src: Path, dest: Path, *extra: str, env: dict | None = None, wait: bool = True) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tfrfs", "reshard", str(src), str(dest), "--cache-dir",
                             str(dest.parent / "cache"), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, env=env or dict(os.environ))
    if wait:
        proc.wait(timeout=300)
    return proc


def _content(folder: Path) -> dict[str, tuple[bytes, list[int]]]:
    """Each shard's bytes and its index file's offsets (the identity inside differs by design),
    read by the test suite's own reader."""
    out = {}
    for e in reference.read_manifest(folder)["shards"]:
        _, offsets = reference.read_index_file((folder / (e["path"] + ".tfrfs-idx")).read_bytes())
        out[e["path"]] = ((folder / e["path"]).read_bytes(), offsets)
    return out


def test_ray_output_is_the_local_output(ray_local, source: Path, tmp_path: Path) -> None:
    outs = {}
    for name, extra in (("ray", ["--ray", ray_local.address]), ("pool", ["--workers", "2"]),
                        ("one", ["--workers", "1"])):
        proc = _reshard(source, tmp_path / name, "--shards", "7", "--shuffle", "3", *extra)
        err = proc.stderr.read() if proc.stderr else ""
        assert proc.returncode == 0, err
        assert "Traceback" not in err
        outs[name] = _content(tmp_path / name)
    assert len(outs["ray"]) == 7
    assert outs["ray"] == outs["pool"] == outs["one"]


def _ray_workers() -> list[int]:
    """Ray worker processes running a job (their title names the task's function)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if cmd.startswith(b"ray::_call"):
            found.append(int(pid))
    return found


def test_a_ray_worker_killed_mid_job_changes_nothing(ray_local, source: Path, tmp_path: Path) -> None:
    want = _reshard(source, tmp_path / "want", "--shards", "60", "--workers", "1")
    assert want.returncode == 0
    proc = _reshard(source, tmp_path / "killed", "--shards", "60", "--ray", ray_local.address, wait=False)
    killed = None
    deadline = time.monotonic() + 60
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        workers = _ray_workers()
        if workers:
            killed = workers[0]
            os.kill(killed, signal.SIGKILL)
        else:
            time.sleep(0.01)
    _, err = proc.communicate(timeout=300)
    assert killed is not None, "no Ray worker seen running a job"
    assert proc.returncode == 0, err
    assert _content(tmp_path / "killed") == _content(tmp_path / "want")


def test_ray_write_gives_back_the_records(ray_local, tmp_path: Path) -> None:
    import tfrfs.ray
    records = [_record(i) for i in range(500)] + [b"", b"not an example \x00\xff"]
    ds = ray.data.from_items([{"record": r} for r in records])
    got = tfrfs.ray.write(ds, str(tmp_path / "out"), shards=4)
    assert got["records"] == len(records) and got["shards"] == 4
    # Read back by the test suite's own reader, which also checks the manifest and shipped indexes.
    back = [r for rs in reference.manifest_records(tmp_path / "out").values() for r in rs]
    assert back == records
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tfrfs-commit")]
    # Example-shaped rows are serialized here.
    rows = [{"id": [i], "tag": [b"x"], "w": [0.5]} for i in range(20)]
    tfrfs.ray.write(ray.data.from_items(rows), str(tmp_path / "ex"), compression="gzip")
    written = [r for rs in reference.manifest_records(tmp_path / "ex").values() for r in rs]
    assert [reference.parse_example(r) for r in written] == \
        [{"id": ("int64_list", [i]), "tag": ("bytes_list", [b"x"]), "w": ("float_list", [0.5])} for i in range(20)]
    assert all(e["compression"] == "GZIP" for e in reference.read_manifest(tmp_path / "ex")["shards"])


def test_ray_write_is_all_or_nothing(ray_local, tmp_path: Path) -> None:
    import tfrfs.ray
    rows = [{"record": _record(i)} for i in range(100)] + [{"record": 12345}]   # not bytes: its task fails
    with pytest.raises(Exception):
        tfrfs.ray.write(ray.data.from_items(rows), str(tmp_path / "out"), shards=4)
    assert not (tmp_path / "out").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tfrfs-commit")]
