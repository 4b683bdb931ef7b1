"""tfrfs mount (SPEC 8): the checks before mounting, the daemon's start and logging, and the
wait until the mount answers; the daemon itself runs cmd_mount with -f."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import resource
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tfrfs.fuse import canmount
from tfrfs.fuse import mounttab
from tfrfs.fuse import options
from tfrfs.errors import TfrfsError, UsageError
from tfrfs.index.cache_dir import default_cache_dir
from tfrfs.storage.factory import is_url, open_storage
from tfrfs.cli.common import (EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, FSTYPE, Progress, check_folder, check_options,
                              index_options, open_args)


MOUNT_WAIT_S = 120.0
POLL_US = 100   # mount --poll-us: measured in scripts/bench, see README

log = logging.getLogger("tfrfs")


def _check_mountpoint(mnt: str) -> None:
    try:
        st = os.stat(mnt)
    except FileNotFoundError:
        raise UsageError(f"{mnt}: mount point does not exist") from None
    except OSError as exc:   # Permission denied on a folder above it, say: never "does not exist"
        raise UsageError(f"{mnt}: cannot reach the mount point: {exc.strerror}") from None
    if not os.path.isdir(mnt):
        from tfrfs.index.discovery import named_like_shard
        shard = " (a shard file: if the shell expanded an unquoted glob, quote it)" \
            if stat.S_ISREG(st.st_mode) and named_like_shard(os.path.basename(mnt)) else ""
        raise UsageError(f"{mnt}: mount point is not a folder{shard}")
    if mounttab.fstype_at(mnt):
        raise UsageError(f"{mnt}: something is already mounted there")
    try:
        if os.listdir(mnt):
            raise UsageError(f"{mnt}: mount point is not empty")
    except PermissionError as exc:
        raise UsageError(f"{mnt}: cannot read mount point: {exc.strerror}") from exc


def _check_log(path: Path, what: str) -> None:
    """That the log file ``path`` can be written (its folder made if missing). Raises UsageError."""
    check_folder(path.parent, f"{what}'s folder")
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot be written: {exc.strerror}") from None


def _default_log(cache_dir: str | None, mnt: str) -> Path:
    base = Path(cache_dir) if cache_dir else default_cache_dir()
    if canmount.passed_fd(mnt) is not None:   # (its real path is /dev/fuse, the same for every such mount)
        return base / "logs" / f"fd-{os.getpid()}.log"
    real = os.path.realpath(mnt)
    tag = hashlib.sha256(real.encode()).hexdigest()[:8]
    return base / "logs" / f"{os.path.basename(real) or 'root'}-{tag}.log"


def _setup_logging(log_path: Path, *, also_stderr: bool, debug: bool = False) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = [logging.FileHandler(log_path)]
    if also_stderr:
        handlers.append(logging.StreamHandler(sys.stderr))
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, handlers=handlers, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def cmd_mount(args: argparse.Namespace) -> int:
    opts = options.parse(args.options, remote=is_url(args.source))
    options.merge(args, opts)
    check_options(args)   # again: -o gives values too (index_dir=DIR, index_memory=SIZE)
    args.store_options = opts.store
    if args.poll_us is None:
        args.poll_us = POLL_US
    if args.rw and is_url(args.source) and not open_storage(args.source, opts.store).writable:
        raise UsageError(f"{args.source}: a web server's files are read-only (SPEC 1.1); mount it without --rw "
                         "(in fstab: with ro)")
    fd = canmount.passed_fd(args.mountpoint)
    if fd is not None:
        # Mounted already, by the parent that opened /dev/fuse (SPEC 10): served here, in the
        # foreground, by this process, which holds the descriptor.
        problem = canmount.passed_fd_problem(fd)
        if problem:
            raise UsageError(problem)
    else:
        _check_mountpoint(args.mountpoint)
        for problem in (canmount.fuse_device_problem(), canmount.mountpoint_problem(args.mountpoint),
                        canmount.allow_other_problem(opts.fuse)):
            if problem:
                raise UsageError(problem)
    # libfuse changes the daemon's working folder to /: every path it keeps must be absolute.
    args.mountpoint = os.path.abspath(args.mountpoint)
    if args.cache_dir:
        args.cache_dir = os.path.abspath(args.cache_dir)
        check_folder(args.cache_dir, "--cache-dir")
    else:
        check_folder(default_cache_dir(), "cache folder", hint="choose one with --cache-dir DIR (-o cache_dir=DIR)")
    if args.log:
        args.log = os.path.abspath(args.log)
    if args.index_dir:
        args.index_dir = os.path.abspath(args.index_dir)
    log_path = Path(args.log) if args.log else _default_log(args.cache_dir, args.mountpoint)
    _check_log(log_path, "--log" if args.log else "log file")
    _warn_staged(args)
    if not args.foreground:
        return _spawn_daemon(args, opts, log_path)
    _setup_logging(log_path, also_stderr=not args.daemon, debug=args.debug)
    for noisy in ("botocore", "aiobotocore", "s3fs", "fsspec", "gcsfs", "urllib3", "asyncio", "google", "fuse"):
        logging.getLogger(noisy).setLevel(logging.WARNING)   # the requests are tfrfs's own lines
    _raise_fd_limit()
    # The FUSE adapter loads while the shards are found (a remote source waits on the network).
    import threading
    threading.Thread(target=_preload, args=("tfrfs.fuse.operations",), daemon=True).start()
    report = Report(args.report_fd)
    try:
        m = _open_for_mount(args, report)
    except BaseException as exc:
        if isinstance(exc, TfrfsError):
            report.send(error=str(exc), status=EXIT_USAGE if isinstance(exc, UsageError) else EXIT_PROBLEMS)
        report.close()
        raise
    indexes = m.store.shards
    report.send(indexed={"shards": len(indexes), "records": sum(i.count for i in indexes),
                         "problems": sum(len(i.problems) for i in indexes)})
    report.close()
    try:
        pending = m.status().pending
        if pending:
            log.info("staged changes from an earlier mount: %s", ", ".join(p.shard for p in pending))
        indexes = m.store.shards
        log.info("mounting %s at %s (%d shards, %d records, %s)", args.source, args.mountpoint, len(indexes),
                 sum(i.count for i in indexes), "read-write" if args.rw else "read-only")
        try:
            from tfrfs.fuse import operations as fuse_ops
        except ImportError as exc:
            log.error("cannot mount: %s", exc)
            return EXIT_PROBLEMS
        _fewer_collections()
        try:
            fuse_ops.mount(m, args.mountpoint, poll_us=args.poll_us, options=opts.fuse,
                           owner=opts.owner(os.getuid(), os.getgid()))
        except RuntimeError as exc:
            log.error("FUSE failed: %s", exc)
            return EXIT_PROBLEMS
    finally:
        m.close()
    log.info("unmounted %s", args.mountpoint)
    return EXIT_OK


def _fewer_collections() -> None:
    """The daemon makes many short-lived objects for each record it shows (its view, the rows
    of its folders) and few that form cycles, and Python's cycle collector, run every 700 new
    objects by default, cost about a quarter of a record's time there (measured in process on
    the records of scripts/bench --limit). What the mount holds once it is open (the shards' indexes, the
    tree) is set aside from every collection, and new objects are looked at once every 20,000
    (the older generations' thresholds raised to match)."""
    import gc
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def _preload(module: str) -> None:
    import importlib
    try:
        importlib.import_module(module)
    except ImportError:
        pass   # reported where it is imported for use


def _open_for_mount(args: argparse.Namespace, report: Report) -> Any:
    """The daemon's mount: SOURCE found and indexed, with progress sent to the command that
    started it (or shown on stderr with -f)."""
    from tfrfs.errors import Busy
    from tfrfs.dataset.assembly import open_mount
    on_progress = None if args.report_fd is None else \
        (lambda text, final: report.send(progress=text, final=final))
    options = index_options(args, on_progress=on_progress)
    src = open_args(args)
    try:
        if args.rw and src.local_root is not None and not os.access(src.discovery.root, os.W_OK):
            raise UsageError(f"{src.discovery.root}: not writable, so edits cannot be staged there "
                             "(mount without --rw; in fstab: with ro)")
        return open_mount(src, writable=args.rw, records=args.records, decode_raw=not args.no_decode_raw,
                          **options)
    except Busy as exc:
        src.close()
        raise UsageError(f"{args.source} is already mounted writable by another tfrfs process; "
                         "only one writable mount of a source at a time") from exc
    except BaseException:
        src.close()
        raise


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Report:
    """The daemon's messages to the command that started it, while it sets up (JSON lines on a
    pipe): progress, what it indexed, or why it stopped. Without a pipe (``-f``), nothing."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    def send(self, **message: object) -> None:
        if self.fd is None:
            return
        try:
            os.write(self.fd, (json.dumps(message) + "\n").encode())
        except OSError:
            self.fd = None   # the command is gone (interrupted): the daemon goes on

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _spawn_daemon(args: argparse.Namespace, opts: options.MountOptions, log_path: Path) -> int:
    """Start the daemon, show its progress, and return once the mount is usable. The daemon
    finds and indexes the shards itself (once: a remote source is listed once), telling this
    command how it goes through a pipe."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "tfrfs", "mount", args.source, args.mountpoint, "-f", "--daemon",
           "--log", str(log_path)]
    if args.rw:
        cmd.append("--rw")
    if args.records:
        cmd += ["--records", args.records]
    if args.no_decode_raw:
        cmd.append("--no-decode-raw")
    if args.cache_dir:
        cmd += ["--cache-dir", args.cache_dir]
    if args.cache_size is not None:
        cmd += ["--cache-size", str(args.cache_size)]
    if args.debug:
        cmd.append("--debug")
    if args.index_dir:
        cmd += ["--index-dir", args.index_dir]
    if args.index_memory is not None:
        cmd += ["--index-memory", str(args.index_memory)]
    if args.no_manifest:
        cmd.append("--no-manifest")
    if opts.passed:   # the -o items that are no long option (those are given as such above)
        cmd += ["-o", ",".join(opts.passed)]
    cmd += ["--poll-us", str(args.poll_us)]
    read_end, write_end = os.pipe()
    cmd += ["--report-fd", str(write_end)]
    with open(log_path, "ab") as logf:
        fd = canmount.passed_fd(args.mountpoint)   # a /dev/fuse descriptor: the daemon serves it
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                                pass_fds=(write_end,) if fd is None else (write_end, fd))
    os.close(write_end)
    try:
        return _await_mount(args, log_path, proc, read_end)
    finally:
        os.close(read_end)


