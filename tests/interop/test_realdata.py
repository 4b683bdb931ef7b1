"""Real TFRecord files from public repositories, mounted and compared with TensorFlow's view.

The tree under ``conftest.REALDATA`` (see its MANIFEST.txt) is mounted as one directory SOURCE
and every shard folder is compared with ``tests/tf_oracle.py`` run on the same directory:
DeepLab PNG/JPEG, raccoon object detection, two TFDS MNIST splits (with their
``dataset_info.json`` / ``features.json`` as plain files), TFX GZIP shards including
SequenceExamples and Features with no kind set, captcha int16 raw pixels, raw image bytes
without shape features, and two damaged files.

Large shards are sampled (first 20, last 5 and 25 seeded-random records are compared in full);
the listing of every shard folder is always compared in full.
"""

from __future__ import annotations

import errno
import json
import os

import pytest

from conftest import REALDATA, run_tfrfs
from test_interop_tf import (_need_tf_and_fuse, check_error_lines, check_metadata, compare, get_xattr,
                             read_errors, report, run_oracle, walk)

pytestmark = [pytest.mark.tf, pytest.mark.mount]

SAMPLE = 100  # shards with more records than this are sampled

OD = "Tensorflow-Ion-Detetection/models/research/object_detection/test_data"
PETS = f"{OD}/pets_examples.record"
SERENGETI = f"{OD}/snapshot_serengeti_sequence_examples.record"
DEEPLAB = "Tensorflow-Ion-Detetection/models/research/deeplab/testing/pascal_voc_seg/val-00000-of-00001.tfrecord"
TFX_CSV = "tfx/tfx/components/testdata/csv_example_gen/Split-eval/data_tfrecord-00000-of-00012.gz"
TFX_SEQ = "tfx/tfx/components/testdata/external/tfrecord_sequence/data_tfrecord-00000-of-00001.gz"
CAPTCHA = "captcha_recognize/data/train.tfrecords"
DIGITS = "Multiple-Digits/data/val.tfrecords"
TFDS = "tensorflow_datasets/mnist/3.0.1"


@pytest.fixture(scope="module")
def real() -> dict:
    if not REALDATA.is_dir():
        pytest.skip(f"no real data at {REALDATA}")
    _need_tf_and_fuse()
    return run_oracle(REALDATA, sample=SAMPLE)[str(REALDATA)]


def _record_names(listing: list[str], expected: list[list[str]]) -> list[str]:
    """Mismatches between a shard folder's listing and the oracle's per-record alternatives."""
    got = set(listing)
    out = []
    for alts in expected:
        hit = [a for a in alts if a in got]
        if len(hit) != 1:
            out.append(f"record {alts[0]}: expected exactly one of {alts}, listing has {hit}")
        got -= set(hit)
    if got:
        out.append(f"unexpected entries {sorted(got)[:10]}")
    return out


def test_realdata_matches_tensorflow(real, tfrfs_mount):
    mnt = tfrfs_mount(REALDATA)
    shards = real["shards"]
    only = {}
    for rel, s in shards.items():
        if s["sampled"] is not None:
            keep = set()
            for i in s["sampled"]:
                keep.update(s["names"][i])
            only[rel] = keep
    actual = walk(mnt, only=only)
    problems: list[str] = []

    # 1. every shard folder lists exactly its records (SPEC 2), sampled or not
    for rel, s in shards.items():
        node = actual.get(rel)
        if node is None or not node.is_dir:
            problems.append(f"{rel!r}: shard folder missing (got {'a file' if node else 'nothing'})")
            continue
        if node.children is None:
            problems.append(f"{rel!r}: shard folder could not be listed (errno {node.list_err})")
            continue
        problems += [f"{rel!r}: {m}" for m in _record_names(node.children, s["names"])]

    # 2. the sampled records (and everything else) in full: paths, bytes, stat sizes
    sampled_names = {rel: {n for alts in s["names"] for n in alts} for rel, s in shards.items() if s["sampled"] is not None}
    trimmed = {}
    for p, n in actual.items():
        parent, _, name = p.rpartition("/")
        if parent in sampled_names and name not in only[parent]:
            continue  # a record outside the sample: its name was checked in step 1
        trimmed[p] = n
    problems += compare(trimmed, real)
    problems += check_metadata(mnt, trimmed, real)

    # 3. damaged files (SPEC 6) and their .tfrfs/errors lines
    lines, bad = read_errors(mnt)
    if bad:
        problems.append(f".tfrfs/errors lines that are not JSON objects: {bad[:5]!r}")
    problems += check_error_lines(lines, real)
    assert not problems, report(problems)


