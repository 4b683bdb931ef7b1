"""``tfrfs://`` (SPEC 10): the tree a read-only mount shows, as an fsspec filesystem, for the
places with no ``/dev/fuse`` or no right to mount, and for every tool that takes fsspec URLs.

It is the mount's own namespace (``dataset.assembly.open_mount``, read-only, from the dataset's
manifest when it has one): the same paths, sizes, times and bytes, answered by the same tree
(``view.tree``), which knows nothing of FUSE or fsspec. Only the last step is its own: a node's
``Stat`` into an fsspec info dict, a path into a node.

``fsspec.filesystem("tfrfs", fo=SOURCE)`` (SOURCE as ``tfrfs mount`` takes it), or a chained URL
such as ``tfrfs://SHARD/RECORD/image.jpg::s3://bucket/ds``: fsspec then hands the part after
``::`` here as ``fo`` with its protocol (``target_protocol``) and options (``target_options``).
"""

from __future__ import annotations

import stat as _stat
import threading
from typing import Any

import fsspec
from fsspec.spec import AbstractBufferedFile

from tfrfs.dataset.assembly import Mount, open_mount
from tfrfs.dataset.sources import open_source
from tfrfs.errors import IsADir, ReadOnly
from tfrfs.storage.factory import chained_source
from tfrfs.view.nodes import Node

FILE_MODE = _stat.S_IFREG | 0o444    # as a read-only mount shows them (without -o umask=)
DIR_MODE = _stat.S_IFDIR | 0o555


class TfrfsFileSystem(fsspec.AbstractFileSystem):
    """A TFRecord dataset's tree, read-only: shard folders, record folders, feature files."""

    protocol = "tfrfs"
    root_marker = ""
    # Each instance holds a dataset's readers open; fsspec's instance cache would keep them (and
    # a stale view of a dataset that changed) for the life of the process.
    cachable = False

    def __init__(self, fo: str = "", target_protocol: str | None = None,
                 target_options: dict[str, Any] | None = None, *, cache_dir: str | None = None,
                 records: str | None = None, decode_raw: bool = True, use_manifest: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        source, options = chained_source(str(fo), target_protocol, target_options)
        src = open_source(source, options=options, cache_dir=cache_dir, use_manifest=use_manifest)
        try:
            self.mount: Mount = open_mount(src, records=records, decode_raw=decode_raw)
        except BaseException:
            src.close()
            raise
        self.tree = self.mount.tree
        self._closed = threading.Event()

    # -- paths ---------------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]  # type: ignore[return-value]
        # The part before a chain's "::", without this filesystem's own protocol (fsspec's strip).
        path = super()._strip_protocol(str(path).split("::", 1)[0])
        return str(path).strip("/")

    def _node(self, path: str) -> tuple[str, Node]:
        rel = self._strip_protocol(path)
        return rel, self.tree.lookup("/" + rel)

    def _info(self, rel: str, node: Node) -> dict[str, Any]:
        st = self.tree.stat(node)
        return {"name": rel, "size": st.size, "type": "directory" if st.is_dir else "file",
                "mode": DIR_MODE if st.is_dir else FILE_MODE, "nlink": st.nlink,
                "mtime": st.mtime_ns / 1e9, "created": st.mtime_ns / 1e9}

    # -- what fsspec asks ----------------------------------------------------------

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        rel, node = self._node(path)
        return self._info(rel, node)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        rel, node = self._node(path)
        if not node.folder:
            return [self._info(rel, node)] if detail else [rel]
        prefix = rel + "/" if rel else ""
        out: list[Any] = []
        for _, name, child in self.tree.entries(node):
            out.append(self._info(prefix + name, child) if detail else prefix + name)
        return out

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        rel, node = self._node(path)
        if node.folder:
            raise IsADir(f"{rel}: a folder")
        size = self.tree.stat(node).size
        lo = 0 if start is None else (max(0, size + start) if start < 0 else start)
        hi = size if end is None else (max(0, size + end) if end < 0 else min(end, size))
        if hi <= lo:
            return b""
        return self.tree.read(node, hi - lo, lo)

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: dict | None = None, **kwargs: Any) -> "TfrfsFile":
        if mode != "rb":
            raise ReadOnly(f"{path}: tfrfs:// is read-only (mode {mode!r}); edit through a mount with --rw")
        rel, node = self._node(path)
        if node.folder:
            raise IsADir(f"{rel}: a folder")
        size = self.tree.stat(node).size
        return TfrfsFile(self, rel, node, size, block_size=block_size, cache_options=cache_options, **kwargs)

    # -- read-only -----------------------------------------------------------------

    def _refuse(self, path: Any, *args: Any, **kwargs: Any) -> None:
        raise ReadOnly(f"{path}: tfrfs:// is read-only; edit through a mount with --rw")

    mkdir = makedirs = rm_file = rm = rmdir = mv = cp_file = touch = pipe_file = put_file = _refuse

    def created(self, path: str) -> Any:
        import datetime
        return datetime.datetime.fromtimestamp(self.info(path)["created"], tz=datetime.timezone.utc)

    def modified(self, path: str) -> Any:
        import datetime
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.timezone.utc)

    def close(self) -> None:
        """Let go of the dataset's readers (files opened from it before stay readable only while
        their bytes are at hand)."""
        if not self._closed.is_set():
            self._closed.set()
            self.mount.close()

    def __del__(self) -> None:   # noqa: D105 - fsspec drops filesystems without closing them
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the modules may be gone
            pass


class TfrfsFile(AbstractBufferedFile):
    """A file of the tree, read a range at a time through the tree (seekable). It holds its
    filesystem: a URL opened with ``fsspec.open`` may drop the filesystem while the file is read."""

    def __init__(self, fs: TfrfsFileSystem, path: str, node: Node, size: int, **kwargs: Any) -> None:
        self.node = node
        self._fs_held = fs
        super().__init__(fs, path, mode="rb", size=size, **kwargs)

    def _fetch_range(self, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        return self._fs_held.tree.read(self.node, end - start, start)
