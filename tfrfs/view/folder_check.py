"""A local dataset mounted from its manifest (``tfrfs.index.manifest``) compared, folder by folder,
with what is on disk when a folder is first visited: one listing of the folder and a ``stat`` of
each file in it. What differs (a shard added, deleted, or of another size or identity; a plain
file or folder added or gone) is shown as it is, indexed as usual, and reported once in the log
and ``.tfrfs/errors``. It changes the mounted tree, so it lives with the view; the manifest's
own parts (reading, writing, following a commit) stay in ``tfrfs.index``.
"""

from __future__ import annotations

import os
import stat

from tfrfs.index.discovery import (HIDDEN_DIRS, INDEX_SUFFIXES, TMP_PREFIX, ShardFile, SourceFiles, discover,
                                   shipped_names, sniff_file)
from tfrfs.index.manifest import NAME
from tfrfs.index.shard_index import IndexCache
from tfrfs.storage.local_storage import local_identity
from tfrfs.view.nodes import Dir, PlainFile, ShardDir
from tfrfs.view.tree import Tree


class FolderCheck:
    """Compares each folder of a local dataset mounted from its manifest with what is on disk,
    when the folder is first visited, and makes the mount show what is there."""

    def __init__(self, tree: Tree, cache: IndexCache) -> None:
        self.tree = tree
        self.cache = cache
        self.root = tree.discovery.root

    def __call__(self, rel: str) -> None:
        tree = self.tree
        folder = tree.dirs.get(rel)
        if folder is None:
            return
        where = os.path.join(self.root, rel)
        try:
            with os.scandir(where) as it:
                entries = {e.name: e for e in it}
        except OSError as exc:
            self._report(rel, f"folder named by the manifest cannot be listed ({exc.strerror}): shown as the "
                              "manifest says")
            return
        shards = {name: node.shard for name, node in folder.children.items() if isinstance(node, ShardDir)}
        shown = dict(folder.children)
        for name, entry in sorted(entries.items()):
            child_rel = os.path.join(rel, name)
            if name in HIDDEN_DIRS or name.startswith(TMP_PREFIX) or (not rel and name == NAME):
                continue
            try:
                st = entry.stat()
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if name not in shown:
                    self._new_folder(child_rel)
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if name in shards:
                self._shard_seen(shards.pop(name), child_rel, st)
            elif isinstance(shown.get(name), PlainFile):
                node = shown[name]
                assert isinstance(node, PlainFile)
                if (node.size, node.mtime_ns) != (st.st_size, st.st_mtime_ns):
                    folder.children[name] = PlainFile(child_rel, st.st_size, st.st_mtime_ns)
            elif name not in shown:
                self._new_file(child_rel, entries, st)
        for name, n in shards.items():
            if name in folder.children:
                tree.hide_shard(n)
                self._report(os.path.join(rel, name), "named by the manifest but not on disk: not shown")
        for name, node in shown.items():
            if isinstance(node, PlainFile) and name not in entries:
                folder.children.pop(name, None)
                self._report(os.path.join(rel, name), "named by the manifest but not on disk: not shown")
            elif isinstance(node, Dir) and name not in entries:
                folder.children.pop(name, None)
                self._report(os.path.join(rel, name), "folder named by the manifest but not on disk: not shown")

    def _shard_seen(self, n: int, rel: str, st: os.stat_result) -> None:
        old = self.tree.store.shards[n].shard
        if (old.size, old.identity) == (st.st_size, local_identity(st)):
            return
        how = f"size {st.st_size}, the manifest says {old.size}" if st.st_size != old.size else \
            "changed since the manifest was written (another modification time)"
        shard = self._judge(rel, st)
        if shard is None:
            self.tree.hide_shard(n)
            self._report(rel, f"{how}, and no longer a shard: not shown")
            return
        self._report(rel, f"{how}: indexed again")
        idx, _ = self.cache.get(shard)
        self.tree.replace_shard(n, idx)

    def _new_file(self, rel: str, entries: dict, st: os.stat_result) -> None:
        folder = self.tree.dirs[os.path.dirname(rel)]
        shard = None if rel.endswith(INDEX_SUFFIXES) else self._judge(rel, st, beside=set(entries))
        if shard is None:
            folder.children[os.path.basename(rel)] = PlainFile(rel, st.st_size, st.st_mtime_ns)
            if not rel.endswith(INDEX_SUFFIXES):
                self._report(rel, "a file not in the manifest: shown as it is")
            return
        self._report(rel, "a shard not in the manifest: indexed and shown")
        idx, _ = self.cache.get(shard)
        self.tree.add_shard(idx, idx.detected_kind)

    def _new_folder(self, rel: str) -> None:
        """A folder the manifest does not name: found and indexed as a folder without one is."""
        try:
            found = discover(os.path.join(self.root, rel), empty_ok=True)
        except Exception as exc:  # noqa: BLE001 - a folder that cannot be read is left out
            self._report(rel, f"a folder not in the manifest cannot be read ({exc}): not shown")
            return
        self._report(rel, "a folder not in the manifest: shown as it is")
        tree = self.tree
        for sub in found.dirs:
            full = os.path.join(rel, sub) if sub else rel
            parent = tree.dirs[os.path.dirname(full)]
            node = Dir(mtime_ns=SourceFiles(self.root).dir_mtime_ns(full))
            parent.children[os.path.basename(full)] = node
            tree.dirs[full] = node
        for sub in found.plain_files:
            full = os.path.join(rel, sub)
            size, mtime_ns = SourceFiles(self.root).plain_stat(full)
            tree.dirs[os.path.dirname(full)].children[os.path.basename(full)] = PlainFile(full, size, mtime_ns)
        for s in found.shards:
            shard = ShardFile(path=s.path, relpath=os.path.join(rel, s.relpath), compression=s.compression,
                              size=s.size, mtime_ns=s.mtime_ns, identity=s.identity, shipped=s.shipped)
            idx, _ = self.cache.get(shard)
            tree.add_shard(idx, idx.detected_kind)

    def _judge(self, rel: str, st: os.stat_result, beside: set[str] | None = None) -> ShardFile | None:
        path = os.path.join(self.root, rel)
        try:
            comp = sniff_file(path)
        except OSError:
            return None
        if comp is None:
            return None
        folder, name = os.path.split(path)
        if beside is None:
            try:
                beside = set(os.listdir(folder))
            except OSError:
                beside = set()
        return ShardFile(path=path, relpath=rel, compression=comp, size=st.st_size, mtime_ns=st.st_mtime_ns,
                         identity=local_identity(st),
                         shipped=tuple(os.path.join(folder, n) for n in shipped_names(name, beside)))

    def _report(self, rel: str, what: str) -> None:
        self.tree.errors.add(rel, None, None, f"differs from {NAME}: {what}")   # and logged
