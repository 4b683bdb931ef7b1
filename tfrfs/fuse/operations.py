"""The FUSE adapter: the operations a mount answers, and ``mount``, which serves them.

The binding (``tfrfs.fuse.binding``) is mfusepy (fusepy's maintained fork, same interface) on
libfuse3. libfuse3 is what lets the kernel send 1 MiB reads and list a folder with every
entry's attributes (readdirplus); with libfuse2 the kernel asks for each name
again and reads in 128 KiB pieces.

Each call is translated to the tree in a line or two; every exception is
mapped to an errno in one place, ``errno_of``, at the edge of the operations
classes (``binding.Edge``), so the binding receives nothing but ``FuseOSError``.
Operations the mount does not need are left undefined on purpose: only the
methods an operations object has are registered, so an unneeded call (``flush``
on a read-only file, say) never enters Python at all.

libfuse's own request loop is replaced by ``fuse_loop.Loop``, which after each
request keeps watching the device for the next one a little while before
sleeping: on a virtual machine, waking a sleeping daemon costs more than
answering most requests. What tfrfs does with libfuse below the binding (that
loop, kernel notifications, read_buf buffers) lives in ``fuse_loop``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
import signal
import stat as _stat
import threading
from typing import Any, Callable, Iterator, Mapping

from tfrfs.fuse import loop as fuse_loop
from tfrfs.fuse.binding import LIBFUSE, LIBFUSE_PATH, Edge, FuseBinding, errno_of, fuse  # noqa: F401 - errno_of: the map, here too
from tfrfs.fuse import mountrecord
from tfrfs.errors import Busy, DataLoss, NoAttr, TfrfsError
from tfrfs.dataset.assembly import Mount
from tfrfs.view.nodes import FileHandle, MetaFile, RecordBin, RecordDir, ShardDir, Stat
from tfrfs.fuse.options import FUSE_FLAGS, FUSE_VALUES, Owner
from tfrfs.view.tree import Tree
from tfrfs.fuse.watchdog import RequestWatch

log = logging.getLogger("tfrfs")

# libfuse3's fuse_common.h and fuse.h
_CAP_ATOMIC_O_TRUNC = 1 << 3
_CAP_READDIRPLUS = 1 << 13
_CAP_READDIRPLUS_AUTO = 1 << 14
_RENAME_NOREPLACE = 1 << 0
_MAIN_LOOP_ENDED = 8          # fuse_main_real's status when its loop ended with an error (a signal)
_META_PATH = "/.tfrfs/"   # the metadata folder's files (see Tree.lookup)
_SETTLE_S = 0.25   # the most a request answered EIO for damage waits for .tfrfs/errors to be made fresh


_INO_BITS = (1 << 62) - 1          # inode numbers from a path's hash
_RECORD_INO = 1 << 62               # a record's: this bit, its shard's number, its index + 1
_RECORD_INO_INDEX = 34              # bits of the index (records a shard may hold: 2**34 - 1)


def _ino(path: str) -> int:
    """A path's inode number: the same for the mount's life, whatever the kernel forgets.

    (libfuse would number nodes itself, and give a new number to a name looked up again after
    the kernel dropped it under memory pressure; cp, rsync and tar compare inode numbers
    between a stat and an open, and call such a file "replaced while being copied".)
    """
    if path == "/":
        return 1   # the kernel numbers the root 1 (FUSE_ROOT_ID)
    return (hash(path) & _INO_BITS) or 2


def _node_ino(path: str, node: object) -> int:
    """``_ino``, except that a record's folder (or ``.bin``) is numbered in record order.

    cp -r reads a folder's entries in inode order (coreutils sorts them so, to spare a disk's
    seeks): numbered by hash, a shard's records would be read in a random order, and a remote
    shard would cost a request for each; numbered in order, they are read in order, and the
    remote reader reads ahead.
    """
    if isinstance(node, (RecordDir, RecordBin)) and isinstance(node.rid, int):
        return _record_ino(node.shard, node.rid)
    return _ino(path)


def _record_ino(shard: int, index: int) -> int:
    return _RECORD_INO | (shard << _RECORD_INO_INDEX) | (index + 1)


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
        self._invalidator: fuse_loop.MetaInvalidator | None = None   # read-only mounts, from init on

    # -- helpers --------------------------------------------------------------

    def _attrs(self, st: Stat, path: str, node: object = None) -> dict[str, int]:
        return {
            "st_ino": _node_ino(path, node),
            "st_mode": self._dir_mode if st.is_dir else self._file_mode, "st_nlink": st.nlink, "st_size": st.size,
            "st_uid": self._uid, "st_gid": self._gid,
            "st_mtime": st.mtime_ns, "st_ctime": st.mtime_ns, "st_atime": st.mtime_ns,
            "st_blocks": (st.size + 511) // 512, "st_blksize": 131072,
        }

    def _damage_told(self) -> None:
        # The damage may have been found a moment ago (a record read for this lookup or read):
        # let the kernel forget the .tfrfs/errors it holds before the caller, told EIO, looks
        # there. Bounded: inside a lookup in the root folder the notice waits for that lookup.
        if self._invalidator is not None:
            self._invalidator.settle(_SETTLE_S)

    def _new_handle(self, handle: FileHandle) -> int:
        with self._fh_lock:
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = handle
        return fh

    # -- operations -----------------------------------------------------------

    def init_with_config(self, conn: Any, config: Any) -> None:
        if self.tree.writable:
            # atomic_o_trunc: open(O_TRUNC) arrives as one open with the flag. Without it the
            # kernel sends a path truncate to 0 first, with no file handle, and an empty .json
            # would be judged (and refused) before `>` or cp could write the new content.
            # No readdirplus: names and sizes are never cached in --rw (see mount()), so
            # attributes in a listing would be thrown away, and cost a stat per entry.
            conn.want = (conn.want | _CAP_ATOMIC_O_TRUNC) & ~(_CAP_READDIRPLUS | _CAP_READDIRPLUS_AUTO)
            return
        # Every listing carries attributes, not only its first page ("auto"). No splicing of
        # replies (FUSE_CAP_SPLICE_WRITE): most large images are served from memory (the local
        # shard reader's serve), which libfuse would copy into a pipe first and then out of it.
        conn.want = (conn.want | _CAP_READDIRPLUS) & ~_CAP_READDIRPLUS_AUTO
        invalidator = fuse_loop.MetaInvalidator(LIBFUSE)
        invalidator.bind()
        self.tree.errors.on_change = invalidator.poke
        self._invalidator = invalidator
        if self.mountpoint:
            threading.Thread(target=fuse_loop.widen_readahead, args=(self.mountpoint,),
                             name="tfrfs-readahead", daemon=True).start()

    def getattr(self, path: str, fh: Any = None) -> dict[str, int]:
        node = self.tree.lookup(path)
        return self._attrs(self.tree.stat(node), path, node)

    def access(self, path: str, amode: int) -> int:
        self.tree.lookup(path)
        if amode & os.W_OK and not self.tree.writable:
            raise fuse.FuseOSError(errno.EROFS)
        return 0

    def opendir(self, path: str) -> int:
        if not self.tree.lookup(path).folder:
            raise fuse.FuseOSError(errno.ENOTDIR)
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
                yield (position if plus else 0), name, {"st_mode": _stat.S_IFDIR, "st_ino": _ino(of)}
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
                ino = _record_ino(node.shard, rid) if isinstance(rid, int) else _ino(prefix + name)
                yield 0, name, {"st_mode": _stat.S_IFDIR if is_dir else _stat.S_IFREG, "st_ino": ino}
            return
        for name, is_dir in tree.names(node):
            yield 0, name, {"st_mode": _stat.S_IFDIR if is_dir else _stat.S_IFREG, "st_ino": _ino(prefix + name)}

    def _shard_entries(self, node: ShardDir, prefix: str, offset: int) -> Iterator[tuple[int, str, Any]]:
        """``readdir``'s entries of a read-only shard folder, each with (the attributes every record
        folder, or every ``.bin``, of the shard shares; its inode number; its size)."""
        folder = self._attrs(Stat(True, 0, node.mtime_ns, 1), prefix)
        binary = self._attrs(Stat(False, 0, node.mtime_ns), prefix)
        shard = node.shard
        for pos, name, is_dir, size in self.tree.shard_listing(node, max(0, offset - 2)):
            if is_dir:
                yield pos + 3, name, (folder, _record_ino(shard, pos), 0)
            elif size:
                yield pos + 3, name, (binary, _record_ino(shard, pos), size)
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
            raise fuse.FuseOSError(errno.ENOSYS)   # see the class docstring; writes fail with EROFS
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
        served = self.tree.serve(self.tree.lookup(path), size, offset)
        if isinstance(served, tuple):
            return served, b""
        return None, served

    def release(self, path: str, fi: Any) -> int:
        handle = self._handles.pop(fi.fh, None)
        if handle is not None:
            handle.release()
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": 131072, "f_frsize": 131072, "f_namemax": 255,
                "f_blocks": 0, "f_bfree": 0, "f_bavail": 0, "f_files": 0, "f_ffree": 0}

    def listxattr(self, path: str) -> list[str]:
        return list(self.tree.xattrs(self.tree.lookup(path)))

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        if not name.startswith("user."):
            # ls -l asks every file for security.selinux and system.posix_acl_access; "not
            # supported" (unlike "no such attribute") makes it stop asking for the whole mount.
            raise fuse.FuseOSError(errno.ENOTSUP)
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
        # Why the request loop ended, asked at destroy; None: not known (libfuse's own loop).
        self.ended: Callable[[], fuse_loop.End | None] = lambda: None

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
            raise fuse.FuseOSError(errno.EINVAL)   # RENAME_EXCHANGE, RENAME_WHITEOUT: not supported
        if flags & _RENAME_NOREPLACE and self._present(new):
            raise fuse.FuseOSError(errno.EEXIST)
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
            self.mount.finish(end is not None and end.unmounted,
                              str(end) if end is not None else "ended (libfuse's own request loop cannot "
                                                               "tell an unmount from a signal)")
        finally:
            super().destroy(path)


class MountFailed(RuntimeError):
    """No mount was made, or it ended as it began: the message says why."""


def mount(m: Mount, mountpoint: str, *, poll_us: int, options: Mapping[str, str | bool] | None = None,
          owner: Owner | None = None) -> None:
    """Serve mount ``m`` at ``mountpoint`` until it is unmounted (in this process, in the foreground);
    after each request, watch ``poll_us`` microseconds for the next before sleeping (see fuse_loop.Loop).
    ``options``: the user's FUSE mount options (``tfrfs.fuse.options.FUSE_FLAGS``, ``FUSE_VALUES``), added
    to tfrfs's own; ``owner``: the owner and modes every file shows (default: the mounting user's,
    umask 022). Raises ``MountFailed`` if libfuse cannot mount, or the mount's init fails."""
    opts: dict[str, Any] = dict(
        foreground=True,
        nothreads=True,     # one thread: the tree's caches and the journal need no locking
        fsname="tfrfs",
        subtype="tfrfs",    # the mount table's type, fuse.tfrfs, is how tfrfs knows its mounts
        use_ino=True,       # inode numbers from _ino()
    )
    opts.update({k: v for k, v in (options or {}).items() if k in FUSE_FLAGS + FUSE_VALUES})
    owner = owner or Owner(os.getuid(), os.getgid())
    if m.writable:
        # No attribute or name caching: names and sizes change without a call through the kernel
        # for that path (a commit renumbers records; a PNG sets height.json; a value becomes
        # binary and city.txt is city.bin). The kernel reads no further than the size it holds,
        # and a name it still believes in makes open(O_CREAT) skip create and fail with ENOENT.
        # (Writes come in requests of up to 1 MiB, and open(O_TRUNC) as one open with the flag:
        # see init_with_config.)
        opts.update(attr_timeout=0.0, entry_timeout=0.0, negative_timeout=0)
        ops: Operations = WritableOperations(m, owner)
    else:
        # Nothing changes under a read-only mount: let the kernel keep attributes, names and data.
        opts.update(ro=True, kernel_cache=True, attr_timeout=86400.0, entry_timeout=86400.0,
                    negative_timeout=60.0)
        ops = Operations(m.tree, mountpoint, owner)
    loop = fuse_loop.Loop(LIBFUSE, poll_us)
    if loop.usable():
        if isinstance(ops, WritableOperations):
            ops.ended = lambda: loop.ended
    else:
        log.warning("this libfuse lacks a function the request loop needs; using libfuse's own loop "
                    "(no --poll-us): %s", LIBFUSE_PATH)
        if m.writable:
            log.warning("with libfuse's own loop an unmount cannot be told from SIGTERM or Ctrl-C, so "
                        "staged edits are committed only by tfrfs commit and tfrfs umount")
    m.attach(mountpoint)
    ops.watch = RequestWatch(note=lambda doc: mountrecord.write_busy(mountpoint, doc))
    ops.watch.start()
    with _recorded(m, mountpoint), _libfuse_main(loop.main if loop.usable() else None), \
            _libfuse_signals(not loop.usable()), _stopped(ops.watch):
        try:
            FuseBinding(ops, mountpoint, raw_fi=True, encoding="utf-8", errors="surrogateescape", **opts)
        except RuntimeError as exc:
            if not (exc.args and isinstance(exc.args[0], int)):
                raise
            if not loop.usable() and exc.args[0] == _MAIN_LOOP_ENDED and ops.init_failure is None:
                # libfuse's own loop ends so after a stop signal (libfuse 3.10 on), or a failed read.
                log.info("libfuse's own request loop ended with status %d: stopped by a signal (or "
                         "reading from the kernel failed)", _MAIN_LOOP_ENDED)
                return
            # The binding's report of a non-zero return from libfuse's main: say what failed.
            raise MountFailed(loop.failure if loop.usable() and loop.failure
                              else f"libfuse's fuse_main returned {exc.args[0]}") from None
    if ops.init_failure is not None:
        failure = ops.init_failure
        raise MountFailed(f"init failed ({type(failure).__name__}: {failure}), so the mount ended")


