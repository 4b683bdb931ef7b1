"""libfuse3 below the binding: the request loop, kernel notifications and read_buf buffers.

What tfrfs asks of libfuse that the FUSE binding does not offer is done here, through
ctypes, on the libfuse the binding loaded: ``fuse_ops`` (the only module that imports the
binding) hands over its handle. Nothing here knows the binding or the tree.

- ``Loop``: libfuse's fuse_main, with a request loop that watches for the next request a
  little while before sleeping, and knows why it ended (``End``): the kernel's unmount, or a
  stop signal (SIGTERM, SIGINT, SIGHUP) — a writable mount commits on the first only.
- ``MetaInvalidator``: tells the kernel to forget ``.tfrfs`` when ``.tfrfs/errors`` grows.
- ``fill_read_buf``: the answer to a read_buf call, from a (descriptor, position, count) or
  from bytes in memory.
- ``widen_readahead``: the mount's read-ahead in sysfs.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

log = logging.getLogger("tfrfs")

# libfuse3's fuse_common.h
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


def _libfuse_function(libfuse: int, name: str, version: str, restype: Any, *argtypes: Any) -> Any:
    """The function ``name`` at symbol version ``version`` of the libfuse loaded at handle ``libfuse``
    (None if this libfuse has no such symbol).

    Asked for by version: libfuse gives a changed function a new version and keeps the old one
    under its old version, so the signatures given hold for every libfuse3.
    """
    address = _libc.dlvsym(libfuse, name.encode(), version.encode())
    return ctypes.CFUNCTYPE(restype, *argtypes)(address) if address else None


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class End:
    """Why a request loop ended."""

    how: str                    # "unmounted", "signal", "failed", or "exited" (the session was ended from inside)
    signal: str | None = None   # with "signal": its name (SIGTERM)

    @property
    def unmounted(self) -> bool:
        """Ended by the kernel: fusermount3 -u, umount, or tfrfs umount (or the connection aborted)."""
        return self.how == "unmounted"

    def __str__(self) -> str:
        return {"unmounted": "unmounted", "signal": f"stopped by {self.signal}", "failed": "ended by an error",
                "exited": "ended from inside"}[self.how]


class Loop:
    """libfuse's fuse_main, with a request loop that watches for the next request before sleeping.

    Reading a small file costs the daemon two requests, each answered in tens of microseconds.
    libfuse's own loop goes to sleep in read() the moment the queue is empty, and on a virtual
    machine the next request must then wake a halted CPU, which costs more than answering it.
    So after each request this loop polls the device for up to ``poll_us`` microseconds and sleeps
    only when nothing came: a reader going through many files finds the daemon awake, and an idle
    mount costs at most ``poll_us`` of CPU after its last request. ``poll_us=0`` is libfuse's loop.
    ``main`` takes the arguments of libfuse's fuse_main_real, and runs in its place; when it
    returns non-zero, ``failure`` says what failed. Once the loop is over, ``ended`` says why
    (before the operations' destroy is called).
    ``libfuse`` is the handle of the loaded libfuse (a ctypes CDLL's ``_handle``).

    Signals: libfuse's fuse_set_signal_handlers would end the session on SIGTERM, SIGINT and
    SIGHUP exactly as an unmount ends it, so nobody could tell the two apart (and it leaves alone
    a signal whose handler is not SIG_DFL, such as Python's SIGINT). Instead Python handlers are
    set for the three, with a wakeup pipe (``signal.set_wakeup_fd``): the C part of Python's
    handler writes the signal's number there at once, and the loop watches the pipe beside the
    device, so a signal ends the loop even while it sleeps, and the loop knows which one it was.
    """

    def __init__(self, libfuse: int, poll_us: int) -> None:
        self.poll_s = poll_us / 1e6
        vp, i = ctypes.c_void_p, ctypes.c_int

        def function(name: str, version: str, restype: Any, *argtypes: Any) -> Any:
            return _libfuse_function(libfuse, name, version, restype, *argtypes)

        self.parse_cmdline = function("fuse_parse_cmdline", "FUSE_3.0", i, ctypes.POINTER(_Args),
                                      ctypes.POINTER(_CmdlineOpts))
        self.new = function("fuse_new", "FUSE_3.1", vp, ctypes.POINTER(_Args), vp, ctypes.c_size_t, vp)
        self.mount = function("fuse_mount", "FUSE_3.0", i, vp, ctypes.c_char_p)
        self.unmount = function("fuse_unmount", "FUSE_3.0", None, vp)
        self.destroy = function("fuse_destroy", "FUSE_3.0", None, vp)
        self.session = function("fuse_get_session", "FUSE_3.0", vp, vp)
        self.session_fd = function("fuse_session_fd", "FUSE_3.0", i, vp)
        self.exited = function("fuse_session_exited", "FUSE_3.0", i, vp)
        self.receive = function("fuse_session_receive_buf", "FUSE_3.0", i, vp, ctypes.POINTER(_Buf))
        self.process = function("fuse_session_process_buf", "FUSE_3.0", None, vp, ctypes.POINTER(_Buf))
        self.reset = function("fuse_session_reset", "FUSE_3.0", None, vp)
        self.free_args = function("fuse_opt_free_args", "FUSE_3.0", None, ctypes.POINTER(_Args))
        self.failure: str | None = None   # what failed, when main returns non-zero
        self.ended: End | None = None     # why the loop ended, once it has

    def usable(self) -> bool:
        return all(f is not None for name, f in vars(self).items() if name not in ("failure", "ended", "poll_s"))

    def main(self, argc: int, argv: Any, ops: Any, ops_size: int, user_data: Any) -> int:
        # The steps of libfuse's fuse_main_real (helper.c), single-threaded, in the foreground.
        args = _Args(argc, argv, 0)
        opts = _CmdlineOpts()
        if self.parse_cmdline(ctypes.byref(args), ctypes.byref(opts)) != 0:
            self.failure = "libfuse refused the options or the mount point (libfuse's message says why)"
            return 1
        try:
            if not opts.mountpoint:
                self.failure = "no mount point given"
                return 2
            f = self.new(ctypes.byref(args), ctypes.cast(ops, ctypes.c_void_p), ops_size, user_data)
            if not f:
                self.failure = "libfuse could not set up the file system (libfuse's message says why)"
                return 3
            try:
                if self.mount(f, ctypes.c_char_p(opts.mountpoint)) != 0:
                    self.failure = "libfuse could not mount (libfuse's message says why)"
                    return 4
                se = self.session(f)
                try:
                    with _stop_signals() as wakeup:
                        res = self.serve(se, wakeup)
                finally:
                    # (After a signal, libfuse detaches the mount lazily: fuse_unmount.)
                    self.unmount(f)
                if res < 0:
                    self.failure = f"reading a request from the kernel failed: {os.strerror(-res)}"
                    return 1
                return 0
            finally:
                self.destroy(f)   # calls the operations' destroy
        finally:
            _libc.free(opts.mountpoint)
            self.free_args(ctypes.byref(args))

    def serve(self, se: int, wakeup: int | None = None) -> int:
        """Answer requests until the file system is unmounted, a stop signal arrives (its number
        is read from the pipe ``wakeup``), or the session is ended from inside (libfuse's
        fuse_session_loop, with the watch described above). Sets ``ended``."""
        buf = _Buf()
        bufp = ctypes.byref(buf)
        receive, process, exited = self.receive, self.process, self.exited
        device = self.session_fd(se)
        watch = select.poll()
        watch.register(device, select.POLLIN)
        if wakeup is not None:
            watch.register(wakeup, select.POLLIN)
        poll, clock, poll_s = watch.poll, time.perf_counter, self.poll_s
        res = 0
        ended: End | None = None
        try:
            while not exited(se):
                ready = poll(0)
                if not ready:
                    if poll_s:
                        until = clock() + poll_s
                        while not ready and clock() < until:
                            ready = poll(0)
                    if not ready:
                        ready = poll()   # sleep until a request or a signal comes
                if wakeup is not None and any(fd == wakeup for fd, _ in ready):
                    ended = End("signal", _signal_name(_read_signal(wakeup)))
                    break
                if exited(se):
                    break
                res = receive(se, bufp)
                if res in (-errno.EINTR, -errno.EAGAIN):
                    continue
                if res <= 0:   # 0: unmounted (libfuse read ENODEV)
                    ended = End("unmounted") if res == 0 else End("failed")
                    break
                process(se, bufp)
        finally:
            _libc.free(buf.mem)
            self.reset(se)
            self.ended = ended or End("exited")
        return min(res, 0)


@contextlib.contextmanager
def _stop_signals() -> Iterator[int | None]:
    """Python handlers for the stop signals, and the read end of a pipe that receives the number
    of each one that arrives (None, and the handlers left as they are, off the main thread: only
    it may set them). Put back as they were on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    old_wakeup = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    old = {sig: signal.signal(sig, _noted) for sig in STOP_SIGNALS}
    try:
        yield read_end
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(old_wakeup)
        os.close(read_end)
        os.close(write_end)


def _noted(signum: int, frame: Any) -> None:
    """The Python side of a stop signal's handler: nothing to do, the loop has read the pipe."""


def _read_signal(fd: int) -> int:
    try:
        data = os.read(fd, 64)
    except BlockingIOError:
        data = b""
    return data[0] if data else signal.SIGTERM


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class MetaInvalidator:
    """Makes the kernel forget ``.tfrfs`` whenever ``.tfrfs/errors`` grows.

    A read-only mount lets the kernel keep names, sizes and pages for a day, and it never
    opens files (reads come by path), so nothing else would make it ask for the new size. The
    notice goes out from its own thread: sent from inside a request it could wait on a lock
    that the request holds (libfuse's rule for notifications).
    """

    _PARENT = 1   # the mount's root: FUSE_ROOT_ID
    _NAME = b".tfrfs"

    def __init__(self, libfuse: int) -> None:
        self._libfuse = libfuse
        self._session: int | None = None
        self._changed = threading.Condition()
        self._asked = 0        # changes poked so far
        self._sent = 0         # of those, the ones the kernel has been told of
        self._stopped = True   # no thread sends notices (until bind starts one)
        self._notify = _libfuse_function(libfuse, "fuse_lowlevel_notify_inval_entry", "FUSE_3.0", ctypes.c_int,
                                         ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t)

    def bind(self) -> None:
        """Find the FUSE session; call from inside a FUSE callback (``init``)."""
        vp = ctypes.c_void_p
        get_context = _libfuse_function(self._libfuse, "fuse_get_context", "FUSE_3.0", vp)
        get_session = _libfuse_function(self._libfuse, "fuse_get_session", "FUSE_3.0", vp, vp)
        if get_context is not None and get_session is not None and self._notify is not None:
            context = get_context()
            if context:   # struct fuse_context begins with its struct fuse *
                self._session = get_session(ctypes.cast(context, ctypes.POINTER(vp))[0])
        if not self._session:
            log.warning("no FUSE session found: .tfrfs/errors may show an old size until remount")
            return
        self._stopped = False
        threading.Thread(target=self._run, name="tfrfs-notify", daemon=True).start()

    def poke(self) -> None:
        with self._changed:
            self._asked += 1
            self._changed.notify_all()

    def settle(self, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, until the kernel has been told of every change poked
        so far. Call it only while answering a request that holds no folder's lock (a read): the
        notice needs the lock of the mount's root, and the kernel would wait for us."""
        with self._changed:
            asked = self._asked
            self._changed.wait_for(lambda: self._sent >= asked or self._stopped, timeout)

    def _run(self) -> None:
        notify = self._notify
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._asked > self._sent)
                asked = self._asked
            rc = notify(self._session, self._PARENT, self._NAME, len(self._NAME))
            gone = rc in (-errno.ENODEV, -errno.EBADF)   # unmounted
            if rc not in (0, -errno.ENOENT):   # ENOENT: the kernel holds no such name, nothing to do
                log.debug("kernel notification for .tfrfs failed: %s", os.strerror(-rc))
            with self._changed:
                self._sent = asked
                self._stopped = gone
                self._changed.notify_all()
            if gone:
                return


def fill_read_buf(bufpp: Any, where: tuple[int, int, int] | None, data: bytes | memoryview) -> int:
    """Answer a read_buf call: point ``*bufpp`` at a fuse_bufvec of one buffer, which libfuse
    frees once it has sent it. 0, or -ENOMEM.

    ``where`` = (descriptor, position, count): libfuse copies the bytes from that file itself,
    in C. Else ``data`` (bytes, or a view of memory the caller holds them in) is copied into a
    buffer from malloc.
    """
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
        if isinstance(data, memoryview):   # memory the caller holds: copied from where it lies
            if n:
                ctypes.memmove(mem, ctypes.addressof(ctypes.c_char.from_buffer(data)), n)
        else:
            ctypes.memmove(mem, data, n)
        buf.flags, buf.mem, buf.size, buf.fd, buf.pos = 0, mem, n, -1, 0
    ctypes.cast(bufpp, ctypes.POINTER(ctypes.c_void_p))[0] = vec_p
    return 0


def widen_readahead(mountpoint: str) -> None:
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
