"""What several commands share: exit statuses, progress on stderr, opening SOURCE (SPEC 1) as
the arguments name it, and the check that a folder given to tfrfs can be written in."""

from __future__ import annotations

import argparse
import errno
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .. import mounttab
from ..errors import UsageError
from ..index import IndexCache, ShardIndex, default_cache_dir
from ..remote import parse_options
from ..indexmemory import IndexMemory
from ..sources import Source, index_source, open_source

if TYPE_CHECKING:
    from .. import jobs


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
    store = getattr(args, "store_options", None)   # mount: sorted from its other -o items
    if store is None:
        store = parse_options(getattr(args, "options", None) or [])
    if getattr(args, "cache_dir", None):
        _check_folder(args.cache_dir, "--cache-dir")
    # A read-only mount starts from the dataset's manifest when it has one (SPEC 1.2); the other
    # commands (and --rw) list the source, as they read or write every shard.
    mounting = getattr(args, "command", None) == "mount" and not getattr(args, "rw", False)
    return open_source(args.source, options=store, cache_dir=getattr(args, "cache_dir", None),
                       cache_size=getattr(args, "cache_size", None), empty_ok=bool(getattr(args, "rw", False)),
                       use_manifest=mounting and not getattr(args, "no_manifest", False))


def open_dataset(args: argparse.Namespace, *, quiet: bool = False,
                 on_progress: Callable[[str, bool], None] | None = None, runner: "jobs.Runner | None" = None,
                 schema: bool = False) -> tuple[Source, list[ShardIndex], IndexCache]:
    """SOURCE's shards, indexed, with progress on stderr (or to ``on_progress``) unless ``quiet``;
    with a ``runner``, the shards not indexed yet are indexed as shard jobs on it (``schema``:
    their schema's parts too)."""
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

    if not getattr(args, "cache_dir", None):
        _check_folder(str(default_cache_dir()), "cache folder", hint="choose one with --cache-dir DIR (-o cache_dir=DIR)")
    src = open_args(args)
    try:
        budget = getattr(args, "index_memory", None)
        if runner is not None:
            from ..sources import index_with
            indexes, cache = index_with(src, runner, None if quiet else report, schema,
                                        getattr(args, "index_dir", None), IndexMemory(budget) if budget is not None else None)
        else:
            indexes, cache = index_source(src, None if quiet else report, getattr(args, "index_dir", None),
                                          IndexMemory(budget) if budget is not None else None)
    except BaseException:
        src.close()
        raise
    return src, indexes, cache


def _check_folder(path: str | Path, what: str, *, hint: str = "") -> None:
    """That ``path`` is a folder this user can write in, made if missing. Raises UsageError."""
    hint = f"; {hint}" if hint else ""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"{what} {path}: not a folder{hint}") from None
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot be made: {exc.strerror}{hint}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {path}: not writable ({os.strerror(errno.EACCES)}){hint}")


# --- where shard jobs run (SPEC 8) ----------------------------------------------------------------

def add_run_options(p: argparse.ArgumentParser) -> None:
    """``--ray [ADDRESS]`` and ``--workers N``: where a command's shard jobs run."""
    p.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS",
                   help="run the shard jobs as tasks on a Ray cluster: ADDRESS as `ray start` prints it "
                        "(host:port, ray://host:port); without it or with `auto`, $RAY_ADDRESS, else a "
                        "cluster started on this machine for the command. Needs pip install 'tfrfs[ray]'")
    p.add_argument("--workers", type=_processes, metavar="N",
                   help="without --ray: local worker processes (default: one per core; 1 runs the "
                        "jobs in this process)")


def _processes(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of processes, 1 or more")
    return n


def runner_of(args: argparse.Namespace) -> "jobs.Runner":
    """The runner the command's ``--ray`` / ``--workers`` ask for."""
    from .. import jobs
    return jobs.runner(getattr(args, "ray", None), getattr(args, "workers", None))
