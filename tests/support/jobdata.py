"""A small dataset for the shard-job tests (``--workers``, ``--ray``): damaged plain shards, GZIP
and ZLIB shards (one damaged mid-stream), a SequenceExample shard, and one shard large enough to
be cut in parts when ``TFRFS_SPLIT_RECORDS`` is lowered to ``SPLIT_RECORDS``; and the commands'
output, gathered for comparison. Job functions the tests run in worker processes live here too
(they must be importable by the workers)."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

from support import commands
from tfrfs.format import proto
from tfrfs.format import tfrecord

SPLIT_RECORDS = 400     # the large shard (3,000 records) is verified and read in 8 parts
BIG = "big.tfrecord"


def example(i: int) -> bytes:
    ex = proto.Example()
    ex.features.feature["n"].int64_list.value.append(i)
    ex.features.feature["text"].bytes_list.value.append(f"record number {i}".encode())
    if i % 3 == 0:
        ex.features.feature["score"].float_list.value.extend([i / 2, 1.5])
    if i % 7 == 0:
        ex.features.feature["empty"].CopyFrom(proto.Feature())
    return ex.SerializeToString()


def sequence(i: int) -> bytes:
    seq = proto.SequenceExample()
    seq.context.feature["id"].int64_list.value.append(i)
    steps = seq.feature_lists.feature_list["tokens"]
    for k in range(i % 4 + 1):
        steps.feature.add().int64_list.value.extend(range(k + 1))
    return seq.SerializeToString()


def _frames(records: list[bytes]) -> list[bytes]:
    return [tfrecord.frame(r) for r in records]


def _damage(frames: list[bytes], header: int | None = None, data: int | None = None,
            garbage: int | None = None) -> bytes:
    """``frames`` joined, with record ``header``'s length checksum broken, record ``data``'s data
    flipped, and 40 garbage bytes after record ``garbage``."""
    starts = [sum(map(len, frames[:k])) for k in range(len(frames) + 1)]
    buf = bytearray(b"".join(frames))
    if header is not None:
        buf[starts[header] + 9] ^= 0x10
    if data is not None:
        buf[starts[data] + 14] ^= 0x01
    if garbage is not None:
        buf[starts[garbage + 1]:starts[garbage + 1]] = bytes(range(1, 41))
    return bytes(buf)


def make(root: Path) -> Path:
    """The dataset, in ``root`` (made)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "a-train.tfrecord-00000-of-00002").write_bytes(b"".join(_frames([example(i) for i in range(50)])))
    (root / "a-train.tfrecord-00001-of-00002").write_bytes(
        _damage(_frames([example(i) for i in range(50, 120)]), header=10, data=30))
    (root / "c.tfrecord.gz").write_bytes(gzip.compress(b"".join(_frames([example(i) for i in range(200)]))))
    whole = zlib.compress(b"".join(_frames([example(i) for i in range(300)])))
    cut = bytearray(whole)
    cut[len(cut) // 2] ^= 0xFF                      # damaged mid-stream
    (root / "d.tfrecord.zlib").write_bytes(bytes(cut))
    sub = root / "seq"
    sub.mkdir(exist_ok=True)
    (sub / "s.tfrecord").write_bytes(b"".join(_frames([sequence(i) for i in range(60)])))
    # Damage in several of its parts, a gap right before a cut point among them.
    (root / BIG).write_bytes(_damage(_frames([example(i) for i in range(3000)]), header=400, data=1700,
                                     garbage=2600))
    return root


# --- running the commands -----------------------------------------------------------------------

_TIMES = re.compile(r" in \d+(\.\d+)?s\b")


def run(*args: str, cache: Path, env: dict | None = None, timeout: float = 300) -> tuple[int, str]:
    """``tfrfs ARGS`` as a subprocess with its own cache folder and the lowered split: (exit
    status, stdout with the seconds taken left out). Fails on a traceback."""
    environ = dict(env or os.environ, XDG_CACHE_HOME=str(cache), TFRFS_SPLIT_RECORDS=str(SPLIT_RECORDS))
    proc = commands.run(args, timeout=timeout, env=environ)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, _TIMES.sub(" in Ns", proc.stdout)


def files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, with its bytes."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


# --- job functions for the runners' tests ------------------------------------------------------

def square(x: int) -> int:
    return x * x


def run_on(*args: str, src: Path | str, cache: Path) -> tuple[int, str]:
    """``run`` of ``ARGS SOURCE``, its output with SOURCE written as SRC (to compare two copies)."""
    code, out = run(*args, str(src), cache=cache)
    return code, out.replace(str(src), "SRC")


def committed_files(root: Path) -> dict[str, bytes]:
    """``files`` after a commit, without what differs from run to run: the time of a new shard
    inside its index file, and in the manifest the folders' and files' times, the shards' times
    and identities and their index files' checksums."""
    got = files(root)
    for name, data in got.items():
        if name.endswith(".tfrfs-idx"):
            got[name] = re.sub(rb'"identity": "mtime:\d+:', b'"identity": "mtime:T:', data)
    if ".tfrfs-manifest" in got:
        doc = json.loads(got[".tfrfs-manifest"])
        for d in doc["dirs"] + doc["files"]:
            d.pop("mtime_ns")
        for shard in doc["shards"]:
            shard.pop("mtime_ns"), shard.pop("identity"), shard["index"].pop("crc32c")
        got[".tfrfs-manifest"] = json.dumps(doc, sort_keys=True).encode()
    return got


def fail(message: str) -> None:
    raise LookupError(message)


def slow_square(x: int, folder: str, seconds: float) -> int:
    """``x * x`` after ``seconds``; the worker's pid is left in ``folder`` meanwhile (to be killed)."""
    mark = Path(folder) / f"{os.getpid()}-{x}"
    tmp = Path(folder).parent / f".{mark.name}"   # renamed in whole: a reader never sees it empty
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, mark)
    time.sleep(seconds)
    return x * x


