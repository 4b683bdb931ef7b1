"""libfuse3's low-level API, through ctypes: the only module that touches libfuse.

tfrfs talks to libfuse's low-level API rather than through a high-level binding (README, "Choices
where the contract is silent"): its requests name node ids, so the daemon keeps only the names the
kernel holds (``tfrfs.fuse.inodes``) and lets the kernel cache listings (``cache_readdir``, which
libfuse's high-level API passes on only from 3.16.1), and its session is read by several threads
at once, so requests that wait on the disk or the network overlap.

- ``Session``: a low-level session answering with a ``handler`` (``tfrfs.fuse.requests``), served
  by ``workers`` threads until the kernel unmounts it or a stop signal comes (``End`` says which).
- ``Session.notifier``: tells the kernel to forget a name or a node's cached data (``notices``).
- ``widen_readahead``: the mount's read-ahead in sysfs.

Every callback answers its request exactly once. The handler raises ``Refused`` (an errno) for a
request that fails; anything else it raises is mapped by ``edge.errno_of`` (logged, EIO). Nothing
here knows the dataset.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import platform
import select
import signal
import sys
import threading
import time
from typing import Any, Callable

from tfrfs.fuse import direct, turns
from tfrfs.fuse.edge import Refused, errno_of
from tfrfs.fuse.notices import Notifier
from tfrfs.fuse.loop import (UTIME_NOW, WAKE, Conn, End, Entry, MountFailed, Opened, SetAttr, read_signal,
                             signal_name, stop_signals)

log = logging.getLogger("tfrfs")


def _load() -> tuple[ctypes.CDLL, str]:
    path = (os.environ.get("FUSE_LIBRARY_PATH") or ctypes.util.find_library("fuse3") or "libfuse3.so.3")
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise ImportError(f"{exc}: tfrfs needs libfuse3 (Debian/Ubuntu: apt-get install fuse3)") from None
    if not hasattr(lib, "fuse_session_new"):
        raise ImportError(f"tfrfs needs libfuse3, and {path} is not it")
    return lib, path


_lib, LIBFUSE_PATH = _load()
_libc = ctypes.CDLL(None, use_errno=True)
_libc.dlvsym.restype = ctypes.c_void_p
_libc.dlvsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
_libc.free.restype = None
_libc.free.argtypes = [ctypes.c_void_p]

u32, u64, i64, vp = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64, ctypes.c_void_p

if platform.machine() in ("aarch64", "arm64", "riscv64", "loongarch64"):
    class _Stat(ctypes.Structure):
        """struct stat of the generic 64-bit Linux ABI."""
        _fields_ = [("st_dev", u64), ("st_ino", u64), ("st_mode", u32), ("st_nlink", u32), ("st_uid", u32),
                    ("st_gid", u32), ("st_rdev", u64), ("_pad1", u64), ("st_size", i64), ("st_blksize", ctypes.c_int32),
                    ("_pad2", ctypes.c_int32), ("st_blocks", i64), ("st_atime", i64), ("st_atime_ns", i64),
                    ("st_mtime", i64), ("st_mtime_ns", i64), ("st_ctime", i64), ("st_ctime_ns", i64),
                    ("_unused", ctypes.c_int32 * 2)]
else:
    class _Stat(ctypes.Structure):   # type: ignore[no-redef]
        """struct stat of x86_64 Linux."""
        _fields_ = [("st_dev", u64), ("st_ino", u64), ("st_nlink", u64), ("st_mode", u32), ("st_uid", u32),
                    ("st_gid", u32), ("_pad0", ctypes.c_int32), ("st_rdev", u64), ("st_size", i64),
                    ("st_blksize", i64), ("st_blocks", i64), ("st_atime", i64), ("st_atime_ns", i64),
                    ("st_mtime", i64), ("st_mtime_ns", i64), ("st_ctime", i64), ("st_ctime_ns", i64),
                    ("_unused", i64 * 3)]


class _StatVfs(ctypes.Structure):
    _fields_ = [("f_bsize", ctypes.c_ulong), ("f_frsize", ctypes.c_ulong), ("f_blocks", u64), ("f_bfree", u64),
                ("f_bavail", u64), ("f_files", u64), ("f_ffree", u64), ("f_favail", u64),
                ("f_fsid", ctypes.c_ulong), ("f_flag", ctypes.c_ulong), ("f_namemax", ctypes.c_ulong),
                ("_spare", ctypes.c_int * 6)]


class _FileInfo(ctypes.Structure):
    """struct fuse_file_info (libfuse 3.0 to 3.16)."""
    _fields_ = [("flags", ctypes.c_int), ("writepage", ctypes.c_uint, 1), ("direct_io", ctypes.c_uint, 1),
                ("keep_cache", ctypes.c_uint, 1), ("flush", ctypes.c_uint, 1), ("nonseekable", ctypes.c_uint, 1),
                ("flock_release", ctypes.c_uint, 1), ("cache_readdir", ctypes.c_uint, 1),
                ("noflush", ctypes.c_uint, 1), ("padding", ctypes.c_uint, 24), ("padding2", ctypes.c_uint, 32),
                ("fh", u64), ("lock_owner", u64), ("poll_events", u32)]


class _ConnInfo(ctypes.Structure):
    _fields_ = [("proto_major", u32), ("proto_minor", u32), ("max_write", u32), ("max_read", u32),
                ("max_readahead", u32), ("capable", u32), ("want", u32), ("max_background", u32),
                ("congestion_threshold", u32), ("time_gran", u32), ("reserved", u32 * 22)]


class _EntryParam(ctypes.Structure):
    _fields_ = [("ino", u64), ("generation", u64), ("attr", _Stat), ("attr_timeout", ctypes.c_double),
                ("entry_timeout", ctypes.c_double)]


class _Buf(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("flags", ctypes.c_int), ("mem", vp), ("fd", ctypes.c_int),
                ("pos", i64)]


class _BufVec(ctypes.Structure):
    _fields_ = [("count", ctypes.c_size_t), ("idx", ctypes.c_size_t), ("off", ctypes.c_size_t), ("buf", _Buf)]


class _Args(ctypes.Structure):
    _fields_ = [("argc", ctypes.c_int), ("argv", ctypes.POINTER(ctypes.c_char_p)), ("allocated", ctypes.c_int)]


class _Forget(ctypes.Structure):
    _fields_ = [("ino", u64), ("nlookup", u64)]


_BUF_IS_FD, _BUF_FD_SEEK = 1 << 1, 1 << 2
_SET_MODE, _SET_UID, _SET_GID, _SET_SIZE = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_SET_ATIME, _SET_MTIME, _SET_ATIME_NOW, _SET_MTIME_NOW = 1 << 4, 1 << 5, 1 << 7, 1 << 8

req_t, ino_t, fi_p = vp, u64, ctypes.POINTER(_FileInfo)
_name = ctypes.c_char_p
_OPS: list[tuple[str, tuple[Any, ...]]] = [   # struct fuse_lowlevel_ops, in order (libfuse 3.0 to 3.16)
    ("init", (vp, ctypes.POINTER(_ConnInfo))), ("destroy", (vp,)), ("lookup", (req_t, ino_t, _name)),
    ("forget", (req_t, ino_t, u64)), ("getattr", (req_t, ino_t, fi_p)),
    ("setattr", (req_t, ino_t, ctypes.POINTER(_Stat), ctypes.c_int, fi_p)), ("readlink", (req_t, ino_t)),
    ("mknod", (req_t, ino_t, _name, ctypes.c_uint, u64)), ("mkdir", (req_t, ino_t, _name, ctypes.c_uint)),
    ("unlink", (req_t, ino_t, _name)), ("rmdir", (req_t, ino_t, _name)), ("symlink", (req_t, _name, ino_t, _name)),
    ("rename", (req_t, ino_t, _name, ino_t, _name, ctypes.c_uint)), ("link", (req_t, ino_t, ino_t, _name)),
    ("open", (req_t, ino_t, fi_p)), ("read", (req_t, ino_t, ctypes.c_size_t, i64, fi_p)),
    ("write", (req_t, ino_t, vp, ctypes.c_size_t, i64, fi_p)), ("flush", (req_t, ino_t, fi_p)),
    ("release", (req_t, ino_t, fi_p)), ("fsync", (req_t, ino_t, ctypes.c_int, fi_p)), ("opendir", (req_t, ino_t, fi_p)),
    ("readdir", (req_t, ino_t, ctypes.c_size_t, i64, fi_p)), ("releasedir", (req_t, ino_t, fi_p)),
    ("fsyncdir", (req_t, ino_t, ctypes.c_int, fi_p)), ("statfs", (req_t, ino_t)),
    ("setxattr", (req_t, ino_t, _name, vp, ctypes.c_size_t, ctypes.c_int)),
    ("getxattr", (req_t, ino_t, _name, ctypes.c_size_t)), ("listxattr", (req_t, ino_t, ctypes.c_size_t)),
    ("removexattr", (req_t, ino_t, _name)), ("access", (req_t, ino_t, ctypes.c_int)),
    ("create", (req_t, ino_t, _name, ctypes.c_uint, fi_p)), ("getlk", (req_t, ino_t, fi_p, vp)),
    ("setlk", (req_t, ino_t, fi_p, vp, ctypes.c_int)), ("bmap", (req_t, ino_t, ctypes.c_size_t, u64)),
    ("ioctl", (req_t, ino_t, ctypes.c_uint, vp, fi_p, ctypes.c_uint, vp, ctypes.c_size_t, ctypes.c_size_t)),
    ("poll", (req_t, ino_t, fi_p, vp)), ("write_buf", (req_t, ino_t, vp, i64, fi_p)),
    ("retrieve_reply", (req_t, vp, ino_t, i64, vp)), ("forget_multi", (req_t, ctypes.c_size_t, ctypes.POINTER(_Forget))),
    ("flock", (req_t, ino_t, fi_p, ctypes.c_int)), ("fallocate", (req_t, ino_t, ctypes.c_int, i64, i64, fi_p)),
    ("readdirplus", (req_t, ino_t, ctypes.c_size_t, i64, fi_p)),
]
_CALLBACK = {name: ctypes.CFUNCTYPE(None, *args) for name, args in _OPS}
# How long the session's end waits, once a worker ended without saying why ("exited"), for the
# others to say (see Session._wait): workers end within a request once the session is exited.
_END_GRACE_S = 2.0


class _LowlevelOps(ctypes.Structure):
    _fields_ = [(name, _CALLBACK[name]) for name, _ in _OPS]


def _function(name: str, restype: Any, *argtypes: Any, version: str = "FUSE_3.0") -> Any:
    """libfuse's ``name`` at symbol version ``version``: libfuse keeps a changed function's old
    version under its old name, so these signatures hold for every libfuse3."""
    address = _libc.dlvsym(_lib._handle, name.encode(), version.encode())
    if not address:
        raise ImportError(f"{LIBFUSE_PATH} has no {name}@{version}: tfrfs needs libfuse 3.0 or later")
    return ctypes.CFUNCTYPE(restype, *argtypes)(address)


_i = ctypes.c_int
_session_new = _function("fuse_session_new", vp, ctypes.POINTER(_Args), ctypes.POINTER(_LowlevelOps),
                         ctypes.c_size_t, vp)
_session_mount = _function("fuse_session_mount", _i, vp, ctypes.c_char_p)
_session_unmount = _function("fuse_session_unmount", None, vp)
_session_destroy = _function("fuse_session_destroy", None, vp)
_session_fd = _function("fuse_session_fd", _i, vp)
_session_exit = _function("fuse_session_exit", None, vp)
_session_exited = _function("fuse_session_exited", _i, vp)
_receive = _function("fuse_session_receive_buf", _i, vp, ctypes.POINTER(_Buf))
_process = _function("fuse_session_process_buf", None, vp, ctypes.POINTER(_Buf))
_reply_err = _function("fuse_reply_err", _i, req_t, _i)
_reply_none = _function("fuse_reply_none", None, req_t)
_reply_entry = _function("fuse_reply_entry", _i, req_t, ctypes.POINTER(_EntryParam))
_reply_create = _function("fuse_reply_create", _i, req_t, ctypes.POINTER(_EntryParam), fi_p)
_reply_attr = _function("fuse_reply_attr", _i, req_t, ctypes.POINTER(_Stat), ctypes.c_double)
_reply_open = _function("fuse_reply_open", _i, req_t, fi_p)
_reply_write = _function("fuse_reply_write", _i, req_t, ctypes.c_size_t)
_reply_buf = _function("fuse_reply_buf", _i, req_t, vp, ctypes.c_size_t)
_reply_data = _function("fuse_reply_data", _i, req_t, ctypes.POINTER(_BufVec), _i)
_reply_statfs = _function("fuse_reply_statfs", _i, req_t, ctypes.POINTER(_StatVfs))
_reply_xattr = _function("fuse_reply_xattr", _i, req_t, ctypes.c_size_t)
_notify_inval_entry = _function("fuse_lowlevel_notify_inval_entry", _i, vp, ino_t, ctypes.c_char_p, ctypes.c_size_t)
_notify_inval_inode = _function("fuse_lowlevel_notify_inval_inode", _i, vp, ino_t, i64, i64)


def _fill_stat(st: Any, attrs: dict[str, int]) -> None:
    for key in ("st_ino", "st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks", "st_blksize"):
        value = attrs.get(key)
        if value is not None:
            setattr(st, key, value)
    for key in ("st_atime", "st_mtime", "st_ctime"):
        ns = attrs.get(key)
        if ns is not None:
            setattr(st, key, ns // 1_000_000_000)
            setattr(st, key + "_ns", ns % 1_000_000_000)


def _param(e: Entry) -> _EntryParam:
    p = _EntryParam()
    p.ino, p.entry_timeout, p.attr_timeout = e.nodeid, e.entry_timeout, e.attr_timeout
    _fill_stat(p.attr, e.attrs)
    return p


def _into(fi: Any, o: Opened) -> None:
    fi.fh, fi.direct_io, fi.keep_cache, fi.cache_readdir = o.fh, int(o.direct_io), int(o.keep_cache), int(o.cache_readdir)


def _set_attr(st: Any, to_set: int) -> SetAttr:
    def ns(flag: int, now: int, sec: int, nsec: int) -> int | None:
        if to_set & now:
            return UTIME_NOW
        return sec * 1_000_000_000 + nsec if to_set & flag else None
    return SetAttr(size=st.st_size if to_set & _SET_SIZE else None,
                   mode=st.st_mode if to_set & _SET_MODE else None,
                   uid=st.st_uid if to_set & _SET_UID else None, gid=st.st_gid if to_set & _SET_GID else None,
                   atime_ns=ns(_SET_ATIME, _SET_ATIME_NOW, st.st_atime, st.st_atime_ns),
                   mtime_ns=ns(_SET_MTIME, _SET_MTIME_NOW, st.st_mtime, st.st_mtime_ns))


def _text(name: bytes) -> str:
    return name.decode("utf-8", "surrogateescape")


def _fh(fi: Any) -> int | None:
    return fi.contents.fh if fi else None


def _reply_bytes(req: int, data: bytes | memoryview) -> None:
    if isinstance(data, memoryview) and not data.readonly and data.contiguous:
        n = data.nbytes
        _reply_buf(req, ctypes.addressof(ctypes.c_char.from_buffer(data)) if n else None, n)
    else:
        data = bytes(data) if isinstance(data, memoryview) else data
        _reply_buf(req, data, len(data))


def _reply_read(req: int, answer: tuple[tuple[int, int, int] | None, bytes | memoryview]) -> None:
    where, data = answer
    if where is None:
        _reply_bytes(req, data)
        return
    vec = _BufVec(1, 0, 0)   # libfuse reads the bytes from the file itself, in C
    vec.buf.fd, vec.buf.pos, vec.buf.size = where
    vec.buf.flags = _BUF_IS_FD | _BUF_FD_SEEK
    _reply_data(req, ctypes.byref(vec), 0)


def _reply_xattr_value(req: int, value: bytes, size: int) -> None:
    if size == 0:
        _reply_xattr(req, len(value))
    elif len(value) > size:
        _reply_err(req, errno.ERANGE)
    else:
        _reply_buf(req, value, len(value))


def _reply_statvfs(req: int, values: dict[str, int]) -> None:
    st = _StatVfs()
    for key, value in values.items():
        setattr(st, key, value)
    _reply_statfs(req, ctypes.byref(st))


def _callbacks(h: Any) -> dict[str, Callable[..., None]]:
    """The low-level callbacks, each a translation of its C arguments for ``h`` and of its answer
    for libfuse; ``None`` answers "done" (0)."""
    ok = lambda req, _: _reply_err(req, 0)   # noqa: E731
    entry = lambda req, e: _reply_entry(req, ctypes.byref(_param(e)))   # noqa: E731
    attr = lambda req, a: _reply_attr(req, ctypes.byref(_stat_of(a[0])), a[1])   # noqa: E731

    def opened(req: int, fi: Any, answer: Opened) -> None:
        _into(fi.contents, answer)
        _reply_open(req, fi)

    def created(req: int, fi: Any, answer: tuple[Entry, Opened]) -> None:
        _into(fi.contents, answer[1])
        _reply_create(req, ctypes.byref(_param(answer[0])), fi)

    table: dict[str, tuple[Callable[..., Any], Callable[..., None]]] = {
        "lookup": (lambda p, n: h.lookup(p, _text(n)), entry),
        "getattr": (lambda ino, fi: h.getattr(ino), attr),
        "setattr": (lambda ino, st, to_set, fi: h.setattr(ino, _set_attr(st.contents, to_set), _fh(fi)), attr),
        "mkdir": (lambda p, n, mode: h.mkdir(p, _text(n), mode), entry),
        "unlink": (lambda p, n: h.unlink(p, _text(n)), ok),
        "rmdir": (lambda p, n: h.rmdir(p, _text(n)), ok),
        "rename": (lambda p, n, np, nn, flags: h.rename(p, _text(n), np, _text(nn), flags), ok),
        "read": (lambda ino, size, off, fi: h.read(ino, size, off, _fh(fi)), _reply_read),
        "write": (lambda ino, buf, size, off, fi: h.write(ino, ctypes.string_at(buf, size), off, fi.contents.fh),
                  lambda req, n: _reply_write(req, n)),
        "flush": (lambda ino, fi: h.flush(ino, fi.contents.fh), ok),
        "release": (lambda ino, fi: h.release(ino, fi.contents.fh), ok),
        "fsync": (lambda ino, datasync, fi: h.fsync(ino, datasync, fi.contents.fh), ok),
        "releasedir": (lambda ino, fi: h.releasedir(ino, fi.contents.fh), ok),
        "readdir": (lambda ino, size, off, fi: h.readdir(ino, size, off, _fh(fi), False), _reply_bytes),
        "readdirplus": (lambda ino, size, off, fi: h.readdir(ino, size, off, _fh(fi), True), _reply_bytes),
        "statfs": (lambda ino: h.statfs(ino), _reply_statvfs),
        "setxattr": (lambda ino, n, v, size, flags: h.setxattr(ino, _text(n), ctypes.string_at(v, size), flags), ok),
        "removexattr": (lambda ino, n: h.removexattr(ino, _text(n)), ok),
        "access": (lambda ino, mask: h.access(ino, mask), ok),
    }
    out: dict[str, Callable[..., None]] = {}
    for name, (call, reply) in table.items():
        if hasattr(h, name if not name.startswith("readdir") else "readdir") and (name != "readdirplus" or h.plus):
            out[name] = _answering(name, call, reply)
    if hasattr(h, "getxattr"):
        out["getxattr"] = _answering("getxattr", lambda ino, n, size: (h.getxattr(ino, _text(n)), size),
                                     lambda req, a: _reply_xattr_value(req, *a))
        out["listxattr"] = _answering("listxattr", lambda ino, size: (h.listxattr(ino), size),
                                      lambda req, a: _reply_xattr_value(req, *a))
    # (answered into the request's own file info: the call's answer goes with it)
    for name, method in (("open", h.open), ("opendir", h.opendir)):
        out[name] = _answering(name, lambda ino, fi, m=method: (fi, m(ino, fi.contents.flags)),
                               lambda req, a: opened(req, *a))
    if hasattr(h, "create"):
        out["create"] = _answering("create", lambda p, n, mode, fi: (fi, h.create(p, _text(n), mode, fi.contents.flags)),
                                   lambda req, a: created(req, *a))

    def forget(req: int, ino: int, n: int) -> None:
        _guarded("forget", lambda: h.forget(ino, n))
        _reply_none(req)

    def forget_multi(req: int, count: int, forgets: Any) -> None:
        _guarded("forget", lambda: h.forget_many([(forgets[k].ino, forgets[k].nlookup) for k in range(count)]))
        _reply_none(req)

    def init(userdata: int, conn: Any) -> None:
        c = Conn(conn.contents.capable, conn.contents.want)
        _guarded("init", lambda: h.init(c))
        conn.contents.want = c.want & c.capable

    out.update(forget=forget, forget_multi=forget_multi, init=init)
    return out


def _stat_of(attrs: dict[str, int]) -> _Stat:
    st = _Stat()
    _fill_stat(st, attrs)
    return st


def _guarded(name: str, call: Callable[[], Any]) -> None:
    try:
        call()
    except BaseException as exc:   # nothing may leave a callback: libfuse would never be answered
        log.error("internal error in %s", name, exc_info=exc)


def _answering(name: str, call: Callable[..., Any], reply: Callable[[int, Any], None]) -> Callable[..., None]:
    def callback(req: int, *args: Any) -> None:
        try:
            answer = call(*args)
        except Refused as exc:
            _reply_err(req, exc.errno)
            return
        except BaseException as exc:   # a bug: logged once, answered EIO
            _reply_err(req, errno_of(exc if isinstance(exc, Exception) else RuntimeError(exc), name, args))
            return
        try:
            reply(req, answer)
        except BaseException as exc:
            log.error("answering %s failed", name, exc_info=exc)
            _reply_err(req, errno.EIO)
    return callback


class Session:
    """A low-level session answering with ``handler``, served by ``workers`` threads.

    ``handler`` has a method per request it answers (``tfrfs.fuse.requests.Requests``; a missing
    one is answered ENOSYS by libfuse, or as libfuse's default for open, opendir and release), and
    ``plus``: whether listings carry attributes (readdirplus). ``options`` are libfuse's mount
    options (``fsname=tfrfs,ro,...``).

    ``serve`` mounts, answers requests until the kernel unmounts the file system or a stop signal
    (SIGTERM, SIGINT, SIGHUP) comes, and returns why (``End``) with the mount already detached;
    ``close`` then frees the session. One worker, the reader, takes the requests one at a time;
    the others help while it waits on the disk or the network (``turns``). Over the compiled
    table (a local read-only mount: ``answers``) every worker reads the device itself, in C, and
    answers what the table holds without Python's lock (``direct.Answerer.serve``). A stop signal is read by the calling thread from a wakeup pipe (Python's
    handler writes the signal's number there), so an unmount can be told from a signal; the
    workers are then woken with ``WAKE`` to see that the session ended.
    """

    def __init__(self, handler: Any, options: str, workers: int, poll_us: int = 0) -> None:
        self.workers = max(1, workers)
        self.turns = turns.Turns(poll_us)
        self._poll_us = poll_us
        self._keep = _callbacks(handler)   # the C callbacks must live as long as the session
        ops = _LowlevelOps(**{name: _CALLBACK[name](fn) for name, fn in self._keep.items()})
        self._ops = ops
        argv = (ctypes.c_char_p * 4)(b"tfrfs", b"-o", options.encode(), None)
        self._argv = argv
        args = _Args(3, ctypes.cast(argv, ctypes.POINTER(ctypes.c_char_p)), 0)
        self.se = _session_new(ctypes.byref(args), ctypes.byref(ops), ctypes.sizeof(ops), None)
        if not self.se:
            raise MountFailed("libfuse refused the mount options (libfuse's message says why)")
        self._threads: list[threading.Thread] = []
        self._ends: list[End] = []
        self._done_r, self._done_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._handler = handler
        self._direct: direct.Answerer | None = None

    def end(self) -> None:
        """End the session from inside (a failed init): the workers stop after this request."""
        _session_exit(self.se)
        self.turns.stop()
        os.write(self._done_w, b"x")

    def serve(self, mountpoint: str) -> End:
        if _session_mount(self.se, mountpoint.encode()) != 0:
            raise MountFailed("libfuse could not mount (libfuse's message says why)")
        if not getattr(self._handler, "writable", True):
            # a read-only mount's small requests are answered in Python from their bytes (direct)
            self._direct = direct.answerer(self._handler, _session_fd(self.se))
        sys.setswitchinterval(turns.SWITCH_S)
        ended: End | None = None
        try:
            with stop_signals() as wakeup:
                for k in range(self.workers):
                    t = threading.Thread(target=self._work, args=(k,), name=f"tfrfs-fuse-{k}", daemon=True)
                    t.start()
                    self._threads.append(t)
                ended = self._wait(wakeup)
                _session_exit(self.se)
                self.turns.stop()
                self._wake_workers()
                for t in self._threads:   # (while WAKE is still handled: its default ends the process)
                    t.join(1.0)
        finally:
            _session_unmount(self.se)   # after a signal: detached lazily
        return ended

    def _wait(self, wakeup: int | None) -> End:
        watch = select.poll()
        watch.register(self._done_r, select.POLLIN)
        if wakeup is not None:
            watch.register(wakeup, select.POLLIN)
        since: float | None = None   # when the first worker ended without saying why
        while True:
            timeout = None if since is None else max(0.0, since + _END_GRACE_S - time.monotonic()) * 1000
            for fd, _ in watch.poll(timeout):
                if fd == wakeup:
                    return End("signal", signal_name(read_signal(fd)))
                with contextlib.suppress(BlockingIOError):
                    os.read(self._done_r, 64)
            # The worker that reads the kernel's ENODEV (an unmount) ends "unmounted"; libfuse
            # marks the session exited as it does, so the others may end "exited" first: an
            # end that says why wins, and one that does not waits (briefly) for the others.
            ends = list(self._ends)
            decisive = next((e for e in ends if e.how != "exited"), None)
            if decisive is not None:
                return decisive
            if ends or _session_exited(self.se):
                since = since if since is not None else time.monotonic()
                if len(ends) >= self.workers or time.monotonic() >= since + _END_GRACE_S:
                    return ends[0] if ends else End("exited")

    def _work(self, k: int) -> None:
        """Worker ``k``: the reader (0), or a helper (see ``_help``); over the compiled table,
        each reads the device (``direct.Answerer.serve``), the first watching it ``poll_us``."""
        buf = _Buf()
        se, bufp = self.se, ctypes.byref(buf)
        end = End("exited")
        device = select.poll()
        device.register(_session_fd(se), select.POLLIN)
        d = self._direct
        try:
            if d is not None and d.table is not None:
                res = d.serve(self._poll_us if k == 0 else 0, lambda: bool(_session_exited(se)), self._rest)
                end = End("exited") if res is None else self._ended(res)
            else:
                end = self._read(buf, bufp, device) if k == 0 else self._help(buf, bufp, device)
        finally:
            _libc.free(buf.mem)
            self._ends.append(end)
            with contextlib.suppress(OSError):
                os.write(self._done_w, b"x")

    def _read(self, buf: _Buf, bufp: Any, device: Any) -> End:
        """The reader: takes every request, one at a time."""
        se, t = self.se, self.turns
        while not _session_exited(se):
            t.watch(device.poll)
            res = _receive(se, bufp)
            if res in (-errno.EINTR, -errno.EAGAIN):
                continue
            if res <= 0:   # 0: unmounted (libfuse read ENODEV)
                return self._ended(res)
            t.begin()
            try:
                self._answer(buf, bufp, res)
            finally:
                t.done()
        return End("exited")

    def _help(self, buf: _Buf, bufp: Any, device: Any) -> End:
        """A helper: takes a request when ``Turns.helper_turn`` says so."""
        se, t = self.se, self.turns
        while not _session_exited(se):
            if not t.helper_turn(device.poll):
                continue
            res = _receive(se, bufp)   # (if the reader took it first: the next request)
            if res in (-errno.EINTR, -errno.EAGAIN):
                continue
            if res <= 0:
                return self._ended(res)
            t.helped()
            self._answer(buf, bufp, res)
        return End("exited")

    def _rest(self, address: int, size: int) -> None:
        """Hand libfuse the request of ``size`` bytes at ``address``."""
        _process(self.se, ctypes.byref(_Buf(size, 0, address, -1, 0)))

    def _answer(self, buf: _Buf, bufp: Any, res: int) -> None:
        d = self._direct
        if d is None or res > direct.LARGEST or buf.flags & _BUF_IS_FD:
            _process(self.se, bufp)
        elif d.table is None or not d.table.answer_at(buf.mem, res):   # (C first: answers.py)
            if not d.answer(ctypes.string_at(buf.mem, res)):
                _process(self.se, bufp)

    def _ended(self, res: int) -> End:
        if res < 0:
            log.error("reading a request from the kernel failed: %s", os.strerror(-res))
            return End("failed")
        return End("unmounted")

    def _wake_workers(self) -> None:
        for t in self._threads:
            if t.is_alive() and t.ident is not None:
                with contextlib.suppress(ProcessLookupError, OSError):
                    signal.pthread_kill(t.ident, WAKE)

    def close(self, timeout: float = 5.0) -> None:
        """Free the session once every worker has stopped (else leave it: the process is ending)."""
        for t in self._threads:
            t.join(timeout)
        os.close(self._done_r)
        os.close(self._done_w)
        if not any(t.is_alive() for t in self._threads):
            _session_destroy(self.se)
        else:
            log.info("a request was still being answered when the mount ended")
        self.se = None

    def notifier(self) -> Notifier:
        se = self.se

        def send(nodeid: int, name: bytes | None) -> int:
            if name is None:
                return int(_notify_inval_inode(se, nodeid, 0, 0))
            return int(_notify_inval_entry(se, nodeid, name, len(name)))
        return Notifier(send)
