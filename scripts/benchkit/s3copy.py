"""The ceiling of the remote mode: a plain s3fs copy of one object to a local file, run as its own
process (as each file system under test is), so that the S3 server's threads in the benchmark's
process do not share an interpreter with the client.

    python s3copy.py ENDPOINT BUCKET/KEY DEST

Credentials come from the environment (AWS_ACCESS_KEY_ID, ...). Prints one JSON line: the
seconds ``get_file`` took and the bytes written. The client's session is set up before the
clock starts; the object itself is fetched cold.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    endpoint, path, dest = argv
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True, use_listings_cache=False)
    fs.connect()
    t0 = time.perf_counter()
    fs.get_file(path, dest)
    elapsed = time.perf_counter() - t0
    print(json.dumps({"seconds": elapsed, "bytes": os.path.getsize(dest)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