def kill_first(folder: Path, deadline: float = 30.0, sig: int = signal.SIGKILL) -> int | None:
    """Kill the process of the first pid left in ``folder`` (waits for one); its pid."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        for mark in sorted(folder.iterdir()):
            pid = int(mark.read_text() or 0)
            if pid and pid != os.getpid():
                os.kill(pid, sig)
                return pid
        time.sleep(0.02)
    return None


def make_slow(root: Path, shards: int = 2, records: int = 150_000) -> Path:
    """Shards whose verification takes a while each (a job to kill while it runs)."""
    root.mkdir(parents=True, exist_ok=True)
    data = b"".join(tfrecord.frame(example(i)) for i in range(records))
    for s in range(shards):
        (root / f"slow-{s:05d}-of-{shards:05d}.tfrecord").write_bytes(data)
    return root


def ray_task_pids() -> list[int]:
    """Processes running a Ray task of tfrfs's jobs now (their title: ``ray::_call``)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if cmd.startswith(b"ray::_call"):
            out.append(int(entry))
    return out


def stage_edits(src: Path, mount) -> None:
    """Stage edits in ``src`` (made by ``make``) through a writable mount (``mount``: the
    ``tfrfs_mount`` fixture), then stop its daemon by SIGTERM: the edits stay staged, for
    ``tfrfs commit SOURCE``. A record changed in a plain shard and in the large damaged one, one
    deleted from the GZIP shard."""
    from support.daemons import daemon_pid, wait_gone
    mnt = mount(src, "--rw")
    (mnt / "a-train.tfrecord-00000-of-00002" / "000000" / "n.json").write_text("[5]\n")
    (mnt / BIG / "000010" / "n.json").write_text("[7]\n")
    subprocess.run(["rm", "-r", str(mnt / "c.tfrecord.gz" / "000003")], check=True)
    pid = daemon_pid(mnt)
    os.kill(pid, signal.SIGTERM)
    wait_gone(pid)


# --- commit SOURCE as shard jobs -----------------------------------------------------------------

TFDS_INFO = {"name": "a", "splits": [{"name": "train", "numBytes": "1", "shardLengths": ["50", "70"]}]}


def make_commit(root: Path, gz_shards: int = 3, gz_records: int = 2_000) -> Path:
    """``make``'s dataset with a TFDS ``dataset_info.json`` for its ``a-train`` shards and
    ``gz_shards`` more GZIP shards of ``gz_records`` records each (raise it to make each shard's
    commit job take a while)."""
    make(root)
    (root / "dataset_info.json").write_text(json.dumps(TFDS_INFO))
    for s in range(gz_shards):
        (root / f"g{s}.tfrecord.gz").write_bytes(
            gzip.compress(b"".join(_frames([example(s * gz_records + i) for i in range(gz_records)])), 6))
    return root


