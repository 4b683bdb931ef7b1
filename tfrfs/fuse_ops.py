"""The FUSE adapter: the only module that imports the FUSE binding.

The binding is mfusepy (fusepy's maintained fork, same interface) on libfuse3.
libfuse3 is what lets the kernel send 1 MiB reads and list a folder with every
entry's attributes (readdirplus); with libfuse2 the kernel asks for each name
again and reads in 128 KiB pieces.

Each call is translated to the tree in a line or two; every exception is
mapped to an errno in one place, ``_Fuse._wrapper``, through which the binding
routes every callback. Operations the mount does not need are left undefined on
purpose: only the methods an operations object has are registered, so an
unneeded call (``flush`` on a read-only file, say) never enters Python at all.

libfuse's own request loop is replaced by ``_Loop``, which after each request
keeps watching the device for the next one a little while before sleeping: on
a virtual machine, waking a sleeping daemon costs more than answering most
requests (see ``_Loop``).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import posixpath
import select
import stat as _stat
import threading
import time
from typing import Any, Iterator

if not (os.environ.get("FUSE_LIBRARY_PATH") or os.environ.get("FUSE_LIBRARY_NAME")):
    os.environ["FUSE_LIBRARY_NAME"] = "fuse3"   # mfusepy would take libfuse2 first where both exist
try:
    import mfusepy as fuse
except OSError as _exc:   # no libfuse on this machine
    raise ImportError(f"{_exc}: tfrfs needs libfuse3 (Debian/Ubuntu: apt-get install fuse3)") from None
if fuse.fuse_version_major != 3:
    raise ImportError(f"tfrfs needs libfuse3, but {fuse._libfuse_path} is libfuse{fuse.fuse_version_major}")

from .errors import NoAttr, TfrfsError
from .mount import Mount
from .nodes import FILE_NODES, FileHandle, MetaFile, Stat
from .tree import Tree

log = logging.getLogger("tfrfs")

# libfuse3's fuse_common.h and fuse.h
_CAP_ATOMIC_O_TRUNC = 1 << 3
_CAP_READDIRPLUS = 1 << 13
_CAP_READDIRPLUS_AUTO = 1 << 14
_READDIR_PLUS = 1 << 0        # readdir flag: the kernel wants attributes too
_FILL_DIR_PLUS = 1 << 1       # filler flag: this entry's attributes are complete
_RENAME_NOREPLACE = 1 << 0
_BUF_IS_FD = 1 << 1           # fuse_buf flags: the bytes are in a file descriptor,
_BUF_FD_SEEK = 1 << 2         # at position `pos`


class _Buf(ctypes.Structure):
    """libfuse3's struct fuse_buf."""
    _fields_ = [("size", ctypes.c_size_t), ("flags", ctypes.c_int), ("mem", ctypes.c_void_p),
                ("fd", ctypes.c_int), ("pos", ctypes.c_int64)]


class _BufVec(ctypes.Structure):
    """libfuse3's struct fuse_bufvec holding one buffer (the binding declares ``buf`` as a pointer,
    but it is an array of one, in place)."""
    _fields_ = [("count", ctypes.c_size_t), ("idx", ctypes.c_size_t), ("off", ctypes.c_size_t),
                ("buf", _Buf)]


# libfuse frees what read_buf hands it with free(): it must come from the C library's malloc.
_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.free.restype = None
_libc.free.argtypes = [ctypes.c_void_p]
_libc.dlvsym.restype = ctypes.c_void_p
_libc.dlvsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]

# Read-only mounts ask the kernel to read ahead this much (root only: sysfs), so a large file
# arrives in 1 MiB requests, the most libfuse3 takes, instead of the default 128 KiB.
_READ_AHEAD_KB = 1024


class _Args(ctypes.Structure):
    """libfuse3's struct fuse_args."""
    _fields_ = [("argc", ctypes.c_int), ("argv", ctypes.POINTER(ctypes.c_char_p)), ("allocated", ctypes.c_int)]


