"""What several commands share: exit statuses, progress on stderr, opening SOURCE (SPEC 1) as
the arguments name it, and the checks of option values made before any work (a folder given to
tfrfs can be written in, a Ray address answers, ...)."""

from __future__ import annotations

import argparse
import errno
import os
import re
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tfrfs.fuse import mounttab
from tfrfs.errors import UsageError
from tfrfs.index.cache_dir import default_cache_dir
from tfrfs.storage.factory import is_url

# What opens and indexes a dataset is imported where it is used: the commands that only look at
# a mount (umount, status, commit, discard) and the mount command itself, which leaves the dataset
# to the daemon it starts, start in a tenth of the time without it.
if TYPE_CHECKING:
    from tfrfs.dataset.factory import DatasetParts
    from tfrfs.dataset.sources import Source
    from tfrfs.index.shard_index import IndexProgress
    from tfrfs.jobs import runner as jobs


EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2
FSTYPE = mounttab.TFRFS_FSTYPE


class Progress:
    """Progress on stderr for work that takes more than a moment."""

    def __init__(self, what: str, *, delay: float = 0.5) -> None:
        self.what = what
        self.start = time.monotonic()
        self.delay = delay
        self.shown = False
        self.last = 0.0
        self.tty = sys.stderr.isatty()

    def update(self, text: str, *, final: bool = False) -> None:
        now = time.monotonic()
        if now - self.start < self.delay and not (final and self.shown):
            return
        if not final and now - self.last < (0.1 if self.tty else 2.0):
            return
        self.last = now
        self.shown = True
        line = f"{self.what}: {text} ({now - self.start:.1f}s)"
        if self.tty:
            sys.stderr.write("\r\x1b[K" + line + ("\n" if final else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def open_args(args: argparse.Namespace) -> Source:
    """SOURCE as the command's arguments name it (with ``-o`` store options, cache folder and size).
    A --rw mount may start from a folder without shards."""
    from tfrfs.dataset.sources import open_source
    from tfrfs.storage.fsspec_store import parse_options
    store = getattr(args, "store_options", None)   # mount: sorted from its other -o items
    if store is None:
        store = parse_options(getattr(args, "options", None) or [])
    if getattr(args, "cache_dir", None):
        check_folder(args.cache_dir, "--cache-dir")
    # A read-only mount starts from the dataset's manifest when it has one (SPEC 1.2); the other
    # commands (and --rw) list the source, as they read or write every shard.
    # A bucket's edits are committed through its manifest (SPEC 7.1): a --rw mount and a commit of
    # one start from it too.
    mounting = getattr(args, "command", None) == "mount" and not getattr(args, "rw", False)
    editing = getattr(args, "command", None) in ("mount", "commit") and is_url(args.source)
    return open_source(args.source, options=store, cache_dir=getattr(args, "cache_dir", None),
                       cache_size=getattr(args, "cache_size", None), empty_ok=bool(getattr(args, "rw", False)),
                       use_manifest=(mounting or editing) and not getattr(args, "no_manifest", False))


def index_progress(*, quiet: bool = False,
                   on_progress: Callable[[str, bool], None] | None = None) -> IndexProgress | None:
    """Indexing's progress on stderr (or to ``on_progress``), or None when ``quiet``."""
    if quiet:
        return None
    progress = Progress("indexing")
    show = on_progress or (lambda text, final: progress.update(text, final=final))
    sent = [0.0]

    def report(done: int, total: int, records: int, done_bytes: int, total_bytes: int) -> None:
        now = time.monotonic()
        if on_progress is not None and done != total and now - sent[0] < 0.1:
            return   # the command that shows it paces itself too
        sent[0] = now
        show(f"{done}/{total} shards, {records:,} records, "
             f"{done_bytes / 2**20:,.0f}/{total_bytes / 2**20:,.0f} MiB", done == total)
    return report


def index_options(args: argparse.Namespace, *, quiet: bool = False,
                  on_progress: Callable[[str, bool], None] | None = None) -> dict[str, Any]:
    """How the command's arguments ask SOURCE's shards to be indexed (``--index-dir``,
    ``--index-memory``), with progress (see ``index_progress``): keywords of ``open_dataset``,
    ``open_mount`` and ``commit_source``. Checks the default cache folder first."""
    from tfrfs.index.memory import IndexMemory
    if not getattr(args, "cache_dir", None):
        check_folder(str(default_cache_dir()), "cache folder", hint="choose one with --cache-dir DIR (-o cache_dir=DIR)")
    budget = getattr(args, "index_memory", None)
    return {"progress": index_progress(quiet=quiet, on_progress=on_progress),
            "index_dir": getattr(args, "index_dir", None),
            "memory": IndexMemory(budget) if budget is not None else None}


def open_dataset(args: argparse.Namespace, *, quiet: bool = False, runner: "jobs.Runner | None" = None,
                 schema: bool = False) -> DatasetParts:
    """SOURCE as a dataset (``dataset.factory``), its shards indexed with progress on stderr unless
    ``quiet``; with a ``runner``, the shards not indexed yet are indexed as shard jobs on it
    (``schema``: their schema's parts too); its records read as ``--records`` and
    ``--no-decode-raw`` say."""
    from tfrfs.dataset import factory
    options = index_options(args, quiet=quiet)
    src = open_args(args)
    try:
        return factory.open_dataset(src, runner=runner, schema_parts=schema, records=getattr(args, "records", None),
                                    decode_raw=not getattr(args, "no_decode_raw", False), **options)
    except BaseException:
        src.close()
        raise


def check_folder(path: str | Path, what: str, *, hint: str = "", room: bool = False) -> None:
    """That ``path`` is a folder this user can write in, made if missing; ``room``: with room for
    a block more. Raises UsageError."""
    hint = f"; {hint}" if hint else ""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"{what} {path}: not a folder{hint}") from None
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot be made: {exc.strerror}{hint}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {path}: not writable ({os.strerror(errno.EACCES)}){hint}")
    # access(2) says yes to root in /sys and /proc, where no file can be made, and nothing of a
    # full disk: a file made (and for ``room`` written and synced) there tells.
    try:
        fd, probe = tempfile.mkstemp(prefix=".tfrfs-probe-", dir=path)
    except OSError as exc:
        raise UsageError(f"{what} {path}: no file can be made in it ({exc.strerror}){hint}") from None
    try:
        if room:
            os.write(fd, bytes(4096))
            os.fsync(fd)
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot be written ({exc.strerror}){hint}") from None
    finally:
        os.close(fd)
        os.unlink(probe)


# --- option values checked before any work (SPEC 8: bad input is one line and exit status 2) -----

def check_options(args: argparse.Namespace) -> None:
    """The values of the options ``args`` holds that only the work would find bad, checked
    before it starts: folders, the Ray address, sizes. Raises UsageError."""
    if getattr(args, "cache_dir", None):
        check_folder(args.cache_dir, "--cache-dir")
    if getattr(args, "index_dir", None):
        check_index_dir(args.index_dir)
    if getattr(args, "out_dir", None):
        if is_url(args.out_dir):
            raise UsageError(f"--out-dir {args.out_dir}: give a local folder (--beside writes the index "
                             "files into the bucket, beside its shards)")
        check_folder(args.out_dir, "--out-dir", room=True)
    if getattr(args, "index_memory", None) is not None and args.index_memory < 1:
        raise UsageError(f"--index-memory {args.index_memory}: give a size of 1 byte or more (like 128M)")
    if getattr(args, "ray", None) is not None:
        check_ray(args.ray)


def check_index_dir(path: str) -> None:
    """``--index-dir``: a local folder to read index files from. Raises UsageError."""
    if is_url(path):
        raise UsageError(f"--index-dir {path}: give a local folder (index files beside a bucket's shards "
                         "are found there without it)")
    if not os.path.isdir(path):
        says = "not a folder" if os.path.exists(path) else "no such folder"
        raise UsageError(f"--index-dir {path}: {says}; give the folder `tfrfs index --out-dir` wrote")
    if not os.access(path, os.R_OK | os.X_OK):
        raise UsageError(f"--index-dir {path}: cannot be read ({os.strerror(errno.EACCES)})")


# What ``--ray`` takes besides ``auto``: as ``ray start`` prints it (host:port, ray://host:port,
# an IPv6 [host]:port) or a dashboard's http(s) address.
RAY_ADDRESS = re.compile(r"^(auto|(ray|https?)://\S+|[\w.-]+:\d+|\[[0-9a-fA-F:]+\]:\d+)$")
RAY_CONNECT_S = 5.0


def check_ray(address: str) -> None:
    """That ``--ray ADDRESS`` (``auto``: $RAY_ADDRESS when set) names a Ray cluster that answers:
    Ray itself waits a minute or more for one that does not. ``auto`` without $RAY_ADDRESS
    starts a cluster here, which needs no check. Raises UsageError."""
    from tfrfs.jobs.runner import RAY_ENV
    given = f"--ray {address}" if address and address != "auto" else ""
    if not given:
        address = os.environ.get(RAY_ENV) or ""
        given = f"${RAY_ENV} {address}"
        if address in ("", "auto", "local"):
            return
    if not RAY_ADDRESS.match(address):
        raise UsageError(f"{given}: not a Ray address; give host:port or ray://host:port as `ray start` "
                         "prints it, or auto")
    host, port = _host_port(address)
    try:
        socket.create_connection((host, port), timeout=RAY_CONNECT_S).close()
    except OSError as exc:
        reason = "no answer" if isinstance(exc, socket.timeout) else (exc.strerror or str(exc))
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise UsageError(f"{given}: no Ray cluster answers at {shown} ({reason}); give the address "
                         "`ray start --head` printed") from None


def _host_port(address: str) -> tuple[str, int]:
    """The host and port ``check_ray`` connects to: a URL's (its scheme's port when it names none)."""
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "", address
    netloc = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    host, colon, port = netloc.rpartition(":")
    if not colon or not port.isdigit() or (host.startswith("[") != host.endswith("]")):
        host, port = netloc, str({"https": 443, "http": 80, "ray": 10001}.get(scheme, 6379))
    return host.strip("[]"), int(port)


# --- where shard jobs run (SPEC 8) ----------------------------------------------------------------

def add_run_options(p: argparse.ArgumentParser) -> None:
    """``--ray [ADDRESS]`` or ``--workers N``: where a command's shard jobs run."""
    # One or the other: Ray places its tasks itself, so a number of processes would be ignored.
    where = p.add_mutually_exclusive_group()
    where.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS",
                       help="run the shard jobs as tasks on a Ray cluster: ADDRESS as `ray start` prints it "
                            "(host:port, ray://host:port); without it or with `auto`, $RAY_ADDRESS, else a "
                            "cluster started on this machine for the command. Needs pip install 'tfrfs[ray]'")
    where.add_argument("--workers", type=_processes, metavar="N",
                       help=f"local worker processes, 1 to {MAX_WORKERS} (not with --ray; default: one per "
                            "core, two for index, verify and inspect, so that one computes while another "
                            "waits on the disk; 1 runs the jobs in this process)")


# A pool starts all its processes at once (forked): a slip of the keyboard (--workers 100000)
# would fill the process table, not speed anything up.
MAX_WORKERS = 1024


def _processes(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of processes, 1 to {MAX_WORKERS}")
    return n


def runner_of(args: argparse.Namespace, *, walk: bool = False) -> "jobs.Runner":
    """The runner the command's ``--ray`` / ``--workers`` ask for; ``walk``: a command that walks
    every record (two local workers a core by default, ``jobs.WALK_WORKERS_PER_CORE``)."""
    from tfrfs.jobs import runner as jobs
    return jobs.runner(getattr(args, "ray", None), getattr(args, "workers", None),
                       jobs.WALK_WORKERS_PER_CORE if walk else 1)
