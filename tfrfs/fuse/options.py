"""Mount options given with ``-o`` (SPEC 8): what each one is, and where it goes.

``tfrfs mount`` takes ``-o`` as sshfs, rclone and mount(8) do, so that an fstab line can name
them. Each comma-separated item is one of:

- a FUSE mount option, passed to libfuse: ``allow_other``, ``allow_root``,
  ``default_permissions``, ``fsname=NAME``;
- what every file shows as owner and mode: ``uid=N``, ``gid=N``, ``umask=M`` (see ``Owner``);
- a tfrfs option in ``-o`` form, as the long option of that name: ``rw`` (``--rw``), ``ro``,
  ``cache_dir=DIR``, ``records=KIND``, ``no_decode_raw``, ... (``-`` or ``_`` alike);
- a word that mount(8) and mount.fuse3 pass on from an fstab line and that means nothing to this
  file system (``nofail``, ``dev``, ``suid``, ``noatime``, ...): accepted and ignored;
- for a URL source, a store option ``KEY=VALUE`` (SPEC 1.1).

Anything else is bad usage. Within ``-o``, a later item wins over an earlier one, as mount(8)
reads them (``ro,rw`` is ``rw``).

This module only reads text: it imports neither the FUSE binding nor the rest of tfrfs.
"""

from __future__ import annotations

import grp
import pwd
from dataclasses import dataclass, field
from typing import Any, Callable

from tfrfs.errors import UsageError
from tfrfs.index.memory import parse_size

# Passed to libfuse as given. (uid, gid and umask are libfuse options too, but libfuse's umask
# would make every file executable (0777 & ~umask): tfrfs applies them itself, see Owner.)
FUSE_FLAGS = ("allow_other", "allow_root", "default_permissions")
FUSE_VALUES = ("fsname",)

# What mount(8) and mount.fuse3 may pass from an fstab line and this file system has no use for:
# there are no device files, set-user-ID bits or executables to allow or refuse, times are the
# shards' own, and every write is durable when it returns. (mount.fuse3 itself drops nofail,
# auto, noauto, _netdev, user, nouser and users, and adds dev,suid unless nodev,nosuid are given;
# mount(8) adds rw unless the line says ro, and noexec,nosuid,nodev for a `user` line.)
IGNORED = frozenset((
    "defaults", "auto", "noauto", "nofail", "_netdev", "user", "nouser", "users", "owner", "group",
    "dev", "nodev", "suid", "nosuid", "exec", "noexec",
    "atime", "noatime", "relatime", "norelatime", "strictatime", "nostrictatime",
    "lazytime", "nolazytime", "diratime", "nodiratime", "iversion", "noiversion",
    "sync", "async", "dirsync", "mand", "nomand", "silent", "loud", "symfollow", "nosymfollow",
))
IGNORED_PREFIXES = ("x-", "comment=")


def whole_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{text!r} is not a whole number of 0 or more")
    return value


def _kind(text: str) -> str:
    from tfrfs.format.record_kinds import RECORD_KINDS   # with protobuf: not for every command
    if text not in RECORD_KINDS:
        raise ValueError(f"{text!r} is not one of {', '.join(RECORD_KINDS)}")
    return text


def _text(text: str) -> str:
    if not text:
        raise ValueError("it needs a value")
    return text


@dataclass(frozen=True)
class Setting:
    """A tfrfs long option in ``-o`` form: the argparse name it sets, and the value it gives
    (a word alone) or how its value is read (``NAME=VALUE``)."""

    dest: str
    value: Any = True
    parse: Callable[[str], Any] | None = None

    @property
    def flag(self) -> bool:
        return self.parse is None


# Every long option of `tfrfs mount` (except its internal ones), by its -o name.
SETTINGS: dict[str, Setting] = {
    "rw": Setting("rw", True),
    "ro": Setting("rw", False),
    "foreground": Setting("foreground", True),
    "debug": Setting("debug", True),
    "no_decode_raw": Setting("no_decode_raw", True),
    "records": Setting("records", parse=_kind),
    "cache_dir": Setting("cache_dir", parse=_text),
    "cache_size": Setting("cache_size", parse=parse_size),
    "index_dir": Setting("index_dir", parse=_text),
    "index_memory": Setting("index_memory", parse=parse_size),
    "no_manifest": Setting("no_manifest", True),
    "log": Setting("log", parse=_text),
    "poll_us": Setting("poll_us", parse=whole_number),
}

# How each setting is written as a long option, to name it in a message.
LONG = {"rw": "--rw", "foreground": "--foreground", "debug": "--debug", "no_decode_raw": "--no-decode-raw",
        "records": "--records", "cache_dir": "--cache-dir", "cache_size": "--cache-size",
        "index_dir": "--index-dir", "index_memory": "--index-memory", "no_manifest": "--no-manifest",
        "log": "--log", "poll_us": "--poll-us"}


@dataclass(frozen=True)
class Owner:
    """Who owns every file and folder of a mount, and which permission bits they show.

    Files show ``0666 & ~umask`` and folders ``0777 & ~umask`` (umask 022 unless given: 0644 and
    0755), without the write bits when the mount is read-only; no file is ever executable. These
    are what stat shows. The kernel enforces them only with ``default_permissions``; without it
    every user the mount lets in (its owner; everyone with ``allow_other``; root too with
    ``allow_root``) may read every file, as with sshfs.
    """

    uid: int
    gid: int
    umask: int = 0o022

    def modes(self, writable: bool) -> tuple[int, int]:
        """(file mode, folder mode), permission bits only."""
        keep = 0o777 if writable else 0o555
        return 0o666 & ~self.umask & keep, 0o777 & ~self.umask & keep


