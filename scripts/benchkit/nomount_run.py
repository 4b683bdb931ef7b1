"""One reader of ``scripts/bench --no-mount``, run as a process of its own with the interpreter
whose packages it needs (tfrfs's, or ratarmount's venv): walk a tree and read every small file,
one after the other, and print the figures as JSON.

    python nomount_run.py tfrfs SOURCE CACHE FILES.json
    python nomount_run.py ratar TAR - FILES.json
    python nomount_run.py files MOUNTPOINT - FILES.json
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    kind, where, cache, list_path = argv
    with open(list_path) as f:
        small = json.load(f)["small_files"]
    t0 = time.perf_counter()
    if kind == "files":
        fs = None
    elif kind == "tfrfs":
        import fsspec
        fs = fsspec.filesystem("tfrfs", fo=where, cache_dir=cache)
    else:
        import fsspec
        fs = fsspec.filesystem("ratar", fo=where)
    opened = time.perf_counter()
    entries = 0
    if fs is None:
        for _, dirs, files in os.walk(os.path.join(where, "small")):
            entries += len(dirs) + len(files)
    else:
        entries = len(fs.find("small", withdirs=True))
    walked = time.perf_counter()
    total = 0
    for rel in small:
        if fs is None:
            with open(os.path.join(where, rel), "rb", buffering=0) as f:
                total += len(f.read())
        else:
            total += len(fs.cat_file(rel))
    read = time.perf_counter()
    print(json.dumps({"open_s": opened - t0, "walk_s": walked - opened, "entries": entries,
                      "read_s": read - walked, "files": len(small), "bytes": total}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
