"""Helpers of the remote-source end-to-end tests: walking two mounts into comparable snapshots,
and reading the proxy's request log as block reads of one object.

A snapshot maps each path under a mount (relative, ``/``-separated) to what a user sees there:
for a folder its mode and listing (or the errno listing it gave), for a file its mode, size and
a digest of its content (or the errno reading it gave), and for a record folder its
``user.tfrfs.*`` xattrs. Two mounts of the same bytes must give equal snapshots.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import stat
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Callable, Iterable

from support import commands
from support.servers import FaultProxy, Request

BLOCK = 1 << 20      # the remote reader's block (README, "Remote sources")
SNIFF = 4096         # bytes of each object read to judge it (SPEC 1: shards by content)
SMALL_SHARD = 100    # shards with at most this many records are compared record by record

PLAIN_NAMES = {"MANIFEST.txt", "dataset_info.json", "features.json"}

OD = "Tensorflow-Ion-Detetection/models/research/object_detection/test_data"
PETS = f"{OD}/pets_examples.record"                                    # damaged: data CRC, then garbage
SERENGETI = f"{OD}/snapshot_serengeti_sequence_examples.record"        # damaged: cut short at 0
MNIST_TFDS = "tensorflow_datasets/mnist/3.0.1/mnist-test.tfrecord-00000-of-00001"   # 3.3 MB: 4 blocks
TFDS_DIR = "tensorflow_datasets/mnist/3.0.1"
TFX_MNIST = "tfx/tfx/examples/mnist/data/mnist.tfrecord"               # 3.2 MB: 4 blocks
CAPTCHA_VALID = "captcha_recognize/data/valid.tfrecords"
LITE_TEST = "tfrecord_lite/tests/test.tfrecord"
TFX = "tfx/tfx"
PENGUIN_GZ = "tfx/tfx/components/testdata/penguin/data/Split-eval/data_tfrecord-00000-of-00001.gz"
CSV_GZ = "tfx/tfx/components/testdata/csv_example_gen/Split-eval/data_tfrecord-00000-of-00012.gz"
SEQ_GZ = "tfx/tfx/components/testdata/external/tfrecord_sequence/data_tfrecord-00000-of-00001.gz"
EVAL_GZ = "tfx/tfx/components/testdata/tfrecord_sequence/Split-eval/data_tfrecord_eval.gz"


def realdata_shards(root: Path, under: str = "") -> list[str]:
    """Relative paths of the shard files of the real data at ``root`` (the ``realdata`` fixture:
    everything but its plain files)."""
    base = root / under if under else root
    return sorted(p.relative_to(root).as_posix() for p in base.rglob("*")
                  if p.is_file() and p.name not in PLAIN_NAMES)


def gz_shards(root: Path) -> list[str]:
    return [s for s in realdata_shards(root) if s.endswith(".gz")]


def cli(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run the real command line (``python -m tfrfs ARGS``), output captured as text (through the
    command server: support/commands.py)."""
    return commands.run(args, timeout=timeout, **kw)


def record_offsets(path: Path) -> list[int]:
    """Header offsets of the records of an intact uncompressed shard, from its framing alone
    (u64 data length, u32 CRC, data, u32 CRC), plus its size at the end."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        out.append(pos)
        pos += 16 + int.from_bytes(data[pos:pos + 8], "little")
    assert pos == len(data), f"{path}: not an intact shard"
    return out + [pos]


def loader_index_text(offsets: list[int]) -> bytes:
    """The DALI / tfrecord-package index of a shard: ``OFFSET LENGTH`` of each record."""
    return b"".join(b"%d %d\n" % (a, b - a) for a, b in zip(offsets, offsets[1:]))


# --- snapshots ------------------------------------------------------------------------------

Pick = Callable[[str, list[str]], list[str]]


def sample_records(shard: str, names: list[str], small: int = SMALL_SHARD, extra: int = 4) -> list[str]:
    """The record folders of ``shard`` to compare in depth: all of a small shard, else the first
    two, the last two and ``extra`` chosen at random (seeded by the shard's path, so both mounts
    pick the same)."""
    if len(names) <= small:
        return names
    rng = random.Random(shard)
    middle = names[2:-2]
    return names[:2] + sorted(rng.sample(middle, min(extra, len(middle)))) + names[-2:]


def every_record(shard: str, names: list[str]) -> list[str]:
    return names


def _xattrs(path: Path) -> tuple[tuple[str, bytes], ...] | tuple[str, int]:
    try:
        keys = sorted(k for k in os.listxattr(path, follow_symlinks=False) if k.startswith("user.tfrfs."))
        return tuple((k, os.getxattr(path, k, follow_symlinks=False)) for k in keys)
    except OSError as exc:
        return ("errno", exc.errno or 0)


def read_file(path: Path | str) -> bytes | int:
    """The file's bytes, or the errno reading it failed with."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        return exc.errno or -1