def _await_mount(args: argparse.Namespace, log_path: Path, proc: subprocess.Popen, reports: int) -> int:
    import select
    progress = Progress("indexing")
    indexed: dict | None = None
    failure: dict | None = None
    pending = b""
    deadline: float | None = None   # set once indexing is done: then the mount must come up
    while True:
        if select.select([reports], [], [], 0.02)[0]:
            chunk = os.read(reports, 65536)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if "progress" in msg:
                    progress.update(msg["progress"], final=bool(msg.get("final")))
                elif "indexed" in msg:
                    indexed = msg["indexed"]
                    deadline = time.monotonic() + MOUNT_WAIT_S
                elif "error" in msg:
                    failure = msg
        if indexed is not None and deadline is not None and (
                # a passed descriptor is mounted already (by the parent that opened it): nothing to
                # look at here but the daemon, which answers the kernel's first request once up
                (canmount.passed_fd(args.mountpoint) is not None and proc.poll() is None) or
                (mounttab.fstype_at(args.mountpoint) == FSTYPE and _serving(args.mountpoint, deadline))):
            print(f"mounted {args.source} at {args.mountpoint} ({indexed['shards']} shards, "
                  f"{indexed['records']:,} records, {'read-write' if args.rw else 'read-only'}); log: {log_path}")
            if indexed["problems"]:
                print(f"warning: {indexed['problems']} problem(s) found in the data; "
                      f"see {args.mountpoint}/.tfrfs/errors", file=sys.stderr)
            return EXIT_OK
        if proc.poll() is not None:
            if failure is None:
                rest = pending + _drain(reports)
                for line in rest.split(b"\n"):
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        continue
                    if "error" in msg:
                        failure = msg
            if failure is not None:
                print(f"tfrfs: {failure['error']}", file=sys.stderr)
                return int(failure.get("status", EXIT_PROBLEMS))
            refusal = _fuse_refusal(log_path)
            if refusal:
                print(f"tfrfs: cannot mount {args.mountpoint}: {refusal}; log: {log_path}", file=sys.stderr)
                return EXIT_PROBLEMS
            print(f"tfrfs: mount failed (daemon exited with status {proc.returncode}); log: {log_path}\n"
                  f"{_tail(log_path)}", file=sys.stderr)
            return EXIT_PROBLEMS
        if deadline is not None and time.monotonic() > deadline:
            proc.terminate()
            print(f"tfrfs: mount did not become ready within {MOUNT_WAIT_S:.0f}s; log: {log_path}", file=sys.stderr)
            return EXIT_PROBLEMS