class _CmdlineOpts(ctypes.Structure):
    """libfuse3's struct fuse_cmdline_opts as of 3.0 (later versions only add fields at the end)."""
    _fields_ = [("singlethread", ctypes.c_int), ("foreground", ctypes.c_int), ("debug", ctypes.c_int),
                ("nodefault_subtype", ctypes.c_int), ("mountpoint", ctypes.c_void_p),
                ("show_version", ctypes.c_int), ("show_help", ctypes.c_int), ("clone_fd", ctypes.c_int),
                ("max_idle_threads", ctypes.c_uint), ("_later", ctypes.c_char * 64)]


def _libfuse_function(name: str, version: str, restype: Any, *argtypes: Any) -> Any:
    """libfuse's ``name`` at symbol version ``version`` (None if this libfuse has no such symbol).

    Asked for by version: libfuse gives a changed function a new version and keeps the old one
    under its old version, so the signatures given hold for every libfuse3.
    """
    address = _libc.dlvsym(fuse._libfuse._handle, name.encode(), version.encode())
    return ctypes.CFUNCTYPE(restype, *argtypes)(address) if address else None


class _Loop:
    """libfuse's fuse_main, with a request loop that watches for the next request before sleeping.

    Reading a small file costs the daemon two requests, each answered in tens of microseconds.
    libfuse's own loop goes to sleep in read() the moment the queue is empty, and on a virtual
    machine the next request must then wake a halted CPU, which costs more than answering it.
    So after each request this loop polls the device for up to ``poll_us`` microseconds and sleeps
    only when nothing came: a reader going through many files finds the daemon awake, and an idle
    mount costs at most ``poll_us`` of CPU after its last request. ``poll_us=0`` is libfuse's loop.
    The binding calls ``main`` in place of libfuse's fuse_main_real, with the same arguments.
    """

    def __init__(self, poll_us: int) -> None:
        self.poll_s = poll_us / 1e6
        vp, i = ctypes.c_void_p, ctypes.c_int
        self.parse_cmdline = _libfuse_function("fuse_parse_cmdline", "FUSE_3.0", i, ctypes.POINTER(_Args),
                                               ctypes.POINTER(_CmdlineOpts))
        self.new = _libfuse_function("fuse_new", "FUSE_3.1", vp, ctypes.POINTER(_Args), vp, ctypes.c_size_t, vp)
        self.mount = _libfuse_function("fuse_mount", "FUSE_3.0", i, vp, ctypes.c_char_p)
        self.unmount = _libfuse_function("fuse_unmount", "FUSE_3.0", None, vp)
        self.destroy = _libfuse_function("fuse_destroy", "FUSE_3.0", None, vp)
        self.session = _libfuse_function("fuse_get_session", "FUSE_3.0", vp, vp)
        self.set_signals = _libfuse_function("fuse_set_signal_handlers", "FUSE_3.0", i, vp)
        self.remove_signals = _libfuse_function("fuse_remove_signal_handlers", "FUSE_3.0", None, vp)
        self.session_fd = _libfuse_function("fuse_session_fd", "FUSE_3.0", i, vp)
        self.exited = _libfuse_function("fuse_session_exited", "FUSE_3.0", i, vp)
        self.receive = _libfuse_function("fuse_session_receive_buf", "FUSE_3.0", i, vp, ctypes.POINTER(_Buf))
        self.process = _libfuse_function("fuse_session_process_buf", "FUSE_3.0", None, vp, ctypes.POINTER(_Buf))
        self.reset = _libfuse_function("fuse_session_reset", "FUSE_3.0", None, vp)
        self.free_args = _libfuse_function("fuse_opt_free_args", "FUSE_3.0", None, ctypes.POINTER(_Args))

    def usable(self) -> bool:
        return all(f is not None for f in vars(self).values())

    def main(self, argc: int, argv: Any, ops: Any, ops_size: int, user_data: Any) -> int:
        # The steps of libfuse's fuse_main_real (helper.c), single-threaded, in the foreground.
        args = _Args(argc, argv, 0)
        opts = _CmdlineOpts()
        if self.parse_cmdline(ctypes.byref(args), ctypes.byref(opts)) != 0:
            return 1
        try:
            if not opts.mountpoint:
                log.error("FUSE: no mount point given")
                return 2
            f = self.new(ctypes.byref(args), ctypes.cast(ops, ctypes.c_void_p), ops_size, user_data)
            if not f:
                return 3
            try:
                if self.mount(f, ctypes.c_char_p(opts.mountpoint)) != 0:
                    return 4
                se = self.session(f)
                if self.set_signals(se) != 0:
                    self.unmount(f)
                    return 6
                try:
                    res = self.serve(se)
                finally:
                    self.remove_signals(se)
                    self.unmount(f)
                return 1 if res < 0 else 0
            finally:
                self.destroy(f)   # calls the operations' destroy
        finally:
            _libc.free(opts.mountpoint)
            self.free_args(ctypes.byref(args))

    def serve(self, se: int) -> int:
        """Answer requests until the file system is unmounted or a signal ends the session
        (libfuse's fuse_session_loop, with the watch described above)."""
        buf = _Buf()
        bufp = ctypes.byref(buf)
        receive, process, exited = self.receive, self.process, self.exited
        watch = select.poll()
        watch.register(self.session_fd(se), select.POLLIN)
        poll, clock, poll_s = watch.poll, time.perf_counter, self.poll_s
        res = 0
        try:
            while not exited(se):
                if poll_s and not poll(0):
                    until = clock() + poll_s
                    while not poll(0) and clock() < until:
                        pass
                    if exited(se):
                        break
                res = receive(se, bufp)
                if res == -errno.EINTR:
                    continue
                if res <= 0:   # 0: unmounted
                    break
                process(se, bufp)
        finally:
            _libc.free(buf.mem)
            self.reset(se)
        return min(res, 0)


