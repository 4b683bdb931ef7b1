"""An in-process writable mount: what ``tfrfs mount --rw`` assembles, driven without FUSE.

Shared by the crash tests and the stable-name tests: one method per system call, called the way
the FUSE adapter calls the editors, and the whole visible tree read back through the namespace.
"""

from __future__ import annotations

import os
from pathlib import Path

from tfrfs.dataset.assembly import open_mount
from tfrfs.view.nodes import DataFile, Dir, PlainFile, RecordBin, RecordDir, ScratchFile, ShardDir


class Session:
    """What ``tfrfs mount --rw`` assembles (``open_mount``: the lock, recovery, record store, tree
    and editors), driven without FUSE, one method per system call as the FUSE adapter drives it."""

    def __init__(self, root: Path, cache: Path) -> None:
        self.mount = open_mount(str(root), writable=True, cache_dir=str(cache))
        self.staging = self.mount.staging
        self.tree = self.mount.tree
        self.files = self.mount.files
        self.folders = self.mount.folders
        self.renames = self.mount.renames

    def close(self) -> None:
        self.mount.close()

    def commit(self) -> None:
        self.mount.commit()

    def pending(self) -> list[str]:
        return [p.shard for p in self.mount.status().pending]

    def write(self, path: str, data: bytes) -> None:
        """open (O_TRUNC, or O_CREAT for a new name), write, close."""
        try:
            self.tree.lookup(path)
            handle = self.files.open(path, os.O_WRONLY | os.O_TRUNC)
        except FileNotFoundError:
            handle = self.files.create(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            handle.write(data, 0)
            handle.flush()                 # FUSE flush: what close() reports
            handle.flush(final=True)       # FUSE release
        finally:
            handle.release()

    def create(self, path: str) -> None:
        """open(O_CREAT) and close, writing nothing (as ``touch`` does)."""
        handle = self.files.create(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            handle.flush(final=True)
        finally:
            handle.release()

    def mkdir(self, path: str) -> None:
        self.folders.mkdir(path)

    def unlink(self, path: str) -> None:
        self.files.unlink(path)

    def rmdir(self, path: str) -> None:
        self.folders.rmdir(path)

    def rename(self, old: str, new: str) -> None:
        self.renames.rename(old, new)

    def rm_r_calls(self, path: str) -> list[tuple]:
        """The unlink and rmdir calls ``rm -r path`` makes (depth first)."""
        calls: list[tuple] = []
        for name, is_dir in sorted(self.tree.names(self.tree.lookup(path))):
            child = f"{path}/{name}"
            calls += self.rm_r_calls(child) if is_dir else [("unlink", child)]
        return calls + [("rmdir", path)]

    def do(self, call: tuple) -> None:
        getattr(self, call[0])(*call[1:])

    def rm_r(self, path: str) -> None:
        for call in self.rm_r_calls(path):
            self.do(call)

    # What the mount shows.

    def view(self) -> dict[str, bytes | None]:
        """Every path under the mount: a file's bytes, or None for a folder."""
        out: dict[str, bytes | None] = {}

        def walk(node, path: str) -> None:
            for name, _ in self.tree.names(node):
                child = self.tree.child(node, name)
                cpath = f"{path}/{name}"
                if isinstance(child, (Dir, ShardDir, RecordDir)):
                    out[cpath] = None
                    walk(child, cpath)
                else:
                    assert isinstance(child, (DataFile, RecordBin, ScratchFile, PlainFile)), child
                    h = self.tree.open(child)
                    try:
                        out[cpath] = h.read(1 << 24, 0)
                    finally:
                        h.release()

        walk(self.tree.root, "")
        return out

    def records(self) -> dict[str, list[bytes]]:
        """Per visible shard, the bytes of its records in the order a commit writes them."""
        out = {}
        for n, idx in enumerate(self.tree.store.shards):
            rel = idx.shard.relpath
            try:
                node = self.tree.lookup("/" + rel)
            except FileNotFoundError:
                continue
            if not isinstance(node, ShardDir) or node.shard != n:
                continue
            recs = []
            for name, _ in self.tree.names(node):
                rnode = self.tree.child(node, name)
                recs.append(self.tree.store.record_bytes(n, rnode.rid)[0])
            out[rel] = recs
        return out
