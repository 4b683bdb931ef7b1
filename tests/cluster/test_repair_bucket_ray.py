"""``tfrfs repair s3://... --ray ADDRESS`` (SPEC 8): the Ray tasks write the repaired shards into
the bucket, and the bucket comes out as ``--workers 1`` leaves it, with the same output."""

from __future__ import annotations

import json
from pathlib import Path


from support import jobdata


def _objects(s3, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix``, by key below it; the manifest without the objects' times."""
    got = {k[len(prefix) + 1:]: s3.get(k) for k in s3.keys(prefix + "/")}
    doc = json.loads(got[".tfrfs-manifest"])
    for e in doc["dirs"] + doc["files"] + doc["shards"]:
        e.pop("mtime_ns")
    got[".tfrfs-manifest"] = json.dumps(doc, sort_keys=True).encode()
    return got


def test_a_bucket_repaired_on_ray_is_what_one_process_makes_of_it(ray_local_s3, s3, tmp_path: Path) -> None:
    data = jobdata.make(tmp_path / "data")
    outputs = {}
    for prefix, how in (("one", ("--workers", "1")), ("ray", ("--ray", ray_local_s3.address))):
        s3.upload_tree(data, prefix)
        url = s3.url(prefix)
        assert jobdata.run("index", "--beside", "--workers", "1", url, cache=tmp_path / f"i-{prefix}")[0] == 1
        code, out = jobdata.run("repair", *how, url, cache=tmp_path / prefix)
        outputs[prefix] = (code, out.replace(url, "SRC"))
    assert outputs["one"] == outputs["ray"]
    assert outputs["one"][0] == 0 and "big.tfrecord: repaired: kept 2,998 records" in outputs["one"][1]
    one, on_ray = _objects(s3, "one"), _objects(s3, "ray")
    assert sorted(one) == sorted(on_ray)
    assert one == on_ray
    assert ".tfrfs-damaged/big.tfrecord" in one