_INO_BITS = (1 << 63) - 1


def _ino(path: str) -> int:
    """A path's inode number: the same for the mount's life, whatever the kernel forgets.

    (libfuse would number nodes itself, and give a new number to a name looked up again after
    the kernel dropped it under memory pressure; cp, rsync and tar compare inode numbers
    between a stat and an open, and call such a file "replaced while being copied".)
    """
    if path == "/":
        return 1   # the kernel numbers the root 1 (FUSE_ROOT_ID)
    return (hash(path) & _INO_BITS) or 2


class _MetaInvalidator:
    """Makes the kernel forget ``.tfrfs`` whenever ``.tfrfs/errors`` grows.

    A read-only mount lets the kernel keep names, sizes and pages for a day, and it never
    opens files (reads come by path), so nothing else would make it ask for the new size. The
    notice goes out from its own thread: sent from inside a request it could wait on a lock
    that the request holds (libfuse's rule for notifications).
    """

    _PARENT = 1   # the mount's root: FUSE_ROOT_ID
    _NAME = b".tfrfs"

    def __init__(self) -> None:
        self._session: int | None = None
        self._wake = threading.Event()
        self._notify = _libfuse_function("fuse_lowlevel_notify_inval_entry", "FUSE_3.0", ctypes.c_int,
                                         ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t)

    def bind(self) -> None:
        """Find the FUSE session; call from inside a FUSE callback (``init``)."""
        get_session = _libfuse_function("fuse_get_session", "FUSE_3.0", ctypes.c_void_p, ctypes.c_void_p)
        if get_session is not None and self._notify is not None:
            self._session = get_session(fuse._libfuse.fuse_get_context().contents.fuse)
        if not self._session:
            log.warning("no FUSE session found: .tfrfs/errors may show an old size until remount")
            return
        threading.Thread(target=self._run, name="tfrfs-notify", daemon=True).start()

    def poke(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        notify = self._notify
        while True:
            self._wake.wait()
            self._wake.clear()
            rc = notify(self._session, self._PARENT, self._NAME, len(self._NAME))
            if rc not in (0, -errno.ENOENT):   # ENOENT: the kernel holds no such name, nothing to do
                log.debug("kernel notification for .tfrfs failed: %s", os.strerror(-rc))
                if rc in (-errno.ENODEV, -errno.EBADF):
                    return   # unmounted


def _widen_readahead(mountpoint: str) -> None:
    """Let the kernel read ahead ``_READ_AHEAD_KB`` on this mount (its backing device's sysfs knob).

    Runs on its own thread: the stat below is answered by the daemon, which must first have
    finished ``init``; and the kernel sets its own read-ahead when that reply arrives.
    """
    try:
        dev = os.stat(mountpoint).st_dev
        knob = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
        with open(knob, "w") as f:
            f.write(f"{_READ_AHEAD_KB}\n")
        log.info("read-ahead %d KiB (%s)", _READ_AHEAD_KB, knob)
    except OSError as exc:   # not root, or no sysfs: large files come in 128 KiB reads
        log.info("read-ahead left at the kernel's default (raising it needs root): %s", exc)


def errno_of(exc: BaseException, op: str, args: tuple) -> int:
    """The errno an exception raised by an operation stands for: the one place errors are mapped."""
    if isinstance(exc, fuse.FuseOSError):
        return exc.errno
    if isinstance(exc, TfrfsError):
        return exc.errno
    if isinstance(exc, UnicodeError):
        return errno.ENOENT
    if isinstance(exc, OSError):
        if exc.errno and exc.errno > 0:
            return exc.errno
        log.error("%s %r failed without an errno", op, args[:1], exc_info=exc)
        return errno.EIO
    log.error("internal error in %s %r", op, args[:1], exc_info=exc)
    return errno.EIO


class _Fuse(fuse.FUSE):
    """The binding, with tfrfs's error mapping and the libfuse3 calls it does not pass on whole."""

    def _wrapper(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        # Every callback from libfuse comes through here.
        try:
            return func(*args, **kwargs) or 0
        except Exception as exc:
            if func.__name__.startswith("init"):
                log.error("FUSE init failed", exc_info=exc)
                return 0
            return -errno_of(exc, func.__name__, args[:1])

    def readdir_fuse_3(self, path: bytes, buf: Any, filler: Any, offset: int, fip: Any, flags: int) -> int:
        plus = bool(flags & _READDIR_PLUS)
        fill_flags = _FILL_DIR_PLUS if plus else 0
        st = fuse.c_stat()
        for position, name, attrs in self.operations.readdir(path.decode(self.encoding, self.errors), offset, plus):
            ctypes.memset(ctypes.byref(st), 0, ctypes.sizeof(st))
            fuse.set_st_attrs(st, attrs, use_ns=True)
            if filler(buf, name.encode(self.encoding, self.errors), st, position, fill_flags):
                break
        return 0

    def read_buf(self, path: bytes, bufpp: Any, size: int, offset: int, fip: Any) -> int:
        # A read of a read-only mount. Bytes that lie in a file the tree holds open (large images,
        # plain files) go to libfuse as that descriptor and position: libfuse copies them in C,
        # and Python never touches them. Others, and images of records read
        # ahead (held in memory), are copied into a buffer that libfuse frees.
        where, data = self.operations.read_buf(path.decode(self.encoding, self.errors), size, offset)
        vec_p = _libc.malloc(ctypes.sizeof(_BufVec))
        if not vec_p:
            return -errno.ENOMEM
        vec = _BufVec.from_address(vec_p)
        vec.count, vec.idx, vec.off = 1, 0, 0
        buf = vec.buf
        if where is not None:
            buf.fd, buf.pos, buf.size = where
            buf.flags, buf.mem = _BUF_IS_FD | _BUF_FD_SEEK, None
        else:
            n = len(data)
            mem = _libc.malloc(n or 1)
            if not mem:
                _libc.free(vec_p)
                return -errno.ENOMEM
            if isinstance(data, memoryview):   # memory the tree holds: copied from where it lies
                if n:
                    ctypes.memmove(mem, ctypes.addressof(ctypes.c_char.from_buffer(data)), n)
            else:
                ctypes.memmove(mem, data, n)
            buf.flags, buf.mem, buf.size, buf.fd, buf.pos = 0, mem, n, -1, 0
        ctypes.cast(bufpp, ctypes.POINTER(ctypes.c_void_p))[0] = vec_p
        return 0

    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        # ftruncate arrives here with the file's handle (the binding would drop it).
        fi = fip.contents if fip else None
        return self.operations.truncate(None if path is None else path.decode(self.encoding, self.errors),
                                        length, fi)

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        return self.operations.rename(old.decode(self.encoding, self.errors),
                                      new.decode(self.encoding, self.errors), flags)


class Operations:
    """Operations for a read-only tree.

    Files are read by path: ``open`` answers "not implemented", which the kernel takes as
    "opening always succeeds" and stops sending opens and releases, two of the four requests
    that reading a small file would otherwise cost.
    """

    use_ns = True   # times in nanoseconds

    def __init__(self, tree: Tree, mountpoint: str = "") -> None:
        self.tree = tree
        self.mountpoint = mountpoint
        self._handles: dict[int, FileHandle] = {}
        self._next_fh = 1
        self._fh_lock = threading.Lock()   # not "lock": that would register a lock operation

    # -- helpers --------------------------------------------------------------

    def _attrs(self, st: Stat, path: str) -> dict[str, int]:
        mode = (_stat.S_IFDIR | self.tree.dir_mode) if st.is_dir else (_stat.S_IFREG | self.tree.file_mode)
        return {
            "st_ino": _ino(path),
            "st_mode": mode, "st_nlink": st.nlink, "st_size": st.size,
            "st_uid": self.tree.uid, "st_gid": self.tree.gid,
            "st_mtime": st.mtime_ns, "st_ctime": st.mtime_ns, "st_atime": st.mtime_ns,
            "st_blocks": (st.size + 511) // 512, "st_blksize": 131072,
        }

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
        # replies (FUSE_CAP_SPLICE_WRITE): most large images are served from memory (see
        # Tree.read_held), which libfuse would copy into a pipe first and then out of it.
        conn.want = (conn.want | _CAP_READDIRPLUS) & ~_CAP_READDIRPLUS_AUTO
        invalidator = _MetaInvalidator()
        invalidator.bind()
        self.tree.errors.on_change = invalidator.poke
        if self.mountpoint:
            threading.Thread(target=_widen_readahead, args=(self.mountpoint,), name="tfrfs-readahead",
                             daemon=True).start()

    def getattr(self, path: str, fh: Any = None) -> dict[str, int]:
        return self._attrs(self.tree.stat(self.tree.lookup(path)), path)

    def access(self, path: str, amode: int) -> int:
        self.tree.lookup(path)
        if amode & os.W_OK and not self.tree.writable:
            raise fuse.FuseOSError(errno.EROFS)
        return 0

    def opendir(self, path: str) -> int:
        node = self.tree.lookup(path)
        if isinstance(node, FILE_NODES):
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
        if plus:
            for pos, name, child in tree.entries(node, max(0, offset - 2)):
                yield pos + 3, name, self._attrs(tree.stat(child), prefix + name)
            return
        for name, is_dir in tree.names(node):
            yield 0, name, {"st_mode": _stat.S_IFDIR if is_dir else _stat.S_IFREG, "st_ino": _ino(prefix + name)}

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

    def __init__(self, mount: Mount) -> None:
        super().__init__(mount.tree)
        assert mount.files is not None and mount.folders is not None and mount.renames is not None
        self.mount = mount
        self.files = mount.files
        self.folders = mount.folders
        self.renames = mount.renames

    def getattr(self, path: str, fh: Any = None) -> dict[str, int]:
        size = self.files.pending_size(path)
        if size is not None:   # a file being created: no feature behind it yet
            return self._attrs(Stat(False, size, time.time_ns()), path)
        return super().getattr(path, fh)

    def access(self, path: str, amode: int) -> int:
        if self.files.pending_size(path) is None:
            self.tree.lookup(path)
        return 0

    def open(self, path: str, fi: Any) -> int:
        if fi.flags & os.O_ACCMODE == os.O_RDONLY and not fi.flags & os.O_TRUNC:
            return super().open(path, fi)
        fi.fh = self._new_handle(self.files.open(path, fi.flags))
        fi.direct_io = 0
        return 0

    def create(self, path: str, mode: int, fi: Any) -> int:
        fi.fh = self._new_handle(self.files.create(path, fi.flags))
        return 0

    def write(self, path: str, data: bytes, offset: int, fi: Any) -> int:
        return self._handles[fi.fh].write(data, offset)

    def truncate(self, path: str, length: int, fi: Any = None) -> int:
        if fi is not None and fi.fh in self._handles:
            self._handles[fi.fh].truncate(length)
            return 0
        self.files.truncate_path(path, length)
        return 0

    def flush(self, path: str, fi: Any) -> int:
        handle = self._handles.get(fi.fh)
        if handle is not None:
            handle.flush()
        return 0

    def fsync(self, path: str, datasync: int, fi: Any) -> int:
        return self.flush(path, fi)

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
        self.files.unlink(path)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        self.folders.mkdir(path)
        return 0

    def rmdir(self, path: str) -> int:
        self.folders.rmdir(path)
        return 0

    def rename(self, old: str, new: str, flags: int = 0) -> int:
        if flags & ~_RENAME_NOREPLACE:
            raise fuse.FuseOSError(errno.EINVAL)   # RENAME_EXCHANGE, RENAME_WHITEOUT: not supported
        if flags & _RENAME_NOREPLACE and self._present(new):
            raise fuse.FuseOSError(errno.EEXIST)
        self.renames.rename(old, new)
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
        self._exists(path)   # cp -a copies our own xattrs back: accepted, and ignored
        return 0

    def removexattr(self, path: str, name: str) -> int:
        self._exists(path)
        return 0

    def _exists(self, path: str) -> None:
        if self.files.pending_size(path) is None:
            self.tree.lookup(path)

    def _present(self, path: str) -> bool:
        try:
            self._exists(path)
        except TfrfsError:
            return False
        return True

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self.tree.discovery.root)
        return {k: getattr(st, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                            "f_files", "f_ffree", "f_favail", "f_namemax")}

    def destroy(self, path: str) -> None:
        # fusermount -u and tfrfs umount both end here: commit what is staged.
        try:
            self.mount.commit()
        except TfrfsError as exc:
            log.error("commit at unmount failed, edits stay staged: %s", exc)
        finally:
            super().destroy(path)


def mount(m: Mount, mountpoint: str, *, poll_us: int, fsname: str = "tfrfs") -> None:
    """Serve mount ``m`` at ``mountpoint`` until it is unmounted (in this process, in the foreground);
    after each request, watch ``poll_us`` microseconds for the next before sleeping (see _Loop)."""
    opts: dict[str, Any] = dict(
        foreground=True,
        nothreads=True,     # one thread: the tree's caches and the journal need no locking
        fsname=fsname,
        subtype="tfrfs",
        use_ino=True,       # inode numbers from _ino()
    )
    if m.writable:
        # No attribute or name caching: names and sizes change without a call through the kernel
        # for that path (a commit renumbers records; a PNG sets height.json; a value becomes
        # binary and city.txt is city.bin). The kernel reads no further than the size it holds,
        # and a name it still believes in makes open(O_CREAT) skip create and fail with ENOENT.
        # (Writes come in requests of up to 1 MiB, and open(O_TRUNC) as one open with the flag:
        # see init_with_config.)
        opts.update(attr_timeout=0.0, entry_timeout=0.0, negative_timeout=0)
        ops: Operations = WritableOperations(m)
    else:
        # Nothing changes under a read-only mount: let the kernel keep attributes, names and data.
        opts.update(ro=True, kernel_cache=True, attr_timeout=86400.0, entry_timeout=86400.0,
                    negative_timeout=60.0)
        ops = Operations(m.tree, mountpoint)
    loop = _Loop(poll_us)
    binding_main = fuse.fuse_main_real   # what the binding calls to run libfuse
    if loop.usable():
        fuse.fuse_main_real = loop.main
    else:
        log.warning("this libfuse lacks a function the request loop needs; using libfuse's own loop "
                    "(no --poll-us): %s", fuse._libfuse_path)
    try:
        _Fuse(ops, mountpoint, raw_fi=True, encoding="utf-8", errors="surrogateescape", **opts)
    finally:
        fuse.fuse_main_real = binding_main
