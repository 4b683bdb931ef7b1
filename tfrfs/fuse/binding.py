"""The FUSE binding, and the edge where the operations meet it: the only module that imports it.

The binding is mfusepy (fusepy's maintained fork, same interface) on libfuse3. ``Edge`` is the
base of the operations classes (``tfrfs.fuse.operations``): every exception an operation raises
is mapped to an errno in one place, ``errno_of``, so the binding receives nothing but
``FuseOSError``; each request of a writable mount holds the mount's guard. ``FuseBinding`` is the
binding with the libfuse3 calls it does not pass on whole translated here.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import inspect
import logging
import os
from typing import Any, Callable, ContextManager

if not (os.environ.get("FUSE_LIBRARY_PATH") or os.environ.get("FUSE_LIBRARY_NAME")):
    os.environ["FUSE_LIBRARY_NAME"] = "fuse3"   # mfusepy would take libfuse2 first where both exist
try:
    import mfusepy as fuse  # no type information shipped (pyproject: mypy overrides)
except OSError as _exc:   # no libfuse on this machine
    raise ImportError(f"{_exc}: tfrfs needs libfuse3 (Debian/Ubuntu: apt-get install fuse3)") from None
if fuse.fuse_version_major != 3:
    raise ImportError(f"tfrfs needs libfuse3, but {fuse._libfuse_path} is libfuse{fuse.fuse_version_major}")

from tfrfs.errors import DataLoss, TfrfsError
from tfrfs.fuse import loop as fuse_loop
from tfrfs.fuse.watchdog import RequestWatch

log = logging.getLogger("tfrfs")

# libfuse3's fuse.h
_READDIR_PLUS = 1 << 0        # readdir flag: the kernel wants attributes too
_FILL_DIR_PLUS = 1 << 1       # filler flag: this entry's attributes are complete

LIBFUSE = fuse._libfuse._handle   # the libfuse the binding loaded, for what fuse_loop does below it
LIBFUSE_PATH: str = fuse._libfuse_path   # its file, for messages


def errno_of(exc: Exception, op: str, args: tuple) -> int:
    """The errno an exception raised by an operation stands for: the one place errors are mapped.

    tfrfs's own errors carry theirs, and any other ``OSError`` its own (when positive); a name
    that is not text in the dataset's encoding names nothing (ENOENT). Anything else is a bug:
    logged with its traceback, and answered EIO.
    """
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


def _refusal(ops: Any, exc: Exception, name: str, args: tuple) -> Exception:
    """What the binding is given for ``exc``: the errno it means. A request answered for damage
    first has the kernel forget ``.tfrfs/errors``, so that a look at it shows the new line."""
    if isinstance(exc, DataLoss):
        ops._damage_told()
    return fuse.FuseOSError(errno_of(exc, name, args))


def mapped(op: Callable[..., Any]) -> Callable[..., Any]:
    """``op``, raising nothing but ``FuseOSError(errno_of(...))``; see ``Edge``."""
    name = op.__name__
    if name in ("init", "init_with_config"):
        @functools.wraps(op)
        def init(self: Any, *args: Any) -> None:
            try:
                op(self, *args)
            except Exception as exc:
                log.error("FUSE init failed, so the mount ends: %s", exc, exc_info=exc)
                self.init_failure = exc
                fuse.fuse_exit()   # libfuse's loop stops once init has returned
        return init
    if inspect.isgeneratorfunction(op):
        @functools.wraps(op)
        def listing(self: Any, *args: Any) -> Any:
            watch = self.watch
            token = watch.begin(name, args[0] if args else None) if watch is not None else 0
            try:
                with self.guard or contextlib.nullcontext():
                    yield from op(self, *args)   # its errors arise while the binding iterates
            except Exception as exc:
                raise _refusal(self, exc, name, args) from exc
            finally:
                if watch is not None:
                    watch.end(token)
        return listing

    @functools.wraps(op)
    def operation(self: Any, *args: Any) -> Any:
        watch = self.watch
        token = watch.begin(name, args[0] if args else None) if watch is not None else 0
        try:
            guard = self.guard
            if guard is None or name == "destroy":   # destroy waits for a running commit
                return op(self, *args)
            with guard:
                return op(self, *args)
        except Exception as exc:
            raise _refusal(self, exc, name, args) from exc
        finally:
            if watch is not None:
                watch.end(token)
    if name == "destroy":
        @functools.wraps(op)
        def destroy(self: Any, *args: Any) -> None:
            if self.init_failure is None:   # else the mount never served: nothing to finish, or commit
                operation(self, *args)
        return destroy
    return operation


class Edge:
    """The base of the operations classes: where exceptions become errnos, once.

    The binding registers every method of an operations object named like a libfuse
    operation, so every public method of a subclass is taken to be one. Each is wrapped once,
    when its class is made (not per call), so that whatever it raises leaves it as
    ``FuseOSError`` with the errno ``errno_of`` gives. The binding's own exception handler then
    only ever sees a positive errno: it answers ``-errno`` and logs at debug level. Helpers
    (``_name``) are not wrapped: they raise tfrfs's own errors for their callers to handle.

    ``init`` (``init_with_config``) answers no request: if it fails, the mount cannot work. The
    failure is logged and kept in ``init_failure``, libfuse is told to end the session, and
    ``mount()`` raises it once the binding returns; ``destroy`` is then not passed on.
    """

    init_failure: Exception | None = None
    watch: RequestWatch | None = None   # requests in flight, watched for ones that run too long
    # Held while each request is answered (a writable mount's: its commit runs on a thread of its
    # own, and puts a new shard in place only between two requests).
    guard: ContextManager[object] | None = None

    def _damage_told(self) -> None:
        """A request is about to be answered EIO for damage it may have found just now: see
        ``Operations._damage_told``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, value in list(vars(cls).items()):
            if not name.startswith("_") and inspect.isfunction(value):
                setattr(cls, name, mapped(value))


