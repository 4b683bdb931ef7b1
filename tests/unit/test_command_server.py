"""The tests' command server (support/commands.py) answers as ``python -m tfrfs`` does: the same
output, errors and exit status, in the caller's folder and environment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import commands
from support.example_pb import Example
from support.reference import frame


def fresh(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfrfs", *args], capture_output=True, text=True, timeout=60, **kw)


def example(label: int) -> bytes:
    ex = Example()
    ex.features.feature["label"].int64_list.value.append(label)
    return ex.SerializeToString()


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    """a.tfrecord sound, b.tfrecord with its last record's data checksum broken."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.tfrecord").write_bytes(b"".join(frame(example(i)) for i in range(3)))
    damaged = bytearray(b"".join(frame(example(7)) for _ in range(2)))
    damaged[-1] ^= 0xFF
    (src / "b.tfrecord").write_bytes(bytes(damaged))
    return src


@pytest.mark.parametrize("args", [
    ["--help"], ["verify", "--help"], ["no-such-command"], ["verify"], ["verify", "{src}"],
    ["verify", "--json", "{src}"], ["inspect", "{src}"], ["inspect", "{src}/missing"], ["status", "{tmp}"],
], ids=lambda a: " ".join(a))
def test_a_command_answers_as_python_m_tfrfs_does(args: list[str], shards: Path, tmp_path: Path) -> None:
    args = [a.format(src=shards, tmp=tmp_path) for a in args]
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    want = fresh(args, env=env)
    got = commands.run(args, env=env, timeout=60)
    assert got.args == want.args
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)


def test_the_callers_folder_environment_and_input(tmp_path: Path, shards: Path) -> None:
    (tmp_path / "work").mkdir()
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "elsewhere"))
    got = commands.run(["inspect", os.path.relpath(shards, tmp_path / "work")], cwd=tmp_path / "work", env=env,
                       timeout=60)
    assert got.returncode == 0 and "a.tfrecord" in got.stdout and "b.tfrecord" in got.stdout, got.stderr
    assert (tmp_path / "elsewhere" / "tfrfs").is_dir()   # the index went where the caller's environment said
    want = fresh(["inspect", os.path.relpath(shards, tmp_path / "work")], cwd=tmp_path / "work", env=env)
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)


def test_a_command_past_its_timeout_is_killed_and_the_next_one_runs(shards: Path, tmp_path: Path) -> None:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        commands.run(["verify", str(shards)], env=env, timeout=0.001)   # no command is done that soon
    assert time.monotonic() - t0 < 30
    assert commands.run(["verify", str(shards)], env=env, timeout=60).returncode == 1


def test_variables_read_at_start_take_effect(tmp_path: Path) -> None:
    """A command whose environment sets what an interpreter reads as it starts (here PYTHONPATH,
    with a sitecustomize module that Python imports at start) runs in an interpreter started with
    it, as a fresh ``python -m tfrfs`` would."""
    extra = tmp_path / "extra"
    extra.mkdir()
    marker = tmp_path / "started"
    (extra / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'a').write('x')\n")
    path = os.pathsep.join(p for p in (str(extra), os.environ.get("PYTHONPATH", "")) if p)
    got = commands.run(["--version"], env=dict(os.environ, PYTHONPATH=path), timeout=60)
    assert got.returncode == 0 and got.stdout.startswith("tfrfs ")
    assert marker.exists()
    got = commands.run(["--version"], timeout=60)   # the server of this process's own environment
    assert got.returncode == 0 and marker.read_text() == "x"
    server = commands._the_server(dict(os.environ))
    if server is not None:
        assert server.stands_in_for(dict(os.environ))
        assert not server.stands_in_for(dict(os.environ, PYTHONPATH=path))
        assert not server.stands_in_for(dict(os.environ, FUSE_LIBRARY_PATH=str(tmp_path / "libfuse.so")))
        plain = {k: v for k, v in os.environ.items() if not k.startswith("FUSE_LIBRARY")}
        # The FUSE binding names libfuse3 itself where neither variable is set: a process that
        # imported it has FUSE_LIBRARY_NAME=fuse3, which is no difference.
        assert server.stands_in_for(plain) and server.stands_in_for(dict(plain, FUSE_LIBRARY_NAME="fuse3"))
