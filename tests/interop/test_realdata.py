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
from test_interop_tf import (REALDATA_DAMAGED, _need_tf_and_fuse, check_error_lines, check_metadata,
                             check_verify_json, check_verify_text, compare, get_xattr, read_errors, report,
                             run_oracle, walk)

pytestmark = [pytest.mark.tf, pytest.mark.mount]

SAMPLE = 100  # shards with more records than this are sampled

PETS, SERENGETI = REALDATA_DAMAGED
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

    # pets_examples.record, a CRLF-normalised copy: every CR LF of the original became LF, so the
    # records whose bytes held one lost bytes. What salvage (the damage contract) finds, computed
    # by the oracle's own framing reader and asserted here:
    #   000000.bin  offset 0       data crc fails (its bytes do not parse: a .bin file, EIO)
    #   gap         offset 18446   bad length crc, resync at 165555 (147109 bytes skipped)
    #   000001-3    offsets 165555, ... sound Examples
    #   000004.bin  offset 278603  data crc fails
    #   gap         offset 417648  bad length crc, resync at 549719 (132071 bytes skipped)
    #   000005      offset 549719  a sound Example
    #   000006.bin  offset 560826  data crc fails
    #   cut         offset 782442  no sound record to the end (91459 bytes skipped)
    # TensorFlow itself returns no record at all (DataLossError at once).
    s = real["shards"][PETS]
    check(s["tf_count"] == 0, "TensorFlow read records from pets_examples.record?")
    want = [{"type": "data_crc", "index": 0, "offset": 0},
            {"type": "gap", "index": 1, "offset": 18446, "resync_offset": 165555, "skipped": 147109},
            {"type": "data_crc", "index": 4, "offset": 278603},
            {"type": "gap", "index": 5, "offset": 417648, "resync_offset": 549719, "skipped": 132071},
            {"type": "data_crc", "index": 6, "offset": 560826},
            {"type": "cut", "index": 7, "offset": 782442, "skipped": 91459}]
    got = [{k: v for k, v in p.items() if k != "why"} for p in s["problems"]]
    check(got == want, f"oracle: {PETS} problems {got}")
    check(s["records_ok"] == [False, True, True, True, False, True, False], f"oracle: {PETS} records {s['records_ok']}")
    listing = sorted(os.listdir(mnt / PETS))
    check(listing == ["000000.bin", "000001", "000002", "000003", "000004.bin", "000005", "000006.bin"],
          f"{PETS}: listing {listing}")
    for name in ("000000.bin", "000004.bin", "000006.bin"):
        try:
            (mnt / PETS / name).read_bytes()
            problems.append(f"{PETS}/{name}: a record with a bad data checksum was readable")
        except OSError as exc:
            check(exc.errno == errno.EIO, f"{PETS}/{name}: errno {exc.errno}, expected EIO")
    for name, off in (("000001", "165555"), ("000005", "549719")):
        check((mnt / PETS / name / "image" / "encoded.jpg").is_file(), f"{PETS}/{name}: no image/encoded.jpg")
        check(get_xattr(str(mnt / PETS / name), "user.tfrfs.offset") == off, f"{PETS}/{name}: offset xattr not {off}")

    # snapshot_serengeti_sequence_examples.record: its only header has a valid length checksum but
    # declares 820669 bytes where 820665 remain (the CRLF-normalised copy lost 4 bytes).
    # SPEC 1: "a file is a shard when its first record header has a valid length checksum" -> a
    # shard folder, not a plain file; salvage finds no offset where a header, a length that fits
    # and a data checksum all hold -> an empty shard folder, one problem at offset 0 that skips
    # the whole file.
    s = real["shards"].get(SERENGETI)
    check(s is not None and s["count"] == 0, f"oracle: {SERENGETI} should be a shard of 0 records")
    if s is not None:
        got = [{k: v for k, v in p.items() if k != "why"} for p in s["problems"]]
        check(got == [{"type": "cut", "index": 0, "offset": 0, "skipped": 820681}], f"oracle: {SERENGETI} problems {got}")
    check((mnt / SERENGETI).is_dir(), f"{SERENGETI}: not shown as a shard folder")
    if (mnt / SERENGETI).is_dir():
        check(os.listdir(mnt / SERENGETI) == [], f"{SERENGETI}: lists {os.listdir(mnt / SERENGETI)[:5]}")
    lines, _ = read_errors(mnt)
    check(any(o.get("shard") == SERENGETI and o.get("offset") == 0 and o.get("index") == 0
              and o.get("skipped") == 820681 for o in lines),
          f"{SERENGETI}: no .tfrfs/errors line at offset 0 skipping 820681 bytes")
    check(any(o.get("shard") == PETS and o.get("index") == 0 and o.get("offset") == 0 for o in lines),
          f"{PETS}: no .tfrfs/errors line for record 0 at offset 0")
    check(any(o.get("shard") == PETS and o.get("offset") == 18446 and o.get("resync_offset") == 165555
              for o in lines), f"{PETS}: no .tfrfs/errors line for the gap at offset 18446")

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
    """``tfrfs verify`` exits 1 on the real tree (two damaged files), a line per problem, and
    ``--json`` agrees with the oracle (SPEC 6, 8); 0 on a clean part of it."""
    proc = run_tfrfs("verify", str(REALDATA), timeout=300)
    assert proc.returncode == 1, f"verify exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    problems = check_verify_text(proc.stdout, real)
    proc = run_tfrfs("verify", "--json", str(REALDATA), timeout=300)
    if proc.returncode != 1:
        problems.append(f"verify --json exited {proc.returncode}")
    try:
        doc = json.loads(proc.stdout)
    except ValueError as exc:
        problems.append(f"verify --json printed no JSON document ({exc}): {proc.stdout[:500]!r}")
    else:
        problems += check_verify_json(doc, real)
    proc = run_tfrfs("verify", str(REALDATA / "tfx"), timeout=300)
    if proc.returncode != 0:
        problems.append(f"verify of the clean tfx tree exited {proc.returncode}:\n{proc.stdout[-2000:]}")
    assert not problems, report(problems)