@contextlib.contextmanager
def _recorded(m: Mount, mountpoint: str) -> Iterator[None]:
    """This daemon's record of the mount at ``mountpoint`` (``mountrecord``: what ``tfrfs status``
    names once the daemon is gone), kept while it serves and removed when it ends."""
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


@contextlib.contextmanager
def _libfuse_signals(libfuses: bool) -> Iterator[None]:
    """With libfuse's own loop (``libfuses``), let libfuse's handler end the mount on SIGINT as on
    SIGTERM and SIGHUP: it sets one only where the handler is SIG_DFL, and Python holds SIGINT
    (its KeyboardInterrupt would surface inside an operation)."""
    if not libfuses or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def _libfuse_main(main: Callable[..., int] | None) -> Iterator[None]:
    """Have the binding run ``main`` in place of libfuse's fuse_main_real (None: libfuse's own),
    for the ``FUSE()`` call made inside this block.

    The binding builds libfuse's table of operations inside ``FUSE.__init__`` and hands it
    straight to its module-level ``fuse_main_real``: it takes no other main function, as an
    argument or a method to override, and keeps the table nowhere a caller could reach. So that
    name is swapped for the call and put back however it ends (README, "Choices where the
    contract is silent"). ``main`` takes fuse_main_real's arguments (see ``fuse_loop.Loop``).
    """
    if main is None:
        yield
        return
    binding_main = fuse.fuse_main_real
    fuse.fuse_main_real = main
    try:
        yield
    finally:
        fuse.fuse_main_real = binding_main
