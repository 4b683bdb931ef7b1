"""The operations a mount answers, by path, and ``mount``, which serves them.

Each call is translated to the tree in a line or two; every exception is mapped to an errno in
one place, ``errno_of``, at the edge of the operations classes (``edge.Edge``), so the request
loop receives nothing but ``Refused``. ``tfrfs.fuse.requests`` turns libfuse's low-level
requests (by node id) into these calls, and ``tfrfs.fuse.libfuse`` serves them from several
threads: on a read-only mount the tree is read by many requests at once; a writable mount's
requests each hold its guard.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
import stat as _stat
import threading
from typing import Any, Callable, Iterator, Mapping

from tfrfs.fuse import canmount, libfuse, loop, mountrecord
from tfrfs.fuse.notices import Notifier
from tfrfs.fuse.edge import Edge, Refused, errno_of  # noqa: F401 - errno_of: the map, here too
from tfrfs.fuse.inodes import ROOT, RecordRun, path_ino, record_ino
from tfrfs.fuse.requests import Requests
from tfrfs.errors import Busy, DataLoss, NoAttr, NotFound, TfrfsError
from tfrfs.dataset.assembly import Mount
from tfrfs.view.nodes import (DataFile, FileHandle, MetaFile, Node, RecordBin, RecordDir, ShardDir, Stat,
                              record_name_width)
from tfrfs.fuse.options import FUSE_FLAGS, FUSE_VALUES, Owner
from tfrfs.view.tree import Tree
from tfrfs.fuse.watchdog import RequestWatch

log = logging.getLogger("tfrfs")

# libfuse3's fuse_common.h
_CAP_ATOMIC_O_TRUNC = 1 << 3
_CAP_READDIRPLUS = 1 << 13
_CAP_READDIRPLUS_AUTO = 1 << 14
_CAP_PARALLEL_DIROPS = 1 << 18
_RENAME_NOREPLACE = 1 << 0
_META_PATH = "/.tfrfs/"   # the metadata folder's files (see Tree.lookup)
_SETTLE_S = 0.25   # the most a request answered EIO for damage waits for .tfrfs/errors to be made fresh
WORKERS = 3   # the reader and two helpers (turns)
BLOCK = 131072   # every file's block size (st_blksize), and the file system's (statfs)


def _node_ino(path: str, node: object) -> int:
    """A node's inode number: a record's folder (or ``.bin``) by its shard and index (see
    ``inodes.record_ino``), any other by its path."""
    if isinstance(node, (RecordDir, RecordBin)) and isinstance(node.rid, int):
        return record_ino(node.shard, node.rid, isinstance(node, RecordBin))
    return path_ino(path)


class Operations(Edge):
    """Operations for a read-only tree.

    Files are read by path: ``open`` answers "not implemented", which the kernel takes as
    "opening always succeeds" and stops sending opens and releases, two of the four requests
    that reading a small file would otherwise cost.
    """

    use_ns = True   # times in nanoseconds

    def __init__(self, tree: Tree, mountpoint: str = "", owner: Owner | None = None) -> None:
        self.tree = tree
        self.mountpoint = mountpoint
        owner = owner or Owner(os.getuid(), os.getgid())
        self._uid, self._gid = owner.uid, owner.gid
        file_mode, dir_mode = owner.modes(tree.writable)
        self._file_mode, self._dir_mode = _stat.S_IFREG | file_mode, _stat.S_IFDIR | dir_mode
        self._handles: dict[int, FileHandle] = {}
        self._next_fh = 1
        self._fh_lock = threading.Lock()   # not "lock": that would register a lock operation
        # Tells the kernel to forget names (set by mount() before the session starts)
        self.notifier: Notifier | None = None

    # -- helpers --------------------------------------------------------------

    def _attrs(self, st: Stat, path: str, node: object = None) -> dict[str, int]:
        return {
            "st_ino": _node_ino(path, node),
            "st_mode": self._dir_mode if st.is_dir else self._file_mode, "st_nlink": st.nlink, "st_size": st.size,
            "st_uid": self._uid, "st_gid": self._gid,
            "st_mtime": st.mtime_ns, "st_ctime": st.mtime_ns, "st_atime": st.mtime_ns,
            "st_blocks": (st.size + 511) // 512, "st_blksize": BLOCK,
        }

    def _damage_told(self) -> None:
        # The damage may have been found a moment ago (a record read for this lookup or read):
        # let the kernel forget the .tfrfs/errors it holds before the caller, told EIO, looks
        # there. Bounded: inside a lookup in the root folder the notice waits for that lookup.
        if self.notifier is not None and not self.tree.writable:
            self.notifier.settle(_SETTLE_S)

    def _new_handle(self, handle: FileHandle) -> int:
        with self._fh_lock:
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = handle
        return fh

    # -- operations -----------------------------------------------------------

    def init(self, conn: Any) -> None:
        if self.tree.writable:
            # atomic_o_trunc: open(O_TRUNC) arrives as one open with the flag. Without it the
            # kernel sends a path truncate to 0 first, with no file handle, and an empty .json
            # would be judged (and refused) before `>` or cp could write the new content.
            # No readdirplus: names and sizes are never cached in --rw (see mount()), so
            # attributes in a listing would be thrown away, and cost a stat per entry.
            conn.want = (conn.want | _CAP_ATOMIC_O_TRUNC) & ~(_CAP_READDIRPLUS | _CAP_READDIRPLUS_AUTO)
            return
        # Every listing carries attributes, not only its first page ("auto"); lookups and
        # listings of one folder may run at once.
        conn.want = (conn.want | _CAP_READDIRPLUS | _CAP_PARALLEL_DIROPS) & ~_CAP_READDIRPLUS_AUTO
        notifier = self.notifier
        if notifier is not None:
            # A read-only mount lets the kernel keep names, sizes and pages for a day, and it
            # never opens files (reads come by path), so nothing else would make it ask for the
            # new size of .tfrfs/errors.
            self.tree.errors.on_change = lambda: notifier.forget_name(ROOT, ".tfrfs")
        if self.mountpoint:
            threading.Thread(target=loop.widen_readahead, args=(self.mountpoint,),
                             name="tfrfs-readahead", daemon=True).start()

    def _record_path(self, shard: int, index: int, binary: bool) -> str:
        """The path of record ``index`` of shard ``shard`` (its ``.bin`` with ``binary``)."""
        store = self.tree.store
        width = record_name_width(store.shards[shard].count)
        return f"/{store.relpath(shard)}/{index:0{width}d}{'.bin' if binary else ''}"

    def getattr(self, path: str, fh: Any = None) -> dict[str, int]:
        node = self.tree.lookup(path)
        return self._attrs(self.tree.stat(node), path, node)

    def access(self, path: str, amode: int) -> int:
        self.tree.lookup(path)
        if amode & os.W_OK and not self.tree.writable:
            raise Refused(errno.EROFS)
        return 0

    def opendir(self, path: str) -> int:
        if not self.tree.lookup(path).folder:
            raise Refused(errno.ENOTDIR)
        return 0

    def readdir(self, path: str, offset: int, plus: bool) -> Iterator[tuple[int, str, dict[str, int]]]:
        """(position, name, attributes) of the entries after position ``offset``.

        With ``plus`` (readdirplus) each entry carries all its attributes, so ls -l, find or a
        walk need no lookup per name. libfuse3 (up to 3.16) passes attributes on only for
        entries filled with their position, so such a listing goes a page at a time, resuming
        after ``offset``: 1 and 2 are "." and "..", then the tree's positions plus 3.
        Without it, the whole listing goes at once (position 0; libfuse hands it out page by
        page) with each entry's type, which lets find and ls skip a stat per name.
        """
        node = self.tree.lookup(path)
        for position, name, of in ((1, ".", path), (2, "..", posixpath.dirname(path))):
            if position > offset:
                yield (position if plus else 0), name, {"st_mode": _stat.S_IFDIR, "st_ino": path_ino(of)}
        prefix = path.rstrip("/") + "/"
        tree = self.tree
        if plus and isinstance(node, ShardDir) and not tree.writable:
            yield from self._shard_entries(node, prefix, offset)
            return
        if plus:
            for pos, name, child in tree.entries(node, max(0, offset - 2)):
                try:
                    attrs = self._attrs(tree.stat(child), prefix + name, child)
                except DataLoss:
                    # (an empty record whose checksum fails: listed, but its stat is EIO)
                    attrs = {"st_mode": _stat.S_IFREG, "st_ino": _node_ino(prefix + name, child)}
                yield pos + 3, name, attrs
            return
        if isinstance(node, ShardDir):
            for rid, name, is_dir in tree.record_names(node):
                ino = record_ino(node.shard, rid, not is_dir) if isinstance(rid, int) else path_ino(prefix + name)
                yield 0, name, {"st_mode": _stat.S_IFDIR if is_dir else _stat.S_IFREG, "st_ino": ino}
            return
        for name, is_dir in tree.names(node):
            yield 0, name, {"st_mode": _stat.S_IFDIR if is_dir else _stat.S_IFREG, "st_ino": path_ino(prefix + name)}

    def records_in(self, shard: int) -> int:
        """How many records shard ``shard`` holds (its index's count)."""
        return self.tree.store.shards[shard].count

    def record_folders(self, path: str, held: int = 0) -> Iterator[tuple[str, list[tuple[Any, ...]]]]:
        """Every folder inside record folder ``path`` of a read-only mount, the record's own
        first and each before its subfolders: (its path, its entries), as ``readdir`` with
        ``plus`` lists them but "." and "..", found in the record's view rather than by a lookup
        of each path. Each entry is (position, name, inode number, mode, size, blocks, time in
        ns, links, node, where, data); the owner and block size are every entry's (``owned``).
        A file of at most ``held`` bytes comes with what ``read_node`` gives for all of it
        (where its bytes lie, or its bytes), any other entry with (None, None). Raises as the
        record's folder does (DataLoss for a damaged record)."""
        tree = self.tree
        record = tree.lookup(path)
        if not isinstance(record, RecordDir):
            raise NotFound(f"{path}: not a record's folder")
        todo: list[tuple[str, Node]] = [(path, tree.record_root(record))]
        stat, dir_mode, file_mode = tree.stat, self._dir_mode, self._file_mode
        while todo:
            at, folder = todo.pop()
            listed: list[tuple[Any, ...]] = []
            for pos, name, child in tree.entries(folder):
                inner = at + "/" + name
                where: Any = None
                if type(child) is DataFile and type(child.data) is bytes and not child.damaged:
                    # (the usual file, a value held in memory: its stat and its read are its bytes')
                    data: Any = child.data
                    size, ino, mode, mtime, nlink = len(data), path_ino(inner), file_mode, child.mtime_ns, 1
                    if size > held:
                        data = None
                else:
                    st = stat(child)
                    size, ino, mtime, nlink, data = st.size, _node_ino(inner, child), st.mtime_ns, st.nlink, None
                    mode = dir_mode if st.is_dir else file_mode
                    if child.folder:
                        todo.append((inner, child))
                    elif size <= held:
                        where, data = self._read_node(child, size, 0)
                listed.append((pos + 3, name, ino, mode, size, (size + 511) // 512, mtime, nlink, child, where, data))
            yield at, listed

    @property
    def owned(self) -> tuple[int, int, int]:
        """(owner, group, block size) of every entry (``_attrs``)."""
        return self._uid, self._gid, BLOCK

    def _shard_entries(self, node: ShardDir, prefix: str, offset: int) -> Iterator[Any]:
        """``readdir``'s entries of a read-only shard folder: runs of record folders in bulk
        (``RecordRun``), and each ``.bin`` with (the attributes every ``.bin`` of the shard shares;
        its inode number; its size)."""
        folder = self._attrs(Stat(True, 0, node.mtime_ns, 1), prefix)
        binary = self._attrs(Stat(False, 0, node.mtime_ns), prefix)
        shard = node.shard
        store = self.tree.store
        idx = store.shards[shard]
        start = max(0, offset - 2)
        if store.kinds[shard] != "raw":
            width = record_name_width(idx.count)
            i = start
            for b in sorted(r for r in idx.bad if r >= start) + [idx.count]:
                if b > i:
                    yield RecordRun(shard, i, b, width, folder)
                if b < idx.count:
                    yield from self._bin_entries(node, prefix, b, b + 1, binary)
                i = b + 1
            return
        yield from self._bin_entries(node, prefix, start, idx.count, binary)

    def _bin_entries(self, node: ShardDir, prefix: str, start: int, stop: int,
                     binary: dict[str, int]) -> Iterator[tuple[int, str, Any]]:
        shard = node.shard
        for pos, name, is_dir, size in self.tree.shard_listing(node, start):
            if pos >= stop:
                return
            if size:
                yield pos + 3, name, (binary, record_ino(shard, pos, True), size)
            else:
                # An empty record: its stat checks its checksum (an empty file is never read).
                child = self.tree.child(node, name)
                try:
                    attrs = self._attrs(self.tree.stat(child), prefix + name, child)
                except DataLoss:
                    attrs = {"st_mode": _stat.S_IFREG, "st_ino": _node_ino(prefix + name, child)}
                yield pos + 3, name, attrs

    def open(self, path: str, fi: Any) -> int:
        if not self.tree.writable:
            raise Refused(errno.ENOSYS)   # see the class docstring; writes fail with EROFS
        node = self.tree.lookup(path)
        handle = self.tree.open(node)
        fi.fh = self._new_handle(handle)
        if isinstance(node, MetaFile):
            # Their content grows while mounted: bypass the page cache and the cached size.
            fi.direct_io = 1
        return 0

    def read(self, path: str, size: int, offset: int, fi: Any) -> bytes:
        # Writable mounts only: libfuse asks read_buf instead where there is one.
        return self._handles[fi.fh].read(size, offset)

    def read_buf(self, path: str, size: int, offset: int) -> tuple[tuple[int, int, int] | None, bytes | memoryview]:
        """A read of a read-only mount: ((descriptor, position, count), b"") when the bytes lie
        in a file the tree holds open, else (None, the bytes, or a view of the memory the tree
        holds them in)."""
        return self.read_node(self.tree.lookup(path), size, offset)

    def read_node(self, node: Node, size: int, offset: int) -> tuple[tuple[int, int, int] | None, bytes | memoryview]:
        """``read_buf`` of a node already found."""
        return self._read_node(node, size, offset)

    def _read_node(self, node: Node, size: int, offset: int) -> tuple[tuple[int, int, int] | None, bytes | memoryview]:
        # (not a request: for work inside one, such as record_folders, without a second wrapper)
        served = self.tree.serve(node, size, offset)
        if isinstance(served, tuple):
            return served, b""
        return None, served

    def release(self, path: str, fi: Any) -> int:
        handle = self._handles.pop(fi.fh, None)
        if handle is not None:
            handle.release()
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": BLOCK, "f_frsize": BLOCK, "f_namemax": 255,
                "f_blocks": 0, "f_bfree": 0, "f_bavail": 0, "f_files": 0, "f_ffree": 0}

    def listxattr(self, path: str) -> list[str]:
        return list(self.tree.xattrs(self.tree.lookup(path)))

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        if not name.startswith("user."):
            # ls -l asks every file for security.selinux and system.posix_acl_access; "not
            # supported" (unlike "no such attribute") makes it stop asking for the whole mount.
            raise Refused(errno.ENOTSUP)
        try:
            return self.tree.xattrs(self.tree.lookup(path))[name]
        except KeyError:
            raise NoAttr(name) from None

    def destroy(self, path: str) -> None:
        self.tree.close()


class WritableOperations(Operations):
    """Operations for a ``--rw`` mount: every change goes through the editor."""

    read_buf = None   # type: ignore[assignment]  # unset: reads go through open handles (read)

    def __init__(self, mount: Mount, owner: Owner | None = None) -> None:
        super().__init__(mount.tree, owner=owner)
        assert mount.files is not None and mount.folders is not None and mount.renames is not None
        self.mount = mount
        self.files = mount.files
        self.folders = mount.folders
        self.renames = mount.renames
        self.guard = mount.guard
        # Why the request loop ended, asked at destroy
        self.ended: Callable[[], loop.End | None] = lambda: None

    def getattr(self, path: str, fh: Any = None) -> dict[str, int]:
        st = self.files.open_stat(path)
        if st is not None:
            # Open: the size is what its descriptors wrote, staged or not (the kernel reads no
            # further than it, and drops cached pages past it), also for a file being created.
            return self._attrs(Stat(False, st[0], st[1]), path)
        return super().getattr(path, fh)

    def access(self, path: str, amode: int) -> int:
        self._exists(path)
        return 0

    def open(self, path: str, fi: Any) -> int:
        if fi.flags & os.O_ACCMODE != os.O_RDONLY or fi.flags & os.O_TRUNC:
            self._changing(path)
        handle = self.files.open(path, fi.flags)
        if handle is None:
            return super().open(path, fi)
        fi.fh = self._new_handle(handle)
        fi.direct_io = 0   # through the page cache, so the file can be mapped (mmap)
        return 0

    def create(self, path: str, mode: int, fi: Any) -> int:
        self._changing(path)
        fi.fh = self._new_handle(self.files.create(path, fi.flags))
        return 0

    def write(self, path: str, data: bytes, offset: int, fi: Any) -> int:
        return self._handles[fi.fh].write(data, offset)

    def truncate(self, path: str, length: int, fi: Any = None) -> int:
        if fi is not None and fi.fh in self._handles:
            self._handles[fi.fh].truncate(length)
            return 0
        self._changing(path)
        self.files.truncate_path(path, length)
        return 0

    def flush(self, path: str, fi: Any) -> int:
        handle = self._handles.get(fi.fh)
        if handle is not None:
            handle.flush()
        return 0

    def fsync(self, path: str, datasync: int, fi: Any) -> int:
        handle = self._handles.get(fi.fh)
        if handle is not None:
            handle.sync()
        return 0

    def release(self, path: str, fi: Any) -> int:
        handle = self._handles.pop(fi.fh, None)
        if handle is None:
            return 0
        try:
            # The last close: a file that was only truncated is judged now. release() cannot
            # fail a close any more; the reason is in .tfrfs/errors and the log.
            handle.flush(final=True)
        except TfrfsError:
            pass
        finally:
            handle.release()
        return 0

    def unlink(self, path: str) -> int:
        self._changing(path)
        self.files.unlink(path)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        self._changing(path)
        self.folders.mkdir(path)
        return 0

    def rmdir(self, path: str) -> int:
        self._changing(path)
        self.folders.rmdir(path)
        return 0

    def rename(self, old: str, new: str, flags: int = 0) -> int:
        if flags & ~_RENAME_NOREPLACE:
            raise Refused(errno.EINVAL)   # RENAME_EXCHANGE, RENAME_WHITEOUT: not supported
        if flags & _RENAME_NOREPLACE and self._present(new):
            raise Refused(errno.EEXIST)
        self._changing(old)
        if not self.files.is_new(old):   # else there is nothing to move but the open file
            self.renames.rename(old, new)
        self.files.moved(old, new)
        return 0

    def utimens(self, path: str, times: Any = None) -> int:
        # Times of features are the shard's; accepting the call keeps cp -a, rsync and touch working.
        self.files.touch(path, times)
        return 0

    def chmod(self, path: str, mode: int) -> int:
        self._exists(path)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        self._exists(path)
        return 0

    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int:
        # cp -a copies our own xattrs back: accepted, and ignored but for the kind of an empty
        # list, which its content cannot tell (SPEC 7).
        if name == "user.tfrfs.kind":
            self._changing(path)
            self.files.set_kind(path, value)
        else:
            self._exists(path)
        return 0

    def removexattr(self, path: str, name: str) -> int:
        self._exists(path)
        return 0

    def _changing(self, path: str) -> None:
        """Refuse a change while a commit runs (EBUSY): it works from what was staged when it
        started. ``.tfrfs/commit`` stays open to ``commit``, ``discard`` and ``keep``."""
        reason = self.mount.busy()
        if reason is not None and not path.startswith(_META_PATH):
            raise Busy(f"{path}: {reason}")

    def _exists(self, path: str) -> None:
        if self.files.open_stat(path) is None:
            self.tree.lookup(path)

    def _present(self, path: str) -> bool:
        try:
            self._exists(path)
        except TfrfsError:
            return False
        return True

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self.tree.discovery.access.statfs_folder())
        return {k: getattr(st, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                            "f_files", "f_ffree", "f_favail", "f_namemax")}

    def destroy(self, path: str) -> None:
        # Only the kernel's unmount (fusermount3 -u, umount, tfrfs umount) commits; a stop signal
        # leaves the edits staged (SPEC 7). The mount decides, and says what it did.
        try:
            end = self.ended()
            self.mount.finish(end is not None and end.unmounted, str(end) if end is not None else "ended")
        finally:
            super().destroy(path)


MountFailed = loop.MountFailed


def mount(m: Mount, mountpoint: str, *, poll_us: int = 0, options: Mapping[str, str | bool] | None = None,
          owner: Owner | None = None, workers: int = WORKERS) -> None:
    """Serve mount ``m`` at ``mountpoint`` until it is unmounted (in this process, in the foreground),
    with ``workers`` threads answering requests.
    ``options``: the user's FUSE mount options (``tfrfs.fuse.options.FUSE_FLAGS``, ``FUSE_VALUES``), added
    to tfrfs's own; ``owner``: the owner and modes every file shows (default: the mounting user's,
    umask 022). Raises ``MountFailed`` if libfuse cannot mount, or the mount's init fails.
    After its last answer, the reader watches ``poll_us`` microseconds for the next request before
    it sleeps (``turns``)."""
    opts: dict[str, str | bool] = {
        "fsname": "tfrfs",
        "subtype": "tfrfs",    # the mount table's type, fuse.tfrfs, is how tfrfs knows its mounts
    }
    opts.update({k: v for k, v in (options or {}).items() if k in FUSE_FLAGS + FUSE_VALUES})
    owner = owner or Owner(os.getuid(), os.getgid())
    ops: Operations
    if m.writable:
        # No attribute or name caching: names and sizes change without a call through the kernel
        # for that path (a commit renumbers records; a PNG sets height.json; a value becomes
        # binary and city.txt is city.bin). The kernel reads no further than the size it holds,
        # and a name it still believes in makes open(O_CREAT) skip create and fail with ENOENT.
        # (Writes come in requests of up to 1 MiB, and open(O_TRUNC) as one open with the flag:
        # see Operations.init.)
        ops = WritableOperations(m, owner)
        requests = Requests(ops, writable=True, entry_timeout=0.0, attr_timeout=0.0, negative_timeout=0.0)
    else:
        # Nothing changes under a read-only mount: let the kernel keep attributes, names, data
        # and listings.
        opts["ro"] = True
        # (a passed /dev/fuse descriptor has no mount point here to widen the read-ahead of)
        ops = Operations(m.tree, "" if canmount.passed_fd(mountpoint) is not None else mountpoint, owner)
        requests = Requests(ops, writable=False, entry_timeout=86400.0, attr_timeout=86400.0,
                            negative_timeout=60.0, record_path=ops._record_path)
        requests.local = m.source.local_root is not None   # (records' files answered in C: fuse/answers.py)
    session = libfuse.Session(requests, ",".join(k if v is True else f"{k}={v}" for k, v in opts.items()), workers, poll_us)
    ops.end_session = session.end
    ops.notifier = session.notifier()
    m.attach(mountpoint)
    passed = canmount.passed_fd(mountpoint) is not None
    ops.watch = RequestWatch(note=(lambda doc: None) if passed else (lambda doc: mountrecord.write_busy(mountpoint, doc)))
    ops.watch.start()
    end: loop.End | None = None
    try:
        with _recorded(m, mountpoint), _stopped(ops.watch):
            end = session.serve(mountpoint)
            log.info("request loop %s", end)
            requests.destroy(end)
    finally:
        session.close()
    if ops.init_failure is not None:
        failure = ops.init_failure
        raise MountFailed(f"init failed ({type(failure).__name__}: {failure}), so the mount ended")


@contextlib.contextmanager
def _recorded(m: Mount, mountpoint: str) -> Iterator[None]:
    """This daemon's record of the mount at ``mountpoint`` (``mountrecord``: what ``tfrfs status``
    names once the daemon is gone), kept while it serves and removed when it ends."""
    if canmount.passed_fd(mountpoint) is not None:   # no mount point here: the parent knows it
        yield
        return
    mountrecord.write(mountrecord.MountRecord(mountpoint, m.source_name, m.discovery.root, m.writable, os.getpid()))
    try:
        yield
    finally:
        mountrecord.remove(mountpoint, os.getpid())


@contextlib.contextmanager
def _stopped(watch: RequestWatch) -> Iterator[None]:
    try:
        yield
    finally:
        watch.stop()