def snapshot(mnt: Path, shards: Iterable[str], pick: Pick = sample_records, *,
             hide: Callable[[str], bool] = lambda name: False) -> dict[str, tuple]:
    """What ``mnt`` shows: every folder outside shard folders in full; each shard folder's
    listing in full, and below it the record folders ``pick`` chooses, in full, with their
    xattrs and those of the entries in them. Names for which ``hide(name)`` holds are left out
    (of listings too)."""
    shard_set = set(shards)
    out: dict[str, tuple] = {}

    def visit(path: Path, rel: str, depth_in_shard: int | None) -> None:
        try:
            st = os.lstat(path)
        except OSError as exc:
            out[rel] = ("lstat", exc.errno)
            return
        mode = stat.S_IMODE(st.st_mode)
        if depth_in_shard is not None and depth_in_shard >= 1:
            out[rel + "@xattr"] = _xattrs(path)
        if stat.S_ISDIR(st.st_mode):
            try:
                names = sorted(n for n in os.listdir(path) if not hide(n))
            except OSError as exc:
                out[rel] = ("dir", mode, "errno", exc.errno)
                return
            out[rel] = ("dir", mode, tuple(names))
            below = None if depth_in_shard is None else depth_in_shard + 1
            if rel in shard_set:
                names = pick(rel, names)
                below = 1
            for name in names:
                visit(path / name, f"{rel}/{name}" if rel else name, below)
        elif stat.S_ISREG(st.st_mode):
            data = read_file(path)
            content = ("errno", data) if isinstance(data, int) else hashlib.sha256(data).hexdigest()
            out[rel] = ("file", mode, st.st_size, content)
        else:
            out[rel] = ("other", stat.S_IFMT(st.st_mode))

    visit(mnt, "", None)
    return out


def differences(expected: dict[str, tuple], actual: dict[str, tuple], limit: int = 20) -> list[str]:
    """Readable differences between two snapshots (at most ``limit``)."""
    out = []
    for rel in sorted(set(expected) | set(actual)):
        a, b = expected.get(rel), actual.get(rel)
        if a != b:
            out.append(f"{rel or '/'}: expected {a!r}, got {b!r}")
            if len(out) >= limit:
                out.append("...")
                break
    return out


def tfrfs_meta(mnt: Path) -> tuple[str, set[str]]:
    """(``.tfrfs/schema.json``'s text, the set of ``.tfrfs/errors`` lines, normalised)."""
    schema = (mnt / ".tfrfs" / "schema.json").read_text()
    return schema, error_lines(mnt)


def error_lines(mnt: Path) -> set[str]:
    text = (mnt / ".tfrfs" / "errors").read_text()
    return {json.dumps(json.loads(line), sort_keys=True) for line in text.splitlines() if line.strip()}


def errors_naming(mnt: Path, shard: str) -> list[dict]:
    """The ``.tfrfs/errors`` entries about ``shard``."""
    text = (mnt / ".tfrfs" / "errors").read_text()
    return [e for e in (json.loads(line) for line in text.splitlines() if line.strip()) if e.get("shard") == shard]


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


# --- requests -------------------------------------------------------------------------------

def request_path(r: Request) -> str:
    """The request's path without its query, unquoted."""
    return urllib.parse.unquote(urllib.parse.urlsplit(r.path).path)


def gets_of(proxy: FaultProxy, path: str) -> list[Request]:
    """GET requests for exactly the object at ``path`` (as the proxy sees it: ``/bucket/key``)."""
    return [r for r in proxy.requests if r.method == "GET" and request_path(r) == path]


def span(r: Request, size: int) -> tuple[int, int]:
    """The inclusive byte span a GET asked for (the whole object when it had no Range)."""
    if r.range_header is None:
        return 0, size - 1
    unit, _, spec = r.range_header.partition("=")
    assert unit == "bytes" and "," not in spec, r.range_header
    first, _, last = spec.partition("-")
    if first == "":
        return max(0, size - int(last)), size - 1
    return int(first), min(size - 1, int(last)) if last else size - 1


def is_sniff(r: Request, size: int) -> bool:
    """Whether a GET is the read of an object's first bytes that judges it (SPEC 1)."""
    return r.range_header is not None and span(r, size) == (0, min(SNIFF, size) - 1)


def block_gets(proxy: FaultProxy, path: str, size: int) -> list[Request]:
    """The GETs of an object other than the sniffing reads of its head."""
    return [r for r in gets_of(proxy, path) if not is_sniff(r, size)]


def blocks_fetched(requests: Iterable[Request], size: int) -> set[int]:
    """The blocks the requests' byte spans cover."""
    out: set[int] = set()
    for r in requests:
        first, last = span(r, size)
        out.update(range(first // BLOCK, last // BLOCK + 1))
    return out


def n_blocks(size: int) -> int:
    return (size + BLOCK - 1) // BLOCK


def show(requests: Iterable[Request]) -> str:
    return "\n".join(f"  {r.method} {r.path} {r.range_header or ''} -> {r.status}" for r in requests)
