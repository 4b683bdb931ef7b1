"""Indexes of remote shards are reused, counted at the server (SPEC 1.1, 1.2).

Every request of the tfrfs processes goes through a FaultProxy in front of the store, so what a
mount costs is read off its log: the sniffing reads of each object's head (SPEC 1: shards are
recognised by content) and the ranged GETs of 1 MiB blocks. A scan fetches every block of a
shard; a cached index or a matching index file beside the shard (``NAME.tfrfs-idx``, DALI
``NAME.idx``, the tfrecord package's ``.tfindex``, or one in ``--index-dir``) makes the mount
read at most the block holding the last record's header (the sample check) and the first
block (to learn the record kind from a text index).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from remote_support import (CAPTCHA_VALID, CSV_GZ, LITE_TEST, MNIST_TFDS, SEQ_GZ, SNIFF, TFX,
                            TFX_MNIST, BLOCK, block_gets, blocks_fetched, cli, differences,
                            gets_of, loader_index_text, n_blocks, realdata_shards, record_offsets,
                            sample_records, show, snapshot, span)

pytestmark = pytest.mark.mount

CAPTCHA_TRAIN = "captcha_recognize/data/train.tfrecords"
MNIST_NB = "notebook-benchmarks/tensorflow_datasets/mnist/3.0.1/mnist-test.tfrecord-00000-of-00001"



def copy_shards(dest: Path, rels: list[str], root: Path) -> Path:
    """``rels`` of the real data at ``root`` (the ``realdata`` fixture) copied into ``dest``."""
    for rel in rels:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dest / rel)
    return dest


def umount(mnt: Path) -> None:
    proc = cli("umount", str(mnt))
    assert proc.returncode == 0, proc.stderr


def allowed_blocks(local_shard: Path) -> set[int]:
    """What a mount with a usable index may read of an intact uncompressed shard: the block
    holding the last record's header (the sample check) and, for a text index that does not
    say, the blocks of the first 16 records, which decide the record kind (SPEC 2) -- for
    small records, the first block."""
    offsets = record_offsets(local_shard)
    count = len(offsets) - 1
    if count == 0:
        return set()
    kind_end = offsets[min(16, count)] - 1
    return set(range(kind_end // BLOCK + 1)) | {offsets[count - 1] // BLOCK}


def assert_no_scan(proxy, path: str, local_shard: Path) -> None:
    size = local_shard.stat().st_size
    gets = block_gets(proxy, path, size)
    allowed = allowed_blocks(local_shard)
    got = blocks_fetched(gets, size)
    assert got <= allowed and len(gets) <= len(allowed), \
        f"{path}: blocks {sorted(got)} read at mount, expected at most {sorted(allowed)}:\n{show(gets)}"


def assert_scanned(proxy, path: str, size: int) -> None:
    got = blocks_fetched(block_gets(proxy, path, size), size)
    assert got == set(range(n_blocks(size))), f"{path}: a scan reads every block; got {sorted(got)}"


def head_only(proxy, path: str, size: int) -> list:
    """GETs of an object that start past its head (what a mount with everything cached must not
    make)."""
    return [r for r in gets_of(proxy, path) if span(r, size)[0] >= SNIFF]


# --- (a) the local index cache ----------------------------------------------------------

def test_second_mount_with_the_same_cache_reads_no_shard_blocks(realdata: Path, s3, tfrfs_mount) -> None:
    s3.upload_tree(realdata, "real")
    shards = realdata_shards(realdata)
    first = tfrfs_mount(s3.url("real"))
    for shard in shards:
        if not shard.endswith(".gz"):
            assert_scanned(s3.proxy, s3.path(f"real/{shard}"), (realdata / shard).stat().st_size)
    umount(first)
    s3.proxy.reset()
    second = tfrfs_mount(s3.url("real"))
    for shard in shards:
        size = (realdata / shard).stat().st_size
        late = head_only(s3.proxy, s3.path(f"real/{shard}"), size)
        assert not late, f"{shard}: the cached index was not used:\n{show(late)}"
    ranged = [r for r in s3.proxy.requests if r.range_header and span(r, 1 << 40)[0] >= SNIFF]
    assert not ranged, show(ranged)
    assert len(list((second / MNIST_TFDS).iterdir())) == 10000


def test_sniffing_reads_only_the_head_of_each_object(realdata: Path, s3, tfrfs_mount) -> None:
    """With every index cached, a mount lists the objects and reads the first bytes of each to
    judge it (SPEC 1) -- the first 4 KiB, not the whole object. A GZIP shard not named like a
    shard (TFX's ``data_tfrecord_eval.gz``) is judged by whether it inflates to anything: its
    first 4 KiB show that as well."""
    s3.upload_tree(realdata / TFX, "tfx")
    first = tfrfs_mount(s3.url("tfx"))
    umount(first)
    s3.proxy.reset()
    tfrfs_mount(s3.url("tfx"))
    too_much = [r for r in s3.proxy.requests if r.method == "GET" and r.range_header is not None
                and span(r, 1 << 40)[1] >= SNIFF]
    whole = [r for r in s3.proxy.requests if r.method == "GET" and r.range_header is None and "?" not in r.path]
    assert not too_much and not whole, f"reads beyond the first {SNIFF} bytes at mount:\n{show(too_much + whole)}"


# --- (b) NAME.tfrfs-idx beside the shards -------------------------------------------------

def test_index_beside_makes_a_cold_mount_read_samples_only(realdata: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    s3.upload_tree(realdata, "real")
    shards = realdata_shards(realdata)
    plain = [s for s in shards if not s.endswith(".gz")]
    # Without index files, a cold mount scans: every block of every shard.
    cold = tfrfs_mount(s3.url("real"), "--cache-dir", str(tmp_path / "cold"))
    for shard in plain:
        assert_scanned(s3.proxy, s3.path(f"real/{shard}"), (realdata / shard).stat().st_size)
    expected = snapshot(cold, shards, sample_records)

    proc = cli("index", s3.url("real"), "--beside", "--cache-dir", str(tmp_path / "indexer"))
    assert proc.returncode in (0, 1), proc.stderr   # 1: the damaged shards' problems
    assert f"wrote {len(shards)} tfrfs index file(s)" in proc.stdout, proc.stdout + proc.stderr
    keys = set(s3.keys("real/"))
    assert {f"real/{s}.tfrfs-idx" for s in shards} <= keys

    s3.proxy.reset()
    # Listed (the manifest written too is test_remote_manifest's): the index files are read at mount.
    warm = tfrfs_mount(s3.url("real"), "--cache-dir", str(tmp_path / "empty"), "--no-manifest")
    for shard in plain:
        if shard_intact(realdata / shard):
            assert_no_scan(s3.proxy, s3.path(f"real/{shard}"), realdata / shard)
        else:   # damaged: no framing to say where its last record starts
            assert_few_reads(s3.proxy, s3.path(f"real/{shard}"), (realdata / shard).stat().st_size)
        assert gets_of(s3.proxy, s3.path(f"real/{shard}.tfrfs-idx")), f"{shard}: its index file was not read"
    # The same records, and the index files shown as plain files (SPEC 1).
    actual = snapshot(warm, shards, sample_records, hide=lambda name: name.endswith(".tfrfs-idx"))
    diff = differences(expected, actual)
    assert not diff, "\n".join(diff)
    assert (warm / f"{LITE_TEST}.tfrfs-idx").is_file()
    # The index files carry the schema too: schema.json reads no record (SPEC 5 from the index).
    cold_schema = json.loads((cold / ".tfrfs" / "schema.json").read_text())
    s3.proxy.reset()
    assert json.loads((warm / ".tfrfs" / "schema.json").read_text()) == cold_schema
    for shard in shards:
        assert not gets_of(s3.proxy, s3.path(f"real/{shard}")), f"{shard}: read for schema.json"


def shard_intact(shard: Path) -> bool:
    try:
        record_offsets(shard)
    except AssertionError:
        return False
    return True


def assert_few_reads(proxy, path: str, size: int) -> None:
    gets = block_gets(proxy, path, size)
    assert len(gets) <= 2, f"{path}: {len(gets)} block reads:\n{show(gets)}"


def test_compressed_shard_with_index_beside_is_fetched_at_first_read_not_at_mount(
        realdata: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    """SPEC 1.1: a compressed remote shard with a known index is fetched and decompressed on the
    first read of one of its records, not at mount -- then once."""
    shards = [CSV_GZ, SEQ_GZ]
    copy_shards(tmp_path / "src", shards, realdata)
    s3.upload_tree(tmp_path / "src", "gz")
    proc = cli("index", s3.url("gz"), "--beside", "--cache-dir", str(tmp_path / "indexer"))
    assert proc.returncode == 0, proc.stderr
    s3.proxy.reset()
    mnt = tfrfs_mount(s3.url("gz"), "--cache-dir", str(tmp_path / "empty"))
    for shard in shards:
        size = (realdata / shard).stat().st_size
        early = block_gets(s3.proxy, s3.path(f"gz/{shard}"), size)
        assert not early, f"{shard} was fetched at mount:\n{show(early)}"
    assert len(list((mnt / CSV_GZ).iterdir())) == 424
    assert (mnt / CSV_GZ / "000007" / "fare.json").read_bytes()
    assert (mnt / CSV_GZ / "000300" / "fare.json").read_bytes()
    size = (realdata / CSV_GZ).stat().st_size
    assert len(block_gets(s3.proxy, s3.path(f"gz/{CSV_GZ}"), size)) == 1


# --- (c) DALI NAME.idx -------------------------------------------------------------------

DALI_SHARDS = [MNIST_TFDS, CAPTCHA_TRAIN, LITE_TEST]


def dali_copy(tmp_path: Path, realdata: Path) -> Path:
    """A local copy of some uncompressed shards with the DALI indexes ``tfrfs index`` writes."""
    src = copy_shards(tmp_path / "src", DALI_SHARDS, realdata)
    proc = cli("index", str(src), "--format", "dali", "--cache-dir", str(tmp_path / "local-cache"))
    assert proc.returncode == 0, proc.stderr
    for rel in DALI_SHARDS:
        idx = src / f"{rel}.idx"
        assert idx.read_bytes() == loader_index_text(record_offsets(src / rel)), f"{idx}: not a DALI index"
    return src


def test_dali_index_beside_a_remote_shard_is_used(realdata: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    src = dali_copy(tmp_path, realdata)
    s3.upload_tree(src, "dali")
    mnt = tfrfs_mount(s3.url("dali"), "--cache-dir", str(tmp_path / "empty"))
    for rel in DALI_SHARDS:
        assert_no_scan(s3.proxy, s3.path(f"dali/{rel}"), src / rel)
        assert gets_of(s3.proxy, s3.path(f"dali/{rel}.idx")), f"{rel}.idx was not read"
    assert len(blocks_fetched(block_gets(s3.proxy, s3.path(f"dali/{MNIST_TFDS}"), (src / MNIST_TFDS).stat().st_size),
                              1)) < n_blocks((src / MNIST_TFDS).stat().st_size)
    local = tfrfs_mount(src, "--cache-dir", str(tmp_path / "local-cache2"))
    diff = differences(snapshot(local, DALI_SHARDS), snapshot(mnt, DALI_SHARDS))
    assert not diff, "\n".join(diff)


def test_wrong_dali_index_is_ignored_and_reported(realdata: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    """An index of another shard, and one edited so that its last record starts 8 bytes late
    (the lines still follow each other and end at the shard's size), are not trusted: the mount
    scans and shows the right records."""
    src = dali_copy(tmp_path, realdata)
    (src / f"{CAPTCHA_TRAIN}.idx").write_bytes(loader_index_text(record_offsets(realdata / CAPTCHA_VALID)))
    offsets = record_offsets(src / MNIST_TFDS)
    offsets[-2] += 8
    (src / f"{MNIST_TFDS}.idx").write_bytes(loader_index_text(offsets))
    s3.upload_tree(src, "dali")
    mnt = tfrfs_mount(s3.url("dali"), "--cache-dir", str(tmp_path / "empty"))
    for rel in (MNIST_TFDS, CAPTCHA_TRAIN):
        assert_scanned(s3.proxy, s3.path(f"dali/{rel}"), (src / rel).stat().st_size)
    assert len(list((mnt / MNIST_TFDS).iterdir())) == 10000
    assert len(list((mnt / CAPTCHA_TRAIN).iterdir())) == 196
    # The right records: as a local mount of the same shards without index files shows them.
    orig = tfrfs_mount(copy_shards(tmp_path / "orig", DALI_SHARDS, realdata),
                       "--cache-dir", str(tmp_path / "orig-cache"))
    diff = differences(snapshot(orig, DALI_SHARDS), snapshot(mnt, DALI_SHARDS, hide=lambda n: n.endswith(".idx")))
    assert not diff, "\n".join(diff)
    # Ignored and reported (SPEC 1.2): in the daemon's log or .tfrfs/errors.
    reported = tfrfs_mount.log_text(mnt) + (mnt / ".tfrfs" / "errors").read_text()
    for rel in (MNIST_TFDS, CAPTCHA_TRAIN):
        assert f"{Path(rel).name}.idx" in reported, f"ignoring {rel}.idx was not reported:\n{reported[-3000:]}"


# --- (d) the tfrecord package's .tfindex --------------------------------------------------

def test_tfindex_beside_a_remote_shard_is_used(realdata: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    """``STEM.tfindex`` (what the tfrecord package's ``create_indices`` writes) and
    ``NAME.tfindex``, the same text as DALI's; two shards of four blocks each."""
    rels = [TFX_MNIST, MNIST_NB]
    src = copy_shards(tmp_path / "src", rels, realdata)
    stem_index = Path(TFX_MNIST).with_name("mnist.tfindex").as_posix()
    (src / stem_index).write_bytes(loader_index_text(record_offsets(src / TFX_MNIST)))
    (src / f"{MNIST_NB}.tfindex").write_bytes(loader_index_text(record_offsets(src / MNIST_NB)))
    s3.upload_tree(src, "tfi")
    mnt = tfrfs_mount(s3.url("tfi"), "--cache-dir", str(tmp_path / "empty"))
    for rel in rels:
        assert_no_scan(s3.proxy, s3.path(f"tfi/{rel}"), src / rel)
    assert gets_of(s3.proxy, s3.path(f"tfi/{stem_index}"))
    assert gets_of(s3.proxy, s3.path(f"tfi/{MNIST_NB}.tfindex"))
    local = tfrfs_mount(src, "--cache-dir", str(tmp_path / "local-cache"))
    diff = differences(snapshot(local, rels), snapshot(mnt, rels))
    assert not diff, "\n".join(diff)


# --- (e) --index-dir -----------------------------------------------------------------------

def test_index_dir_with_dali_indexes_of_a_local_copy(realdata: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    src = copy_shards(tmp_path / "src", DALI_SHARDS, realdata)
    s3.upload_tree(src, "plain")
    out = tmp_path / "indexes"
    out.mkdir()
    proc = cli("index", str(src), "--format", "dali", "--out-dir", str(out), "--cache-dir", str(tmp_path / "lc"))
    assert proc.returncode == 0, proc.stderr
    assert all((out / f"{rel}.idx").is_file() for rel in DALI_SHARDS), sorted(out.rglob("*"))   # mirrored
    s3.proxy.reset()
    mnt = tfrfs_mount(s3.url("plain"), "--cache-dir", str(tmp_path / "empty"), "--index-dir", str(out))
    for rel in DALI_SHARDS:
        assert_no_scan(s3.proxy, s3.path(f"plain/{rel}"), src / rel)
    local = tfrfs_mount(src, "--cache-dir", str(tmp_path / "local-cache"))
    diff = differences(snapshot(local, DALI_SHARDS), snapshot(mnt, DALI_SHARDS))
    assert not diff, "\n".join(diff)


def test_index_dir_with_tfrfs_indexes_checks_the_identity(realdata: Path, s3, tfrfs_mount, tmp_path: Path) -> None:
    """``NAME.tfrfs-idx`` files carry the shard's size and identity: those made from the bucket
    (ETags) are used; those made from a local copy (the same bytes, but another identity) are
    ignored (SPEC 1.2), and the mount scans."""
    rels = [MNIST_TFDS, CAPTCHA_TRAIN]
    src = copy_shards(tmp_path / "src", rels, realdata)
    s3.upload_tree(src, "plain")
    from_bucket, from_local = tmp_path / "from-bucket", tmp_path / "from-local"
    from_bucket.mkdir()
    from_local.mkdir()
    proc = cli("index", s3.url("plain"), "--out-dir", str(from_bucket), "--cache-dir", str(tmp_path / "c1"))
    assert proc.returncode == 0, proc.stderr
    proc = cli("index", str(src), "--out-dir", str(from_local), "--cache-dir", str(tmp_path / "c2"))
    assert proc.returncode == 0, proc.stderr
    for folder in (from_bucket, from_local):
        assert all((folder / f"{rel}.tfrfs-idx").is_file() for rel in rels), sorted(folder.rglob("*"))

    s3.proxy.reset()
    used = tfrfs_mount(s3.url("plain"), "--cache-dir", str(tmp_path / "empty1"), "--index-dir", str(from_bucket))
    for rel in rels:
        assert_no_scan(s3.proxy, s3.path(f"plain/{rel}"), src / rel)
    assert len(list((used / MNIST_TFDS).iterdir())) == 10000

    s3.proxy.reset()
    ignored = tfrfs_mount(s3.url("plain"), "--cache-dir", str(tmp_path / "empty2"), "--index-dir", str(from_local))
    for rel in rels:
        assert_scanned(s3.proxy, s3.path(f"plain/{rel}"), (src / rel).stat().st_size)
    diff = differences(snapshot(used, rels), snapshot(ignored, rels))
    assert not diff, "\n".join(diff)
