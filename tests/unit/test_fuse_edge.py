"""Errors mapped once, at the edge of the operations classes, without a mount: whatever an
operation raises reaches the request loop as ``Refused`` with a positive errno."""

from __future__ import annotations

import errno
import inspect
import logging
from typing import Any, Generator

import pytest

from tfrfs.fuse import operations as fuse_ops
from tfrfs.errors import DataLoss, NoAttr, NotFound, ReadOnly
from tfrfs.fuse.edge import Edge as _Edge
from tfrfs.fuse.edge import Refused
from tfrfs.fuse.operations import errno_of


@pytest.mark.parametrize("exc, code", [
    (NotFound("x"), errno.ENOENT),
    (NoAttr("user.x"), errno.ENODATA),
    (ReadOnly("x"), errno.EROFS),
    (DataLoss("x"), errno.EIO),
    (Refused(errno.ENOTSUP), errno.ENOTSUP),
    (PermissionError(errno.EACCES, "denied"), errno.EACCES),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), errno.ENOENT),
])
def test_errno_of_known_errors(exc: Exception, code: int, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="tfrfs"):
        assert errno_of(exc, "getattr", ("/a",)) == code
    assert not caplog.records   # an answer, not a problem


@pytest.mark.parametrize("exc", [OSError("no errno"), OSError(-3, "negative"), KeyError("k"), ZeroDivisionError()])
def test_errno_of_anything_else_is_eio_and_logged(exc: Exception, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="tfrfs"):
        assert errno_of(exc, "read_buf", ("/a/b",)) == errno.EIO
    [record] = caplog.records
    assert "read_buf" in record.getMessage() and "/a/b" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[1] is exc   # with its traceback


class _Ops(_Edge):
    use_ns = True
    read_buf = None

    def getattr(self, path: str, fh: Any = None) -> dict[str, int]:
        if path == "/missing":
            raise NotFound(path)
        if path == "/bug":
            raise KeyError(path)
        return {"st_size": len(path)}

    def readdir(self, path: str, offset: int, plus: bool) -> Generator[tuple[int, str, dict[str, int]], None, None]:
        yield 1, "a", {}
        yield 2, "b", {}
        raise DataLoss("record 3 is cut short")

    def access(self, path: str, amode: int) -> int:
        self._check(path)
        return 0

    def _check(self, path: str) -> None:
        raise ReadOnly(path)


def test_operations_raise_only_refusals() -> None:
    ops = _Ops()
    assert ops.getattr("/abc") == {"st_size": 4}
    with pytest.raises(Refused) as e:
        ops.getattr("/missing")
    assert e.value.errno == errno.ENOENT and isinstance(e.value.__cause__, NotFound)
    with pytest.raises(Refused) as e:
        ops.getattr("/bug")
    assert e.value.errno == errno.EIO
    with pytest.raises(Refused) as e:
        ops.access("/x", 0)
    assert e.value.errno == errno.EROFS


def test_a_listing_maps_errors_raised_while_it_is_read() -> None:
    listing = _Ops().readdir("/", 0, True)
    assert [next(listing)[1], next(listing)[1]] == ["a", "b"]
    with pytest.raises(Refused) as e:
        next(listing)
    assert e.value.errno == errno.EIO


def test_a_listing_left_early_is_closed_quietly() -> None:
    listing = _Ops().readdir("/", 0, True)
    next(listing)
    listing.close()   # the request loop stops when the kernel's buffer is full


def test_helpers_and_values_are_left_alone() -> None:
    with pytest.raises(ReadOnly):
        _Ops()._check("/x")
    assert _Ops.read_buf is None and _Ops.use_ns is True


@pytest.mark.parametrize("cls", [fuse_ops.Operations, fuse_ops.WritableOperations])
def test_every_operation_of_the_mount_is_mapped(cls: type) -> None:
    for name, value in vars(cls).items():
        if inspect.isfunction(value):
            assert hasattr(value, "__wrapped__") == (not name.startswith("_")), name


class _FailingInit(_Edge):
    def __init__(self) -> None:
        self.destroyed = False

    def init(self, conn: Any) -> None:
        raise RuntimeError("no session")

    def destroy(self, path: str) -> None:
        self.destroyed = True


def test_a_failed_init_ends_the_session_and_is_kept(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    exits: list[bool] = []
    ops = _FailingInit()
    ops.end_session = lambda: exits.append(True)
    with caplog.at_level(logging.ERROR, logger="tfrfs"):
        ops.init(None)   # returns: nothing for the request loop to answer
    assert exits == [True]
    assert isinstance(ops.init_failure, RuntimeError)
    assert "FUSE init failed" in caplog.text and "no session" in caplog.text
    ops.destroy("/")
    assert not ops.destroyed   # the mount never served: nothing to finish


def test_a_sound_init_leaves_the_session_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    class Sound(_FailingInit):
        def init(self, conn: Any) -> None:
            pass

    ops = Sound()
    ops.end_session = lambda: pytest.fail("the session was ended")
    ops.init(None)
    assert ops.init_failure is None
    ops.destroy("/")
    assert ops.destroyed
