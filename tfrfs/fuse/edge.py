"""The edge where requests meet the dataset: errors mapped once, to an errno.

``Edge`` is the base of the operations classes (``tfrfs.fuse.operations``, by path) and of the
requests (``tfrfs.fuse.requests``, by node id): every exception a method raises is mapped to an
errno in one place, ``errno_of``, so the request loop (``tfrfs.fuse.libfuse``) receives nothing
but ``Refused`` and answers the kernel with its errno; each request of a writable mount holds the
mount's guard. Nothing here knows libfuse.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import logging
import os
from typing import Any, Callable, ContextManager

from tfrfs.errors import DataLoss, TfrfsError
from tfrfs.fuse.watchdog import RequestWatch

log = logging.getLogger("tfrfs")


class Refused(OSError):
    """What a request is answered with when it fails: ``errno`` (positive), and nothing else."""

    def __init__(self, code: int) -> None:
        super().__init__(code, os.strerror(code))


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
    return Refused(errno_of(exc, name, args))


def mapped(op: Callable[..., Any]) -> Callable[..., Any]:
    """``op``, raising nothing but ``Refused(errno_of(...))``; see ``Edge``."""
    name = op.__name__
    if name == "init":
        @functools.wraps(op)
        def init(self: Any, *args: Any) -> None:
            try:
                op(self, *args)
            except Exception as exc:
                log.error("FUSE init failed, so the mount ends: %s", exc, exc_info=exc)
                self.init_failure = exc
                self.end_session()   # the request loop stops once init has returned
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

    Every public method of a subclass is taken to be a request. Each is wrapped once, when its
    class is made (not per call), so that whatever it raises leaves it as ``Refused`` with the
    errno ``errno_of`` gives: the request loop answers that errno and nothing else. Helpers
    (``_name``) are not wrapped: they raise tfrfs's own errors for their callers to handle.

    ``init`` answers no request: if it fails, the mount cannot work. The failure is logged and
    kept in ``init_failure``, ``end_session`` (set by the request loop) ends the session, and
    ``mount()`` raises it once the loop returns; ``destroy`` is then not passed on.
    """

    init_failure: Exception | None = None
    watch: RequestWatch | None = None   # requests in flight, watched for ones that run too long
    # Held while each request is answered (a writable mount's: its commit runs on a thread of its
    # own, and puts a new shard in place only between two requests).
    guard: ContextManager[object] | None = None
    end_session: Callable[[], None] = staticmethod(lambda: None)   # ends the request loop (see init)

    def _damage_told(self) -> None:
        """A request is about to be answered EIO for damage it may have found just now: see
        ``Operations._damage_told``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, value in list(vars(cls).items()):
            if not name.startswith("_") and inspect.isfunction(value):
                setattr(cls, name, mapped(value))