def _fuse_refusal(log_path: Path) -> str | None:
    """What libfuse or fusermount3 said when it refused to mount (they write it to the daemon's
    stderr, which is the log), or None."""
    for line in reversed(_tail(log_path, 20).splitlines()):
        if line.startswith(("fusermount3:", "fusermount:", "fuse:")):
            return line.strip()
    return None


def _drain(fd: int) -> bytes:
    out = b""
    import select
    while select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        out += chunk
    return out


def _serving(mnt: str, deadline: float) -> bool:
    """Whether the daemon answers at ``mnt``, which the kernel shows as mounted before the
    daemon's FUSE init has run; a failed init then ends the mount. A stat waits for init to be
    answered: it fails if the daemon ended instead, or reaches the folder beneath once the
    mount is gone. Asked on a thread, so a daemon that never answers costs no more than
    ``deadline``."""
    import threading
    answered: list[bool] = []

    def ask() -> None:
        try:
            os.stat(mnt)
        except OSError:
            answered.append(False)
            return
        answered.append(mounttab.fstype_at(mnt) == FSTYPE)

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    asking.join(max(0.0, deadline - time.monotonic()))
    return bool(answered and answered[0])


def _tail(path: Path, lines: int = 10) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _warn_staged(args: argparse.Namespace) -> None:
    """tfrfs mount (read-only) of a local source with staged edits: say that they exist (the daemon
    logs it too; with -f that line is on the terminal already)."""
    if args.rw or args.foreground or is_url(args.source):
        return
    from tfrfs.index.discovery import STAGING_DIR
    if os.path.isdir(args.source) and not os.path.isdir(os.path.join(args.source, STAGING_DIR)):
        return   # nothing was ever staged there: no need to load what reads a journal
    from tfrfs.dataset.assembly import staged_in
    try:
        pending = staged_in(args.source)
    except TfrfsError:
        return   # the daemon says what is wrong with SOURCE
    if pending:
        print(f"warning: {args.source} has staged edits that a read-only mount does not show "
              f"({', '.join(p.shard for p in pending)}); mount it --rw, or tfrfs commit / tfrfs discard it",
              file=sys.stderr)
