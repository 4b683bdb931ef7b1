"""``tfrfs pack FOLDER s3://bucket/prefix`` (SPEC 10): DEST a bucket prefix, written as ``tfrfs
reshard`` writes one (a marker first, the manifest last), and read back from the bucket."""

from __future__ import annotations

from pathlib import Path

from conftest import run_tfrfs


def test_pack_into_a_bucket(s3, tmp_path: Path) -> None:
    src = tmp_path / "folder"
    for i in range(5):
        (src / f"r{i}").mkdir(parents=True)
        (src / f"r{i}" / "label.json").write_text(f"[{i}]\n")
        (src / f"r{i}" / "caption.txt").write_text(f"record {i}\n")
    dest = s3.url("packed")
    proc = run_tfrfs("pack", str(src), dest, "--shards", "2", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    keys = s3.keys("packed/")
    assert "packed/.tfrfs-manifest" in keys
    assert [k for k in keys if k.endswith(".tfrecord")] == ["packed/folder-00000-of-00002.tfrecord",
                                                              "packed/folder-00001-of-00002.tfrecord"]
    assert not [k for k in keys if "commit" in k or "receipt" in k]   # the marker and receipts are gone
    proc = run_tfrfs("verify", dest, "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    assert "2 shards, 5 records checked, 0 problem(s)" in proc.stdout, proc.stdout
    # a second pack into the same prefix is refused: DEST is not empty
    proc = run_tfrfs("pack", str(src), dest, "--workers", "1")
    assert proc.returncode == 2 and "DEST is not empty" in proc.stderr