@dataclass(frozen=True)
class MountOptions:
    """The ``-o`` items of one command, sorted by where they go."""

    fuse: dict[str, str | bool] = field(default_factory=dict)    # to libfuse
    settings: dict[str, Any] = field(default_factory=dict)       # argparse name -> value
    store: dict[str, Any] = field(default_factory=dict)          # to the URL source's store
    uid: int | None = None
    gid: int | None = None
    umask: int | None = None
    ignored: tuple[str, ...] = ()
    passed: tuple[str, ...] = ()   # the items that are not settings or ignored, as given

    def owner(self, uid: int, gid: int) -> Owner:
        """The owner of the mount's files: these options, else ``uid``/``gid`` (the mounting
        user's) and umask 022."""
        return Owner(uid if self.uid is None else self.uid, gid if self.gid is None else self.gid,
                     0o022 if self.umask is None else self.umask)


def items(groups: list[str] | None) -> list[str]:
    """The items of every ``-o`` given, in order (``-o a,b -o c`` -> a, b, c)."""
    return [item.strip() for group in groups or [] for item in group.split(",") if item.strip()]


def parse(groups: list[str] | None, *, remote: bool) -> MountOptions:
    """Sort the ``-o`` items of ``tfrfs mount``. ``remote``: SOURCE is a URL, so ``KEY=VALUE``
    items that are nothing else are its store's options. Raises UsageError."""
    from tfrfs.storage.fsspec_store import parse_options
    fuse: dict[str, str | bool] = {}
    settings: dict[str, Any] = {}
    store_items: list[str] = []
    ids: dict[str, int] = {}
    ignored: list[str] = []
    passed: list[str] = []
    for item in items(groups):
        key, sep, value = item.partition("=")
        name = key.strip().replace("-", "_")
        if item in IGNORED or item.startswith(IGNORED_PREFIXES):
            ignored.append(item)
            continue
        if name in SETTINGS:
            settings.update(_setting(item, name, sep, value))
            continue
        passed.append(item)
        if name in FUSE_FLAGS:
            if sep:
                raise UsageError(f"-o {item}: {name} takes no value")
            fuse[name] = True
        elif name in FUSE_VALUES:
            if not value:
                raise UsageError(f"-o {item}: {name} needs a value ({name}=NAME)")
            fuse[name] = value
        elif name in ("uid", "gid", "umask"):
            ids[name] = _id(item, name, value)
        elif remote and sep and key:
            store_items.append(item)
        else:
            raise UsageError(f"unknown mount option {item!r} (see tfrfs mount --help" + (
                "; store options KEY=VALUE are for URL sources)" if sep and not remote else ")"))
    if fuse.get("allow_other") and fuse.get("allow_root"):
        raise UsageError("-o allow_other and allow_root: give one of them (allow_other lets root in too)")
    return MountOptions(fuse=fuse, settings=settings, store=parse_options(store_items), uid=ids.get("uid"),
                        gid=ids.get("gid"), umask=ids.get("umask"), ignored=tuple(ignored), passed=tuple(passed))


def _setting(item: str, name: str, sep: str, value: str) -> dict[str, Any]:
    setting = SETTINGS[name]
    if setting.flag:
        if sep:
            raise UsageError(f"-o {item}: {name} takes no value")
        return {setting.dest: setting.value}
    assert setting.parse is not None
    if not sep:
        raise UsageError(f"-o {item}: {name} needs a value ({name}=...)")
    try:
        return {setting.dest: setting.parse(value.strip())}
    except ValueError as exc:
        raise UsageError(f"-o {item}: {exc}") from None


def _id(item: str, name: str, value: str) -> int:
    value = value.strip()
    if name == "umask":
        try:
            mask = int(value, 8)
        except ValueError:
            mask = -1
        if not 0 <= mask <= 0o777:
            raise UsageError(f"-o {item}: the umask is octal, 000 to 777 (like umask=022)")
        return mask
    if value.isdigit():
        return int(value)
    try:   # a name, as chown takes it
        return pwd.getpwnam(value).pw_uid if name == "uid" else grp.getgrnam(value).gr_gid
    except KeyError:
        what = "user" if name == "uid" else "group"
        raise UsageError(f"-o {item}: no {what} of that name (give a number or a known {what})") from None


def merge(args: Any, opts: MountOptions) -> None:
    """Apply the ``-o`` settings to ``args`` as if given as long options. A long option given
    too must say the same (``--rw`` with ``-o ro`` is refused): the two are one setting written
    twice, and which one the user meant is not for tfrfs to guess. Raises UsageError."""
    for dest, value in opts.settings.items():
        given = getattr(args, dest, None)
        if given is not None and given is not False and given != value:
            shown = "ro" if dest == "rw" and value is False else (
                dest if value is True else f"{dest}={value}")
            raise UsageError(f"{LONG[dest]} {'' if given is True else given}".rstrip()
                             + f" and -o {shown} disagree: give one of them")
        setattr(args, dest, value)
