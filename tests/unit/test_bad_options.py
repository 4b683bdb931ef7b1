"""Bad option values of the commands that work on a whole dataset (SPEC 8): each gets one line on
stderr naming it, exit status 2, no traceback, and nothing done -- the values are checked before
SOURCE is indexed or a worker starts. The real command line, run as a user runs it."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

from tfrfs.cli.parser import main
from tfrfs.sample import write_sample

from conftest import run_tfrfs


@pytest.fixture(scope="module")
def where(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The paths the table's rows name: SAMPLE (a dataset), AFILE (a plain file), PORT (a local
    port where nothing listens)."""
    base = tmp_path_factory.mktemp("bad-options")
    write_sample(base / "sample")
    (base / "afile").write_text("not a folder\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"SAMPLE": str(base / "sample"), "AFILE": str(base / "afile"), "PORT": str(port)}


def _refused(proc, says: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)
    assert says in lines[0], lines[0]
    return lines[0]


def _nothing_in(cache: Path) -> None:
    made = [p for p in cache.rglob("*") if p.is_file()] if cache.exists() else []
    assert not made, f"work was done before the refusal: {made}"


# (command and arguments, what the one line must say); SAMPLE, AFILE and PORT as ``where`` has them.
# Each row was a traceback, a usage several lines long, a wait of minutes, or silently accepted.
BAD = [
    # index --out-dir: made when missing, else refused
    ("index SAMPLE --out-dir /proc/tfrfs-nope", "--out-dir /proc/tfrfs-nope: cannot be made"),
    ("index SAMPLE --out-dir AFILE", "--out-dir AFILE: not a folder"),
    ("index SAMPLE --out-dir AFILE/sub", "--out-dir AFILE/sub: cannot be made"),
    ("index SAMPLE --out-dir /proc/self", "--out-dir /proc/self: not writable"),
    ("index SAMPLE --out-dir s3://bucket/idx", "--out-dir s3://bucket/idx: give a local folder"),
    ("index SAMPLE --beside --out-dir OUT", "--out-dir: not allowed with argument --beside"),
    ("index SAMPLE --out-dir OUT --beside", "--beside: not allowed with argument --out-dir"),
    ("index SAMPLE --format csv", "--format: invalid choice: 'csv'"),
    # --index-dir: a folder that is there
    ("index SAMPLE --index-dir /nonexistent/idx", "--index-dir /nonexistent/idx: no such folder"),
    ("inspect SAMPLE --index-dir AFILE", "--index-dir AFILE: not a folder"),
    ("inspect SAMPLE --index-dir s3://bucket/idx", "--index-dir s3://bucket/idx: give a local folder"),
    # --workers
    ("index SAMPLE --workers 0", "--workers: '0': give a number of processes, 1 to 1024"),
    ("verify SAMPLE --workers -3", "--workers: '-3': give a number of processes, 1 to 1024"),
    ("verify SAMPLE --workers 100000", "--workers: '100000': give a number of processes, 1 to 1024"),
    ("repair SAMPLE --workers abc", "--workers: 'abc': give a number of processes"),
    ("inspect SAMPLE --workers 1.5", "--workers: '1.5': give a number of processes"),
    ("reshard SAMPLE OUT --shards 2 --workers 0", "--workers: '0'"),
    ("commit SAMPLE --workers 0", "--workers: '0'"),
    # --ray: an address where no cluster answers is said at once (Ray waits a minute or more)
    ("verify SAMPLE --ray=127.0.0.1:PORT", "--ray 127.0.0.1:PORT: no Ray cluster answers at 127.0.0.1:PORT"),
    ("index SAMPLE --ray ray://127.0.0.1:PORT", "--ray ray://127.0.0.1:PORT: no Ray cluster answers"),
    ("reshard --ray 127.0.0.1:PORT SAMPLE OUT --shards 2", "--ray 127.0.0.1:PORT: no Ray cluster answers"),
    ("verify SAMPLE --ray=127.0.0.1:PORT --workers 2", "--workers: not allowed with argument --ray"),
    # sizes
    ("verify SAMPLE --cache-size inf", "--cache-size: 'inf' is not a size"),
    ("index SAMPLE --cache-size nan", "--cache-size: 'nan' is not a size"),
    ("mount SAMPLE NOWHERE --index-memory lots", "--index-memory: 'lots' is not a size"),
    ("mount SAMPLE NOWHERE --index-memory -5", "--index-memory: '-5' is not a size"),
    ("mount SAMPLE NOWHERE --index-memory 0", "--index-memory: '0': give a size of 1 byte or more"),
    ("mount SAMPLE NOWHERE --index-memory inf", "--index-memory: 'inf' is not a size"),
    ("mount SAMPLE NOWHERE -o index_memory=0", "--index-memory 0: give a size of 1 byte or more"),
    ("mount SAMPLE NOWHERE -o index_dir=/nonexistent/idx", "--index-dir /nonexistent/idx: no such folder"),
    # reshard's own options
    ("reshard SAMPLE OUT --shards two", "--shards: 'two': give a number of shards, 1 or more"),
    ("reshard SAMPLE OUT --shard-size lots", "--shard-size: 'lots' is not a size"),
    ("reshard SAMPLE OUT --shard-size inf", "--shard-size: 'inf' is not a size"),
    ("reshard SAMPLE OUT --shards 2 --compression lz4", "--compression: invalid choice: 'lz4'"),
    ("reshard SAMPLE OUT --shards 2 --shuffle abc", "--shuffle: 'abc': give a whole number as SEED"),
    ("reshard SAMPLE OUT --shards 2 --shuffle 1.5", "--shuffle: '1.5': give a whole number as SEED"),
    ("reshard SAMPLE OUT", "one of the arguments --shards --shard-size is required"),
    # commit SOURCE: its cache folder, though nothing is staged
    ("commit SAMPLE --cache-dir /proc/tfrfs-nope", "--cache-dir /proc/tfrfs-nope: cannot be made"),
]


@pytest.mark.parametrize("words, says", BAD, ids=[row[0] for row in BAD])
def test_a_bad_value_is_one_line_and_exit_2(words: str, says: str, where: dict[str, str], tmp_path: Path) -> None:
    names = {**where, "OUT": str(tmp_path / "out"), "NOWHERE": str(tmp_path / "no-mountpoint")}

    def fill(text: str) -> str:
        for name, value in names.items():
            text = text.replace(name, value)
        return text
    argv = [fill(w) for w in words.split()]
    if argv[0] != "commit":
        argv += ["--cache-dir", str(tmp_path / "cache")]
    # The working folder is the test's own: a URL taken for a path would show up there.
    proc = run_tfrfs(*argv, cwd=tmp_path, timeout=60,
                     env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    _refused(proc, fill(says))
    _nothing_in(tmp_path / "cache")
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["cache"]), sorted(tmp_path.iterdir())


def test_ray_address_from_the_environment_is_checked_too(where: dict[str, str], tmp_path: Path) -> None:
    env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{where['PORT']}"}
    proc = run_tfrfs("verify", where["SAMPLE"], "--ray", "--cache-dir", str(tmp_path / "c"), env=env, timeout=60)
    _refused(proc, f"$RAY_ADDRESS 127.0.0.1:{where['PORT']}: no Ray cluster answers")


@pytest.mark.parametrize("dest, says", [
    ("AFILE", "AFILE: DEST is a file"),
    ("AFILE/new", "AFILE/new: DEST is inside a file"),
    ("MISSING/new", "MISSING/new: no such folder MISSING (DEST's parent)"),
    ("/proc/tfrfs-nope", "/proc/tfrfs-nope: cannot write beside it, in /proc"),
    ("FULL", "FULL: DEST is not empty"),
])
def test_reshard_refuses_a_dest_before_indexing(dest: str, says: str, where: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine\n")
    names = {**where, "MISSING": str(tmp_path / "missing"), "FULL": str(tmp_path / "full")}
    for name, value in names.items():
        dest, says = dest.replace(name, value), says.replace(name, value)
    cache = tmp_path / "cache"
    _refused(run_tfrfs("reshard", where["SAMPLE"], dest, "--shards", "2", "--cache-dir", str(cache)), says)
    _nothing_in(cache)


@pytest.mark.parametrize("template, says", [
    ("{FOO}-{SHARD_INDEX}", "unknown field(s) FOO"),
    ("part.tfrecord", "give {SHARD_INDEX} or {SHARD_X_OF_Y}"),
    ("sub/{SHARD_INDEX}", "a file name, not a path"),
])
def test_reshard_refuses_a_name_template_before_indexing(template: str, says: str, where: dict[str, str],
                                                          tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    proc = run_tfrfs("reshard", where["SAMPLE"], str(tmp_path / "out"), "--shards", "2", "--name", template,
                     "--cache-dir", str(cache))
    _refused(proc, f"--name {template}: {says}")
    _nothing_in(cache)


def test_index_beside_an_unwritable_folder_is_refused_before_indexing(where: dict[str, str], tmp_path: Path) -> None:
    """/proc/sys is a folder nobody may make files in (access(2) says so to root too)."""
    cache = tmp_path / "cache"
    _refused(run_tfrfs("index", "/proc/sys", "--beside", "--cache-dir", str(cache), timeout=60),
             "/proc/sys: not writable, so no index file can go beside its shards; give --out-dir DIR")
    _nothing_in(cache)


def test_help_says_which_options_do_not_go_together() -> None:
    text = " ".join(run_tfrfs("index", "--help", check=True).stdout.split())
    assert "[--beside | --out-dir DIR]" in text, text
    assert "(not with --out-dir)" in text and "(not with --beside)" in text, text
    for command in ("index", "verify", "inspect", "repair", "commit", "reshard"):
        text = " ".join(run_tfrfs(command, "--help", check=True).stdout.split())
        assert "[--ray [ADDRESS] | --workers N]" in text and "(not with --ray" in text, (command, text)


def test_a_full_out_dir_is_refused_before_indexing(where: dict[str, str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A disk with no room left takes a new file, and refuses its first block: at fsync, on a file
    system that allocates late."""
    def no_room(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", no_room)
    out, cache = tmp_path / "out", tmp_path / "cache"
    status = main(["index", where["SAMPLE"], "--out-dir", str(out), "--workers", "1", "--cache-dir", str(cache)])
    err = capsys.readouterr().err
    assert status == 2 and err == f"tfrfs: --out-dir {out}: cannot be written (No space left on device)\n", err
    _nothing_in(cache)
    assert list(out.iterdir()) == []


def test_a_write_that_fails_while_shipping_is_one_line_and_exit_1(where: dict[str, str], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The disk fills up after the check, while the index files are written: the work failed
    (exit 1), said in one line."""
    import tfrfs.dataset.sources

    def full(*args: object, **kw: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(tfrfs.dataset.sources, "ship_indexes", full)
    out = tmp_path / "out"
    status = main(["index", where["SAMPLE"], "--out-dir", str(out), "--workers", "1",
                   "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert status == 1 and err == f"tfrfs: cannot write the index files into {out}: No space left on device\n", err
