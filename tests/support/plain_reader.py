"""A second local-file reader for the shard-reader seam: plain ``open()`` / ``read()``, no fast paths.

It answers only what every backend must (size, identity, ``pread``); ``record``, ``borrow`` and
``serve`` are the seam's defaults. The whole mount suite runs once more on it
(``TFRFS_SHARD_READER=plain_reader:PlainReader``, see scripts/test): proof that nothing above the
seam depends on the local reader's descriptors, read-ahead or ``read_buf`` path.
"""

from __future__ import annotations

import os
import threading

from tfrfs.storage.readers import ShardReader


class PlainReader(ShardReader):
    def __init__(self, path: str) -> None:
        self._file = open(path, "rb", buffering=0)
        st = os.fstat(self._file.fileno())
        self.size = st.st_size
        self.identity = f"{st.st_size}:{st.st_mtime_ns}"
        self._lock = threading.Lock()   # seek and read are one step

    def pread(self, size: int, offset: int) -> bytes:
        with self._lock:
            self._file.seek(offset)
            parts = []
            while size > 0:
                got = self._file.read(size)
                if not got:
                    break
                parts.append(got)
                size -= len(got)
        return b"".join(parts)

    def close(self) -> None:
        self._file.close()
