"""tfrfs.fuse.options: each -o item sorted to where it goes (no mount needed), and the checks of
tfrfs.fuse.canmount that need no second user."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from tfrfs.fuse import canmount
from tfrfs.fuse import options
from tfrfs.cli import build_parser
from tfrfs.errors import UsageError


def test_fuse_options_go_to_libfuse() -> None:
    o = options.parse(["allow_other,default_permissions", "fsname=my data"], remote=False)
    assert o.fuse == {"allow_other": True, "default_permissions": True, "fsname": "my data"}
    assert o.settings == {} and o.store == {} and o.passed == ("allow_other", "default_permissions", "fsname=my data")
    assert options.parse(["allow_root"], remote=False).fuse == {"allow_root": True}


def test_uid_gid_umask_set_the_owner() -> None:
    o = options.parse(["uid=1234,gid=4321,umask=027"], remote=False)
    assert o.fuse == {} and (o.uid, o.gid, o.umask) == (1234, 4321, 0o27)
    owner = o.owner(1, 2)
    assert (owner.uid, owner.gid) == (1234, 4321)
    assert owner.modes(writable=True) == (0o640, 0o750)
    assert owner.modes(writable=False) == (0o440, 0o550)
    default = options.parse([], remote=False).owner(7, 8)
    assert (default.uid, default.gid) == (7, 8)
    assert default.modes(writable=False) == (0o444, 0o555) and default.modes(writable=True) == (0o644, 0o755)
    assert options.parse(["umask=0"], remote=False).owner(0, 0).modes(writable=True) == (0o666, 0o777)
    assert options.parse(["uid=root,gid=root"], remote=False).owner(5, 5) == options.Owner(0, 0)


def test_tfrfs_options_in_o_form() -> None:
    o = options.parse(["rw,cache_dir=/c,cache-size=2G,records=raw,no_decode_raw,index_dir=/i,log=/l,poll_us=0,debug"],
                      remote=False)
    assert o.settings == {"rw": True, "cache_dir": "/c", "cache_size": 2 << 30, "records": "raw",
                          "no_decode_raw": True, "index_dir": "/i", "log": "/l", "poll_us": 0, "debug": True}
    assert o.fuse == {} and o.passed == ()
    # Every long option of `tfrfs mount` has its -o form (but the internal ones).
    mount = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["mount"]
    longs = {a.dest for a in mount._actions if a.option_strings and a.help != argparse.SUPPRESS
             and a.dest not in ("help", "options")}
    assert longs == {s.dest for s in options.SETTINGS.values()}


def test_later_wins_within_o() -> None:
    assert options.parse(["ro,rw"], remote=False).settings == {"rw": True}
    assert options.parse(["rw", "ro"], remote=False).settings == {"rw": False}
    assert options.parse(["records=raw,records=example"], remote=False).settings == {"records": "example"}


def test_fstab_words_are_ignored() -> None:
    # What mount(8) and mount.fuse3 pass for `ro,allow_other,nofail` and for a `user` line.
    o = options.parse(["ro,allow_other,dev,suid"], remote=False)
    assert o.settings == {"rw": False} and o.fuse == {"allow_other": True} and o.ignored == ("dev", "suid")
    o = options.parse(["rw,noexec,nosuid,nodev,noatime,nofail,_netdev,defaults,x-systemd.automount,comment=x"],
                      remote=False)
    assert o.fuse == {} and o.settings == {"rw": True} and len(o.ignored) == 9


def test_store_options_for_url_sources_only() -> None:
    o = options.parse(["anon=true,endpoint_url=http://h:9000,retries=2", "allow_other"], remote=True)
    assert o.store == {"anon": True, "endpoint_url": "http://h:9000", "retries": 2}
    assert o.fuse == {"allow_other": True}
    with pytest.raises(UsageError, match="unknown mount option 'anon=true'.*URL sources"):
        options.parse(["anon=true"], remote=False)


@pytest.mark.parametrize("item, says", [
    ("bogus", "unknown mount option 'bogus'"),
    ("subtype=x", "unknown mount option"),
    ("allow_other=1", "takes no value"),
    ("rw=1", "takes no value"),
    ("fsname", "needs a value"),
    ("records", "needs a value"),
    ("records=image", "not one of example, sequence, raw"),
    ("cache_size=lots", "not a size"),
    ("poll_us=-1", "not a whole number"),
    ("umask=999", "octal"),
    ("uid=no-such-user-here", "no user of that name"),
    ("gid=no-such-group-here", "no group of that name"),
    ("allow_other,allow_root", "give one of them"),
])
def test_bad_items_are_usage_errors(item: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        options.parse([item], remote=False)
    if "=" not in item or "unknown" not in says:   # a URL source takes other KEY=VALUE as store options
        with pytest.raises(UsageError, match=says):
            options.parse([item], remote=True)


def _mount_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["mount", "S", "M", *argv])


def test_merge_as_long_options() -> None:
    args = _mount_args("-o", "rw,cache_dir=/c,poll_us=5")
    options.merge(args, options.parse(args.options, remote=False))
    assert (args.rw, args.cache_dir, args.poll_us) == (True, "/c", 5)
    args = _mount_args("--rw", "--records", "raw", "-o", "rw,records=raw")   # the same said twice
    options.merge(args, options.parse(args.options, remote=False))
    assert (args.rw, args.records) == (True, "raw")


@pytest.mark.parametrize("argv, says", [
    (("--rw", "-o", "ro"), "--rw and -o ro disagree"),
    (("--records", "raw", "-o", "records=example"), "--records raw and -o records=example disagree"),
    (("--poll-us", "5", "-o", "poll_us=6"), "--poll-us 5 and -o poll_us=6 disagree"),
])
def test_merge_refuses_a_long_option_that_disagrees(argv: tuple[str, ...], says: str) -> None:
    args = _mount_args(*argv)
    with pytest.raises(UsageError, match=says):
        options.merge(args, options.parse(args.options, remote=False))


def test_fuse_device_problems(tmp_path: Path) -> None:
    assert canmount.fuse_device_problem(str(tmp_path / "fuse")).startswith(
        f"FUSE is not available here: {tmp_path / 'fuse'} does not exist")
    if os.path.exists("/dev/fuse") and os.access("/dev/fuse", os.R_OK | os.W_OK):
        assert canmount.fuse_device_problem() is None


def test_user_allow_other_is_read_as_fusermount3_reads_it(tmp_path: Path) -> None:
    conf = tmp_path / "fuse.conf"
    conf.write_text("#user_allow_other\nmount_max = 5\n")
    assert not canmount.user_allow_other(str(conf))
    conf.write_text("# comment\n  user_allow_other  \n")
    assert canmount.user_allow_other(str(conf))
    assert not canmount.user_allow_other(str(tmp_path / "missing"))