class FuseBinding(fuse.FUSE):
    """The binding, with the libfuse3 calls it does not pass on whole translated here.

    Only the binding's public translation methods (``readdir_fuse_3``, ``read_buf``,
    ``truncate_fuse_3``, ``rename_fuse_3``) are overridden; errors are mapped before they
    reach it (``Edge``).
    """

    def readdir_fuse_3(self, path: bytes, buf: Any, filler: Any, offset: int, fip: Any, flags: int) -> int:
        plus = bool(flags & _READDIR_PLUS)
        fill_flags = _FILL_DIR_PLUS if plus else 0
        st = fuse.c_stat()
        shared: dict[int, Any] = {}   # id of a record entries' shared attributes -> their c_stat
        for position, name, attrs in self.operations.readdir(path.decode(self.encoding, self.errors), offset, plus):
            if type(attrs) is tuple:
                # A shard's record: the attributes its shard's records share, filled in once
                # per listing, with its own inode number (and size): a shard of millions of
                # records lists at the speed of the filler.
                base, ino, size = attrs
                rec = shared.get(id(base))
                if rec is None:
                    rec = shared[id(base)] = fuse.c_stat()
                    fuse.set_st_attrs(rec, base, use_ns=True)
                rec.st_ino = ino
                if size:
                    rec.st_size, rec.st_blocks = size, (size + 511) // 512
                if filler(buf, name.encode(self.encoding, self.errors), rec, position, fill_flags):
                    break
                continue
            ctypes.memset(ctypes.byref(st), 0, ctypes.sizeof(st))
            fuse.set_st_attrs(st, attrs, use_ns=True)
            # An entry without its size is listed without attributes: the kernel asks for them
            # by name (and gets the error a stat of it gives).
            flags_here = fill_flags if "st_size" in attrs else 0
            if filler(buf, name.encode(self.encoding, self.errors), st, position, flags_here):
                break
        return 0

    def read_buf(self, path: bytes, bufpp: Any, size: int, offset: int, fip: Any) -> int:
        # A read of a read-only mount. Bytes that lie in a file the tree holds open (large images,
        # plain files) go to libfuse as that descriptor and position: libfuse copies them in C,
        # and Python never touches them. Others, and images of records read
        # ahead (held in memory), are copied into a buffer that libfuse frees.
        where, data = self.operations.read_buf(path.decode(self.encoding, self.errors), size, offset)
        return fuse_loop.fill_read_buf(bufpp, where, data)

    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        # ftruncate arrives here with the file's handle (the binding would drop it).
        fi = fip.contents if fip else None
        return self.operations.truncate(None if path is None else path.decode(self.encoding, self.errors),
                                        length, fi)

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        return self.operations.rename(old.decode(self.encoding, self.errors),
                                      new.decode(self.encoding, self.errors), flags)
