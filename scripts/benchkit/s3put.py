"""The floor of a bucket commit's uploads: local files uploaded by s3fs's ``put_file`` (as
``aws s3 cp`` would), in a process of its own.

    python s3put.py ENDPOINT BUCKET/PREFIX FILE...

Credentials come from the environment. Prints one JSON line: the seconds the uploads took. The
client's session is set up before the clock starts.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    endpoint, prefix, *files = argv
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True, use_listings_cache=False)
    fs.connect()
    t0 = time.perf_counter()
    for path in files:
        fs.put_file(path, f"{prefix}/{os.path.basename(path)}")
    print(json.dumps({"seconds": time.perf_counter() - t0}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