def test_realdata_specific_cases(real, tfrfs_mount):
    """The cases MANIFEST.txt points out, asserted one by one with the SPEC line that decides."""
    mnt = tfrfs_mount(REALDATA)
    problems: list[str] = []

    def check(cond: bool, msg: str) -> None:
        if not cond:
            problems.append(msg)

    # SPEC 1: "any other regular file (TFDS dataset_info.json, features.json, label maps) is shown
    # as a read-only plain file" -- and so is MANIFEST.txt.
    for rel in ("MANIFEST.txt", f"{TFDS}/dataset_info.json", f"{TFDS}/features.json"):
        p = mnt / rel
        check(p.is_file() and p.read_bytes() == (REALDATA / rel).read_bytes(), f"{rel}: not the same plain file")
        check(p.is_file() and (p.stat().st_mode & 0o777) == 0o444, f"{rel}: not mode 0444")
        try:
            with open(p, "ab"):
                pass
            problems.append(f"{rel}: opened for writing in a read-only mount")
        except OSError as exc:
            check(exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM), f"{rel}: write open errno {exc.errno}")

    # pets_examples.record: record 0's data checksum fails, the header after it (offset 18446) has
    # a bad length checksum. SPEC 6: "A record whose data checksum fails: still listed; reading any
    # of its files fails with EIO"; "A record header whose length checksum fails ...: the shard folder
    # shows the records before it" -> exactly one entry, record 0, unreadable. TensorFlow itself
    # returns no record at all (DataLossError at once).
    check(real["shards"][PETS]["tf_count"] == 0, "TensorFlow read records from pets_examples.record?")
    listing = sorted(os.listdir(mnt / PETS))
    check(listing in (["000000"], ["000000.bin"]), f"{PETS}: listing {listing}, expected the one damaged record")
    for name in listing:
        target = mnt / PETS / name
        files = [target] if target.is_file() else []
        if target.is_dir():
            try:
                files = [p for p in target.rglob("*") if p.is_file()]
            except OSError as exc:
                check(exc.errno == errno.EIO, f"{PETS}/{name}: listing errno {exc.errno}")
        for f in files:
            try:
                f.read_bytes()
                problems.append(f"{f}: a file of a record with a bad data checksum was readable")
            except OSError as exc:
                check(exc.errno == errno.EIO, f"{f}: errno {exc.errno}, expected EIO")

    # snapshot_serengeti_sequence_examples.record: its only header has a valid length checksum but
    # declares 820669 bytes where 820665 remain (the git CRLF-normalised copy lost 4 bytes).
    # SPEC 1: "a file is a shard when its first record header has a valid length checksum" -> a
    # shard folder, not a plain file; SPEC 6: "a file cut short: the shard folder shows the records
    # before it" -> an empty shard folder, and an error line at offset 0.
    s = real["shards"].get(SERENGETI)
    check(s is not None and s["count"] == 0, f"oracle: {SERENGETI} should be a shard of 0 records")
    check((mnt / SERENGETI).is_dir(), f"{SERENGETI}: not shown as a shard folder")
    if (mnt / SERENGETI).is_dir():
        check(os.listdir(mnt / SERENGETI) == [], f"{SERENGETI}: lists {os.listdir(mnt / SERENGETI)[:5]}")
    lines, _ = read_errors(mnt)
    check(any(o.get("shard") == SERENGETI and o.get("offset") == 0 for o in lines),
          f"{SERENGETI}: no .tfrfs/errors line at offset 0")
    check(any(o.get("shard") == PETS and o.get("index") == 0 and o.get("offset") == 0 for o in lines),
          f"{PETS}: no .tfrfs/errors line for record 0 at offset 0")
    check(any(o.get("shard") == PETS and o.get("offset") == 18446 for o in lines),
          f"{PETS}: no .tfrfs/errors line for the bad header at offset 18446")

    # TFX writes Features with no kind set: SPEC 3.2 "a Feature with no kind set -> KEY.json: null".
    rec = mnt / TFX_CSV / "000000"
    check((rec / "company.json").read_bytes() == b"null\n", f"{TFX_CSV}/000000/company.json is not null")
    check(get_xattr(str(rec / "company.json"), "user.tfrfs.kind") == "none", "company.json kind is not none")
    # TFX SequenceExamples: SPEC 4, context/ and feature_lists/.
    rec = mnt / TFX_SEQ / "000000"
    check(sorted(os.listdir(rec)) == ["context", "feature_lists"], f"{TFX_SEQ}/000000: {sorted(os.listdir(rec))}")
    check(real["shards"][TFX_SEQ]["kind"] == "sequence", "oracle: TFX sequence shard not sequence")

    # captcha: int16 pixels, 2 bytes each, height/width only. SPEC 3.3: "the value's length is
    # exactly height x width x channels with channels 1, 3 or 4 ... Any other size ... stays .bin".
    rec = mnt / CAPTCHA / "000000"
    h = json.loads((rec / "height.json").read_text())[0]
    w = json.loads((rec / "width.json").read_text())[0]
    raw = (rec / "image_raw.bin").read_bytes() if (rec / "image_raw.bin").exists() else b""
    check(len(raw) == h * w * 2, f"{CAPTCHA}/000000/image_raw.bin: {len(raw)} bytes, expected {h}x{w}x2")
    check(not (rec / "image_raw.png").exists(), f"{CAPTCHA}: int16 pixels decoded as PNG")

    # Multiple-Digits: raw image bytes with no shape features -> .bin (SPEC 3.2, 3.3).
    check((mnt / DIGITS / "000000" / "image.bin").is_file(), f"{DIGITS}/000000/image.bin missing")

    # DeepLab: JPEG image and PNG segmentation map by their magic bytes (SPEC 3.2).
    rec = mnt / DEEPLAB / "000000" / "image"
    check((rec / "encoded.jpg").is_file(), "DeepLab image/encoded.jpg missing")
    check((rec / "segmentation" / "class" / "encoded.png").is_file(), "DeepLab segmentation PNG missing")
    assert not problems, report(problems)


def test_realdata_verify_reports_damage(real):
    """``tfrfs verify`` exits 1 on the real tree (two damaged files) and names them (SPEC 6, 8)."""
    proc = run_tfrfs("verify", str(REALDATA), timeout=300)
    assert proc.returncode == 1, f"verify exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    out = proc.stdout + proc.stderr
    for rel in (PETS, SERENGETI):
        assert os.path.basename(rel) in out, f"verify does not mention {rel}"
    proc = run_tfrfs("verify", str(REALDATA / "tfx"), timeout=300)
    assert proc.returncode == 0, f"verify of the clean tfx tree exited {proc.returncode}:\n{proc.stdout[-2000:]}"
