"""What the command line says for ordinary misuse: one line, the right exit status, no traceback.
The real command, run by a real shell where the shell is part of the story (globs, pipes)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tfrfs.format import proto
from tfrfs.format import tfrecord

from conftest import REPO, run_tfrfs

TFRFS = f"{shlex.quote(sys.executable)} -m tfrfs"


def _shell(script: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}   # output buffered, as usual
    full.update(PYTHONPATH=str(REPO), **env)
    return subprocess.run(["sh", "-c", script], cwd=cwd, capture_output=True, text=True, env=full, timeout=120)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)
    return lines[0]


def _shards(folder: Path, n: int) -> None:
    folder.mkdir()
    for i in range(n):
        ex = proto.Example()
        ex.features.feature["i"].int64_list.value.append(i)
        (folder / f"part-{i}.tfrecord").write_bytes(tfrecord.frame(ex.SerializeToString()))


@pytest.mark.parametrize("command", ["mount", "inspect", "verify", "index", "no command word"])
def test_an_unquoted_glob_gets_a_hint(command: str, tmp_path: Path) -> None:
    _shards(tmp_path / "data", 3)
    (tmp_path / "mnt").mkdir()
    words = {"mount": "mount data/*.tfrecord mnt", "no command word": "data/*.tfrecord mnt"}.get(
        command, f"{command} data/*.tfrecord")
    line = _one_line(_shell(f"{TFRFS} {words}", tmp_path))
    assert "unquoted glob" in line and "quote it" in line and "'data/*.tfrecord'" in line, line
    # Two matches: the second lands where MOUNTPOINT goes.
    (tmp_path / "data" / "part-2.tfrecord").unlink()
    line = _one_line(_shell(f"{TFRFS} mount data/*.tfrecord mnt", tmp_path))
    assert "unquoted glob" in line, line
    # Quoted, it is one SOURCE.
    assert _shell(f"{TFRFS} inspect 'data/*.tfrecord' --cache-dir c", tmp_path).returncode == 0


def test_other_extra_arguments_are_still_refused(tmp_path: Path, sample: Path) -> None:
    proc = run_tfrfs("inspect", str(sample), "stray")
    assert proc.returncode == 2 and "unrecognized arguments: stray" in proc.stderr


@pytest.mark.parametrize("reader", ["head -3", "head -n 0", "true"])
def test_a_reader_that_goes_away_is_no_error(reader: str, sample: Path, tmp_path: Path) -> None:
    for command in ("inspect", "verify", "inspect --json"):
        proc = _shell(f"{TFRFS} {command} {shlex.quote(str(sample))} --cache-dir c | {reader}; "
                      "echo \"status ${?}\" >&2", tmp_path)
        assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
        assert "BrokenPipeError" not in proc.stderr, proc.stderr


def test_a_closed_pipe_ends_as_sigpipe_would(sample: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = str(REPO)
    read, write = os.pipe()
    os.close(read)   # nobody will read: the first write fails
    try:
        proc = subprocess.run([sys.executable, "-m", "tfrfs", "inspect", str(sample), "--cache-dir", str(tmp_path / "c")],
                              stdout=write, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    finally:
        os.close(write)
    assert proc.stderr == "" and proc.returncode == 128 + 13, proc.stderr


@pytest.mark.parametrize("command", ["inspect", "verify", "index"])
def test_an_impossible_cache_dir(command: str, sample: Path, tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    for where, says in ((afile / "cache", "Not a directory"), (afile, "not a folder"),
                        (Path("/proc/tfrfs-cache"), "cannot be made")):
        line = _one_line(run_tfrfs(command, str(sample), "--cache-dir", str(where)))
        assert line.startswith(f"tfrfs: --cache-dir {where}: ") and says in line, line


def test_the_default_cache_folder_unusable(sample: Path, tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    env = {**os.environ, "XDG_CACHE_HOME": str(afile)}
    line = _one_line(run_tfrfs("inspect", str(sample), env=env))
    assert "cache folder" in line and "--cache-dir" in line, line


def test_an_impossible_cache_dir_or_log_for_mount(sample: Path, tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    (tmp_path / "mnt").mkdir()
    mount = ("mount", str(sample), str(tmp_path / "mnt"))
    line = _one_line(run_tfrfs(*mount, "--cache-dir", str(afile / "c")))
    assert line.startswith(f"tfrfs: --cache-dir {afile / 'c'}: "), line
    line = _one_line(run_tfrfs(*mount, "--cache-dir", str(tmp_path / "c"), "--log", str(afile / "x.log")))
    assert "--log" in line and "not a folder" in line, line
    line = _one_line(run_tfrfs(*mount, "--cache-dir", str(tmp_path / "c"), "--log", str(tmp_path)))
    assert "--log" in line and "Is a directory" in line, line
    line = _one_line(run_tfrfs(*mount, "-o", f"cache_dir={afile}"))
    assert "not a folder" in line, line


def test_inspect_says_kinds_in_words(tmp_path: Path) -> None:
    records = []
    for i in range(4):
        ex = proto.Example()
        if i % 2:
            ex.features.feature["maybe"].bytes_list.value.append(b"x")
        else:
            ex.features.feature["maybe"].SetInParent()   # a feature with no kind
        ex.features.feature["n"].int64_list.value.append(i)
        records.append(tfrecord.frame(ex.SerializeToString()))
    (tmp_path / "k.tfrecord").write_bytes(b"".join(records))
    proc = run_tfrfs("inspect", str(tmp_path / "k.tfrecord"), "--cache-dir", str(tmp_path / "c"))
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.split()}
    assert "bytes_list or none" in rows["maybe"] or "none or bytes_list" in rows["maybe"], rows["maybe"]
    assert "[" not in rows["maybe"] and "None" not in rows["maybe"]
    assert rows["n"].split()[1] == "int64_list"
