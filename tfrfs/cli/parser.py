"""The command line's grammar (SPEC 8) and ``main``: parse, run the command, and turn what it
raised into a message and an exit status."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn, Sequence

from tfrfs import __version__
from tfrfs.fuse import options
from tfrfs.errors import TfrfsError, UsageError
from tfrfs.index.memory import parse_size
from tfrfs.cli.common import EXIT_PROBLEMS, EXIT_USAGE, RAY_ADDRESS, add_run_options, check_options
from tfrfs.cli.data import cmd_index, cmd_inspect, cmd_repair, cmd_verify
from tfrfs.cli.mounting import POLL_US, cmd_mount
from tfrfs.cli.staged import cmd_commit, cmd_discard, cmd_status, cmd_umount


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but a usage error is one line (SPEC 8), not the usage and then the
    error: the usage is what ``--help`` is for."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _non_negative_int(text: str) -> int:
    try:
        return options.whole_number(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size(text: str) -> int:
    """A size in bytes: a whole number with an optional K, M, G or T (powers of 1024)."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_size(text: str) -> int:
    """A size of 1 byte or more."""
    n = _size(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a size of 1 byte or more (like 500M or 20G)")
    return n


STORE_OPTIONS_HELP = ("store options for a URL source, passed to its fsspec file system (for example "
                      "-o anon=true, -o endpoint_url=http://host:9000, -o requester_pays=true), plus "
                      "retries=N and timeout=SECONDS for each request")

MOUNT_OPTIONS_HELP = "mount options, comma-separated, as sshfs and mount(8) take them (below)"

MOUNT_DESCRIPTION = """\
Mount SOURCE (a shard file, a folder, or a quoted glob; or a URL: s3://bucket/prefix,
gs://bucket/prefix, https://host/path) at MOUNTPOINT. Returns once the mount is usable;
the daemon logs to the file it names. Remote sources are read-only.

`tfrfs SOURCE MOUNTPOINT -o OPTS`, without the word mount, mounts too: that is how
mount(8) runs tfrfs for an fstab line such as
  /data/ds  /mnt/ds  fuse.tfrfs  ro,allow_other,nofail  0 0"""

MOUNT_EPILOG = """\
mount options (-o OPT[,OPT...]):
  allow_other          let every user in (as root, or with user_allow_other in /etc/fuse.conf)
  allow_root           let root in too (the same condition)
  default_permissions  have the kernel check the owner and modes below on every access
  uid=N, gid=N         owner of every file and folder (a number or a name; default: yours)
  umask=M              octal; files show 0666 & ~M, folders 0777 & ~M (default 022);
                       a read-only mount shows no write bits
  ro                   read-only (the default)
  rw                   writable, as --rw (mount(8) passes rw unless the fstab line says ro)
  fsname=NAME          the mount's source in the mount table (default tfrfs)
  cache_dir=DIR, cache_size=SIZE, records=KIND, no_decode_raw, index_dir=DIR,
  index_memory=SIZE, no_manifest, log=FILE, poll_us=N, debug, foreground
                       the long options of the same name; one given both ways must agree
  nofail, noauto, _netdev, dev, suid, noatime, ...
                       fstab words that mean nothing here: ignored
  KEY=VALUE            for a URL source, a store option (anon=true, endpoint_url=URL,
                       retries=N, timeout=SECONDS)

Without default_permissions, uid, gid and umask are only what stat shows: every user the
mount lets in may read every file. Mounting as a user other than root needs a usable
/dev/fuse and a mount point that user may write to."""


def _add_source_options(p: argparse.ArgumentParser, *, index_dir: bool = True, mount: bool = False) -> None:
    """Options of every command that reads a SOURCE, local or remote."""
    p.add_argument("-o", dest="options", action="append", metavar="OPT[,OPT...]" if mount else "KEY=VALUE[,...]",
                   help=MOUNT_OPTIONS_HELP if mount else STORE_OPTIONS_HELP)
    p.add_argument("--cache-dir", metavar="DIR", help="where indexes, fetched blocks and logs are kept "
                                                      "(default: $XDG_CACHE_HOME/tfrfs or ~/.cache/tfrfs)")
    p.add_argument("--cache-size", metavar="SIZE", type=_size,
                   help="bytes of fetched blocks of remote shards kept on disk, least recently used out "
                        "first (default 4G)")
    if index_dir:
        p.add_argument("--index-dir", metavar="DIR",
                       help="also look for shard index files here (NAME.tfrfs-idx, DALI NAME.idx, NAME.tfindex; in the source's folders or flat)")


def _add_read_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--records", choices=("example", "sequence", "raw"),
                   help="show every record as this kind instead of deciding from the data")
    p.add_argument("--no-decode-raw", action="store_true",
                   help="show raw pixel arrays as .bin instead of decoding them to PNG")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tfrfs",
        description="Mount TFRecord datasets as folders: each shard a folder, each record a folder, "
                    "each feature a file.",
        epilog="Exit status: 0 success, 1 problems found or the work failed, 2 bad usage or input.")
    parser.add_argument("--version", action="version", version=f"tfrfs {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("mount", help="mount SOURCE at MOUNTPOINT", description=MOUNT_DESCRIPTION,
                       epilog=MOUNT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("--rw", action="store_true", help="allow edits; they are staged and written at commit")
    p.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground, logging to stderr too")
    _add_read_options(p)
    _add_source_options(p, mount=True)
    p.add_argument("--log", metavar="FILE", help="daemon log file (default: CACHE_DIR/logs/NAME-HASH.log)")
    p.add_argument("--poll-us", metavar="N", type=_non_negative_int,
                   help="after each request, watch N microseconds for the next before sleeping "
                        f"(default {POLL_US}; 0: sleep at once). Waking a sleeping daemon is slow on "
                        "virtual machines; once requests stop, it sleeps after N microseconds")
    p.add_argument("--index-memory", metavar="SIZE", type=_positive_size,
                   help="bytes of record offsets held in memory at once (4 a record), least recently used "
                        "shard dropped first and loaded again when needed (default 128M)")
    p.add_argument("--no-manifest", action="store_true",
                   help="list SOURCE even when it holds a manifest (.tfrfs-manifest, written by "
                        "tfrfs index --beside)")
    p.add_argument("--debug", action="store_true",
                   help="log at debug level: among others, every request to a remote store, with its "
                        "byte range and time")
    p.add_argument("--daemon", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--report-fd", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_mount)

    p = sub.add_parser("umount", help="unmount a tfrfs mount (committing staged edits first)",
                       description="Unmount MOUNTPOINT. A writable mount commits its staged edits first and "
                                   "says what it committed; if that fails, exit status 1 and the mount stays. "
                                   "(fusermount3 -u and umount commit too; SIGTERM and Ctrl-C of the daemon "
                                   "unmount leaving the edits staged.)")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("--discard", action="store_true",
                   help="drop the staged edits instead of committing them (the shard files stay as they are)")
    p.set_defaults(func=cmd_umount)

    p = sub.add_parser("commit", help="write staged edits into new shards (of a mount, or of a source not mounted)",
                       description="Commit the staged edits of a writable mount (MOUNTPOINT), or of a SOURCE that "
                                   "is not mounted (after its daemon was stopped or crashed): every changed shard "
                                   "is written anew (temporary file, fsync, check, rename; in a bucket: new "
                                   "objects, then the manifest written on a condition). On failure the old "
                                   "shards and the staged edits stay as they were; exit status 1. A SOURCE "
                                   "mounted writable is refused (exit 2): commit its mount point.")
    p.add_argument("target", metavar="MOUNTPOINT|SOURCE")
    p.add_argument("--cache-dir", metavar="DIR", help="where indexes are kept (SOURCE only; default: "
                                                      "$XDG_CACHE_HOME/tfrfs or ~/.cache/tfrfs)")
    add_run_options(p)
    p.set_defaults(func=cmd_commit)

    p = sub.add_parser("status", help="list staged edits",
                       description="List what is staged for a writable mount (MOUNTPOINT) or for a source "
                                   "(SOURCE), per shard, and a mount's last refused writes with their reasons. "
                                   "Says so when a mount's daemon is gone, and how to clean up.")
    p.add_argument("target", metavar="MOUNTPOINT|SOURCE")
    p.add_argument("--cache-dir", metavar="DIR", help="where a bucket SOURCE's edits are staged, as it was mounted "
                                                      "with (default: $XDG_CACHE_HOME/tfrfs or ~/.cache/tfrfs)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("discard", help="drop every staged edit of SOURCE",
                       description="Drop every staged edit of SOURCE, and the scratch files made in its records. "
                                   "Refused while SOURCE is mounted writable (use tfrfs umount --discard).")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--cache-dir", metavar="DIR", help="where a bucket SOURCE's edits are staged, as it was mounted "
                                                      "with (default: $XDG_CACHE_HOME/tfrfs or ~/.cache/tfrfs)")
    p.set_defaults(func=cmd_discard)

    p = sub.add_parser("verify", help="check every checksum and parse, without mounting",
                       description="Check every record of SOURCE: framing, checksums and parsing. "
                                   "Prints each problem; exit status 1 if there are any.")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--records", choices=("example", "sequence", "raw"), help="check records as this kind")
    p.add_argument("--json", action="store_true",
                   help="print one JSON document: per shard its records, kind and problems")
    _add_source_options(p, index_dir=False)
    add_run_options(p)
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("repair", help="rewrite damaged shards with every record that can be saved",
                       description="Check every shard of SOURCE (a local folder, shard or glob, or an "
                                   "s3:// or gs:// URL) and rewrite each damaged one with every record whose "
                                   "checksums hold, in order and byte for byte, by the commit's crash-safe "
                                   "path (in a bucket: a checked temporary object copied over the shard). "
                                   "The damaged original is kept as .tfrfs-damaged/NAME beside it (never "
                                   "shown in a mount). Prints what was dropped. Refused while SOURCE is "
                                   "mounted writable. Exit status 0 when every damaged shard was repaired, "
                                   "1 when one could not be.")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--no-backup", action="store_true", help="do not keep the damaged originals")
    p.add_argument("--dry-run", action="store_true", help="say what would be dropped; change nothing")
    _add_source_options(p, index_dir=False)
    add_run_options(p)
    p.set_defaults(func=cmd_repair)

    p = sub.add_parser("inspect", help="list shards, record counts and the schema, without mounting",
                       description="Print SOURCE's shards, record counts and feature schema.")
    p.add_argument("source", metavar="SOURCE")
    _add_read_options(p)
    _add_source_options(p)
    p.add_argument("--json", action="store_true", help="print the schema as JSON (as .tfrfs/schema.json)")
    add_run_options(p)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("index", help="index SOURCE's shards, and ship the indexes beside them",
                       description="Index every shard of SOURCE into the local cache (reusing index files "
                                   "found beside the shards or in --index-dir when they match). With --beside, "
                                   "write each shard's index next to it (NAME.tfrfs-idx: small, with the "
                                   "shard's size and identity inside), so that every later mount of the "
                                   "dataset, anywhere, needs no scan. --format dali writes the `OFFSET LENGTH` "
                                   "text indexes of DALI's tfrecord2idx and the tfrecord package instead "
                                   "(NAME.idx; uncompressed shards only). The schema (what `inspect` and "
                                   ".tfrfs/schema.json show) is read on all cores and kept in the same "
                                   "index files, unless --no-schema.")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--no-schema", action="store_true",
                   help="index the records' offsets only; the schema is then read when first needed")
    p.add_argument("--format", choices=("tfrfs", "dali"), default="tfrfs",
                   help="index file format to write (default tfrfs; dali implies writing them)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--beside", action="store_true",
                       help="write each shard's index file next to the shard, and the manifest at SOURCE's "
                            "root (not with --out-dir)")
    where.add_argument("--out-dir", metavar="DIR",
                       help="write the index files into the local folder DIR (made if missing; the source's "
                            "folders mirrored) instead of beside the shards (not with --beside); mount with "
                            "--index-dir DIR to use them")
    _add_source_options(p)
    add_run_options(p)
    p.set_defaults(func=cmd_index)

    # reshard: its grammar lives with the command (cli/reshard.py)
    from tfrfs.cli.reshard import add_reshard
    add_reshard(sub, lambda q: _add_source_options(q, index_dir=False), _positive_size)
    # pack: the same (cli/pack.py)
    from tfrfs.cli.pack import add_pack
    add_pack(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = _bare_ray(_mount_without_command(list(sys.argv[1:] if argv is None else argv), parser))
    args, extra = parser.parse_known_args(argv)
    if extra:
        hint = _glob_hint(args, extra)
        if hint:
            print(f"tfrfs: {hint}", file=sys.stderr)
            return EXIT_USAGE
        parser.parse_args(argv)   # says what was not recognized, and exits 2
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        check_options(args)
        status = args.func(args)
        # Written out here, not at exit: a reader that went away shows as BrokenPipeError below,
        # not as Python's "Exception ignored" at shutdown.
        sys.stdout.flush()
        return status
    except UsageError as exc:
        print(f"tfrfs: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TfrfsError as exc:
        print(f"tfrfs: {exc}", file=sys.stderr)
        return EXIT_PROBLEMS
    except KeyboardInterrupt:
        print("tfrfs: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`tfrfs verify SRC | head`): stop quietly, as a
        # command killed by SIGPIPE would, and keep Python from complaining when it flushes.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + 13


def _bare_ray(argv: list[str]) -> list[str]:
    """``--ray`` followed by something that is no Ray address (SOURCE, DEST: ``tfrfs verify --ray
    /data``) is ``--ray`` alone (auto): argparse would take the next word as its ADDRESS."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--":
            break
        if arg == "--ray" and not out[i + 1].startswith("-") and not RAY_ADDRESS.match(out[i + 1]):
            out[i] = "--ray=auto"
    return out


def _mount_without_command(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``tfrfs SOURCE MOUNTPOINT [-o OPTS]`` as ``tfrfs mount ...``: mount.fuse3 runs a file
    system's program so for an fstab line (SPEC 8). Two arguments that are not options, the first
    no command's name, are taken so."""
    commands = next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if len(argv) >= 2 and argv[0] not in commands and not argv[0].startswith("-") \
            and not argv[1].startswith("-"):
        return ["mount", *argv]
    return argv


def _glob_hint(args: argparse.Namespace, extra: list[str]) -> str | None:
    """When the arguments left over are shards, as a glob the shell expanded leaves them: say to
    quote it. None when they are something else."""
    source = getattr(args, "source", None)
    if source is None or any(e.startswith("-") for e in extra):
        return None
    from tfrfs.index.discovery import named_like_shard
    given = [source, *([args.mountpoint] if getattr(args, "mountpoint", None) else []), *extra]
    shards = [g for g in given if os.path.isfile(g) and named_like_shard(os.path.basename(g))]
    if len(shards) < 2:
        return None
    folder = os.path.dirname(shards[0])
    suffix = os.path.splitext(shards[0])[1]
    example = os.path.join(folder, "*" + suffix) if suffix else os.path.join(folder, "*")
    rest = " MOUNTPOINT" if args.command == "mount" else ""
    return (f"{args.command}: {len(shards)} shard files were given where SOURCE is one argument: the shell "
            f"expanded an unquoted glob; quote it, as in: tfrfs {args.command} '{example}'{rest}")