def stage_many(src: Path, mount, gz_shards: int = 3) -> None:
    """Stage, through a writable mount, changes of every kind in many shards of ``make_commit``'s
    dataset, then stop its daemon by SIGTERM (the edits stay staged): records edited, deleted and
    added (copied with ``cp -r``) in plain, damaged, GZIP and sequence shards, a new shard made
    and filled, the damaged ZLIB shard removed."""
    from support.daemons import daemon_pid, wait_gone
    mnt = mount(src, "--rw")
    a0, a1 = mnt / "a-train.tfrecord-00000-of-00002", mnt / "a-train.tfrecord-00001-of-00002"
    (a0 / "000000" / "n.json").write_text("[5]\n")
    subprocess.run(["rm", "-r", str(a0 / "000005")], check=True)
    subprocess.run(["cp", "-r", str(a0 / "000007"), str(a0 / "zz-copy")], check=True)
    (a1 / "000003" / "text.txt").write_text("changed in the damaged shard\n")
    (mnt / BIG / "000010" / "n.json").write_text("[7]\n")
    subprocess.run(["rm", "-r", str(mnt / BIG / "002000")], check=True)
    subprocess.run(["rm", "-r", str(mnt / "c.tfrecord.gz" / "000003")], check=True)
    (mnt / "c.tfrecord.gz" / "000100" / "score.json").write_text("[0.25, 2.5]\n")
    subprocess.run(["rm", "-r", str(mnt / "seq" / "s.tfrecord" / "000002")], check=True)
    for s in range(gz_shards):
        g = mnt / f"g{s}.tfrecord.gz"
        (g / "000001" / "n.json").write_text(f"[{-s}]\n")
        subprocess.run(["cp", "-r", str(g / "000002"), str(g / "added")], check=True)
    (mnt / "new.tfrecord").mkdir()
    subprocess.run(["cp", "-r", str(a0 / "000001"), str(mnt / "new.tfrecord" / "r0")], check=True)
    subprocess.run(["rm", "-r", str(mnt / "d.tfrecord.zlib")], check=True)
    pid = daemon_pid(mnt)
    os.kill(pid, signal.SIGTERM)
    wait_gone(pid)


def start(*args: str, cache: Path, env: dict | None = None) -> subprocess.Popen:
    """``run`` started, not waited for (its pid is ``.pid``); ``finish`` waits."""
    environ = dict(env or os.environ, XDG_CACHE_HOME=str(cache), TFRFS_SPLIT_RECORDS=str(SPLIT_RECORDS))
    return subprocess.Popen([sys.executable, "-m", "tfrfs", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environ)


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    out, err = proc.communicate(timeout=timeout)
    assert "Traceback" not in err, err
    return proc.returncode, _TIMES.sub(" in Ns", out)


def commit_writers(folder: Path) -> dict[int, set[str]]:
    """The processes that hold a commit's temporary shard file in ``folder`` open now (read from
    /proc): pid -> the files' names."""
    from tfrfs.index.discovery import TMP_PREFIX
    prefix = os.path.join(str(folder), TMP_PREFIX)
    out: dict[int, set[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(prefix):
                out.setdefault(int(entry), set()).add(os.path.basename(target))
    return out


class WriterWatch:
    """Who holds ``folder``'s commit temporary files open while a command runs, seen every few
    milliseconds on a thread; with ``kill_one``, the first such process other than ``spare`` is
    killed with SIGKILL (a worker lost while it writes)."""

    def __init__(self, folder: Path, *, kill_one: bool = False, spare: int | None = None) -> None:
        import threading
        self.folder = folder
        self.kill_one = kill_one
        self.spare = spare
        self.seen: dict[int, set[str]] = {}
        self.killed: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "WriterWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.is_set():
            for pid, names in commit_writers(self.folder).items():
                self.seen.setdefault(pid, set()).update(names)
                if self.kill_one and self.killed is None and pid != self.spare and pid != os.getpid():
                    try:
                        os.kill(pid, signal.SIGKILL)
                        self.killed = pid
                    except ProcessLookupError:
                        pass
            time.sleep(0.002)
