"""``scripts/bench --remote``'s commit figures (SPEC 7.1): a ``--rw`` mount of a bucket prefix
commits through the manifest.

Two datasets in the bucket (behind the proxy that adds latency and counts every request):

* ``commit-one/``: one shard of about 100 MB (records of ~100 KB); one record's label changed;
* ``commit-ten/``: ten shards of about 10 MB; one record changed in each.

For each, a ``--rw`` mount with a fresh cache, the edits made, then ``tfrfs commit MOUNTPOINT``
timed with the proxy's log reset just before: seconds, requests (by method) and bytes uploaded.
Against it, the floor: the same new shard files (fetched back from the bucket) uploaded by
s3fs's ``put_file`` in a process of its own (``s3put.py``), as ``aws s3 cp`` would, timed and
counted the same way.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .common import REPO, WORK, progress, run

PUT_SCRIPT = Path(__file__).with_name("s3put.py")
RECORD_BYTES = 100_000


def _example(i: int, payload: int) -> bytes:
    sys.path.insert(0, str(REPO))
    from tfrfs.format import proto
    ex = proto.Example()
    ex.features.feature["label"].int64_list.value.append(i % 10)
    ex.features.feature["blob"].bytes_list.value.append(bytes([i % 251]) * payload)
    return ex.SerializeToString()


def _dataset(root: Path, shards: int, shard_bytes: int) -> Path:
    from tfrfs.format import tfrecord
    if root.exists():
        return root
    tmp = root.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    per_shard = max(1, shard_bytes // RECORD_BYTES)
    for n in range(shards):
        with open(tmp / f"data-{n:05d}-of-{shards:05d}.tfrecord", "wb") as f:
            for i in range(per_shard):
                f.write(tfrecord.frame(_example(n * per_shard + i, RECORD_BYTES)))
    tmp.rename(root)
    return root


def _traffic(bucket: Any) -> dict[str, Any]:
    by_method: dict[str, int] = {}
    sent = 0
    for r in bucket.proxy.requests:
        by_method[r.method] = by_method.get(r.method, 0) + 1
        if r.method in ("PUT", "POST"):
            sent += r.sent
    return {"requests": sum(by_method.values()), "by_method": by_method, "uploaded_mib": sent / 2**20}


def _commit_case(bucket: Any, name: str, src: Path, edits: int) -> dict[str, Any]:
    prefix = f"commit-{name}"
    for path in sorted(src.glob("*.tfrecord")):
        bucket.upload(path, f"{prefix}/{path.name}")
    url = bucket.url(prefix)
    mnt = WORK / f"mnt-commit-{name}"
    cache = WORK / f"commit-cache-{name}"
    shutil.rmtree(cache, ignore_errors=True)
    mnt.mkdir(parents=True, exist_ok=True)
    env = bucket.env
    run([sys.executable, "-m", "tfrfs", "mount", url, str(mnt), "--rw", "--cache-dir", str(cache)], env=env)
    try:
        shards = sorted(p.name for p in mnt.iterdir() if p.name.endswith(".tfrecord"))[:edits]
        for shard in shards:
            records = sorted(p.name for p in (mnt / shard).iterdir())
            (mnt / shard / records[len(records) // 2] / "label.json").write_text("[99]\n")
        bucket.proxy.reset()
        t0 = time.perf_counter()
        run([sys.executable, "-m", "tfrfs", "commit", str(mnt)], env=env)
        seconds = time.perf_counter() - t0
        traffic = _traffic(bucket)
    finally:
        run([sys.executable, "-m", "tfrfs", "umount", str(mnt)], env=env)
    doc = json.loads(bucket.s3.client().get_object(Bucket="bench", Key=f"{prefix}/.tfrfs-manifest")["Body"].read())
    new = [e["object"] for e in doc["shards"] if e.get("object")]
    # The floor: the same new shard files uploaded by s3fs, as a plain copy would.
    local = WORK / f"commit-new-{name}"
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir(parents=True)
    files = []
    for i, key in enumerate(new):
        target = local / f"{i:05d}.tfrecord"
        bucket.s3.client().download_file("bench", f"{prefix}/{key}", str(target))
        files.append(str(target))
    bucket.proxy.reset()
    proc = subprocess.run([sys.executable, str(PUT_SCRIPT), bucket.proxy.url, f"bench/{prefix}-put", *files],
                          env=env, capture_output=True, text=True, check=True)
    put = {**json.loads(proc.stdout.strip().splitlines()[-1]), **_traffic(bucket)}
    shutil.rmtree(local, ignore_errors=True)
    new_mib = sum(e["size"] for e in doc["shards"] if e.get("object")) / 2**20
    return {"shards_changed": len(shards), "new_mib": new_mib, "commit_s": seconds,
            **{f"commit_{k}": v for k, v in traffic.items()}, "put": put}


def measure_commits(bucket: Any) -> dict[str, Any]:
    progress("commit figures: one record in a 100 MB shard, one record in each of ten 10 MB shards")
    one = _dataset(WORK / "commit-data-one", 1, 100 << 20)
    ten = _dataset(WORK / "commit-data-ten", 10, 10 << 20)
    return {"one": _commit_case(bucket, "one", one, 1), "ten": _commit_case(bucket, "ten", ten, 10)}


def print_commits(res: dict[str, Any]) -> None:
    print("\ncommit of a --rw mount of a bucket (SPEC 7.1), through the proxy:")
    rows = [("case", "new shards MiB", "commit s", "requests (by method)", "uploaded MiB",
             "s3fs put of the new shards: s", "its requests", "its MiB")]
    for key, label in (("one", "1 record in a 100 MB shard"), ("ten", "1 record in each of 10 shards of 10 MB")):
        r = res[key]
        methods = ", ".join(f"{m} {n}" for m, n in sorted(r["commit_by_method"].items()))
        rows.append((label, f"{r['new_mib']:.1f}", f"{r['commit_s']:.2f}", f"{r['commit_requests']} ({methods})",
                     f"{r['commit_uploaded_mib']:.1f}", f"{r['put']['seconds']:.2f}", str(r["put"]["requests"]),
                     f"{r['put']['uploaded_mib']:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
