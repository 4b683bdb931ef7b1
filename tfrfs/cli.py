"""Command line: the only module that prints to the user or chooses an exit status.

Exit status: 0 success, 1 the command ran and found problems (or failed at
its work), 2 bad usage or bad input.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import logging
import os
import resource
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from . import __version__, canmount, mounttab, options
from .errors import TfrfsError, UsageError
from .index import IndexCache, ShardIndex, default_cache_dir, named_like_shard
from .remote import is_url, parse_options
from .sources import Source, index_source, open_source

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2
FSTYPE = mounttab.TFRFS_FSTYPE
MOUNT_WAIT_S = 120.0
POLL_US = 100   # mount --poll-us: measured in scripts/bench, see README

log = logging.getLogger("tfrfs")


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
    return open_source(args.source, options=store, cache_dir=getattr(args, "cache_dir", None),
                       cache_size=getattr(args, "cache_size", None), empty_ok=bool(getattr(args, "rw", False)))


def open_dataset(args: argparse.Namespace, *, quiet: bool = False,
                 on_progress: Callable[[str, bool], None] | None = None) -> tuple[Source, list[ShardIndex], IndexCache]:
    """SOURCE's shards, indexed, with progress on stderr (or to ``on_progress``) unless ``quiet``."""
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
        indexes, cache = index_source(src, None if quiet else report, getattr(args, "index_dir", None))
    except BaseException:
        src.close()
        raise
    return src, indexes, cache


# --- mount ---------------------------------------------------------------------



def _check_mountpoint(mnt: str) -> None:
    try:
        st = os.stat(mnt)
    except FileNotFoundError:
        raise UsageError(f"{mnt}: mount point does not exist") from None
    except OSError as exc:   # Permission denied on a folder above it, say: never "does not exist"
        raise UsageError(f"{mnt}: cannot reach the mount point: {exc.strerror}") from None
    if not os.path.isdir(mnt):
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


def _check_log(path: Path, what: str) -> None:
    """That the log file ``path`` can be written (its folder made if missing). Raises UsageError."""
    _check_folder(path.parent, f"{what}'s folder")
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot be written: {exc.strerror}") from None


def _default_log(cache_dir: str | None, mnt: str) -> Path:
    base = Path(cache_dir) if cache_dir else default_cache_dir()
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
    args.store_options = opts.store
    if args.poll_us is None:
        args.poll_us = POLL_US
    if args.rw and is_url(args.source):
        raise UsageError(f"{args.source}: a remote source is read-only (SPEC 1.1); mount it without --rw "
                         "(in fstab: with ro)")
    _check_mountpoint(args.mountpoint)
    for problem in (canmount.fuse_device_problem(), canmount.mountpoint_problem(args.mountpoint),
                    canmount.allow_other_problem(opts.fuse)):
        if problem:
            raise UsageError(problem)
    # libfuse changes the daemon's working folder to /: every path it keeps must be absolute.
    args.mountpoint = os.path.abspath(args.mountpoint)
    if args.cache_dir:
        args.cache_dir = os.path.abspath(args.cache_dir)
        _check_folder(args.cache_dir, "--cache-dir")
    else:
        _check_folder(default_cache_dir(), "cache folder", hint="choose one with --cache-dir DIR (-o cache_dir=DIR)")
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
    threading.Thread(target=_preload, args=("tfrfs.fuse_ops",), daemon=True).start()
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
            from . import fuse_ops
        except ImportError as exc:
            log.error("cannot mount: %s", exc)
            return EXIT_PROBLEMS
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


def _preload(module: str) -> None:
    import importlib
    try:
        importlib.import_module(module)
    except ImportError:
        pass   # reported where it is imported for use


def _open_for_mount(args: argparse.Namespace, report: Report) -> Any:
    """The daemon's mount: SOURCE found and indexed, with progress sent to the command that
    started it (or shown on stderr with -f)."""
    from .errors import Busy
    from .mount import open_mount
    if args.report_fd is None:
        src, indexes, cache = open_dataset(args)
    else:
        src, indexes, cache = open_dataset(args, on_progress=lambda text, final: report.send(progress=text,
                                                                                              final=final))
    try:
        if args.rw and not os.access(src.discovery.root, os.W_OK):
            raise UsageError(f"{src.discovery.root}: not writable, so edits cannot be staged there "
                             "(mount without --rw)")
        return open_mount(src, writable=args.rw, records=args.records, decode_raw=not args.no_decode_raw,
                          indexed=(indexes, cache))
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
    if opts.passed:   # the -o items that are no long option (those are given as such above)
        cmd += ["-o", ",".join(opts.passed)]
    cmd += ["--poll-us", str(args.poll_us)]
    read_end, write_end = os.pipe()
    cmd += ["--report-fd", str(write_end)]
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                                pass_fds=(write_end,))
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
        if indexed is not None and deadline is not None and mounttab.fstype_at(args.mountpoint) == FSTYPE \
                and _serving(args.mountpoint, deadline):
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


def _fusermount() -> str:
    """libfuse3's fusermount3 where it is installed (it mounted us), else fusermount."""
    return "fusermount3" if shutil.which("fusermount3") else "fusermount"


def _non_negative_int(text: str) -> int:
    try:
        return options.whole_number(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tail(path: Path, lines: int = 10) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def cmd_umount(args: argparse.Namespace) -> int:
    mnt = args.mountpoint
    fstype = mounttab.fstype_at(mnt)
    if fstype != FSTYPE:
        raise UsageError(f"{mnt}: not a tfrfs mount")
    if _daemon_state(mnt) == "gone":
        source = _source_of(mnt)
        proc = subprocess.run([_fusermount(), "-u", mnt], capture_output=True, text=True)
        left = f"; {_staged_summary(source)}" if source else ""
        if proc.returncode != 0:
            print(f"tfrfs: {mnt}: its daemon is gone and the mount cannot be detached: {proc.stderr.strip()}{left}",
                  file=sys.stderr)
            return EXIT_PROBLEMS
        print(f"tfrfs: {mnt}: its daemon was gone, so nothing was committed; the dead mount is detached{left}",
              file=sys.stderr)
        return EXIT_PROBLEMS
    info = _mount_status(mnt)   # None: a read-only mount
    committed: dict | None = None
    if info is not None:
        if args.discard:
            failure = _control(mnt, b"discard\n")
        else:
            failure = _with_progress("committing", lambda: _control(mnt, b"commit\n"))
            committed = _last_commit(mnt) if failure is None else None
        if failure is not None:
            print(f"tfrfs: {failure}; {mnt} stays mounted", file=sys.stderr)
            return EXIT_PROBLEMS
    proc = subprocess.run([_fusermount(), "-u", mnt], capture_output=True, text=True)
    if proc.returncode != 0:
        if info is not None and args.discard:
            _control(mnt, b"keep\n")   # the edits are committed at a later unmount again
        what = "; nothing was discarded" if info is not None and args.discard else ""
        print(f"tfrfs: cannot unmount {mnt}: {proc.stderr.strip()}{what}", file=sys.stderr)
        return EXIT_PROBLEMS
    # fusermount3 returns once the kernel lets go; the daemon then finishes (commits or drops what
    # is staged, lets go of the source's lock) and exits: wait for that too.
    deadline = time.monotonic() + 10
    while mounttab.fstype_at(mnt) == FSTYPE and time.monotonic() < deadline:
        time.sleep(0.05)
    if info is not None and info.get("pid"):
        _wait_gone(int(info["pid"]), 120 if args.discard else 10)
    if committed is not None:
        _print_commit(committed)
    if info is not None and args.discard:
        left = _staged_summary(info.get("source") or "") if info.get("source") else ""
        if left and not left.startswith("nothing"):
            print(f"tfrfs: unmounted {mnt}, but its staged edits could not all be dropped ({left}); "
                  f"see its log, then tfrfs discard {info['source']}", file=sys.stderr)
            return EXIT_PROBLEMS
        print(f"discarded the staged edits of {len(info.get('pending', []))} shard(s)")
    print(f"unmounted {mnt}")
    return EXIT_OK


def _wait_gone(pid: int, seconds: float) -> None:
    from .mountrecord import alive
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _control(mnt: str, word: bytes) -> str | None:
    """Write ``word`` to a writable mount's ``.tfrfs/commit`` (``commit``: commit now; ``discard``:
    drop the staged edits at unmount; ``keep``: commit them at unmount again); None on success,
    else the reason."""
    control = os.path.join(mnt, ".tfrfs", "commit")
    try:
        fd = os.open(control, os.O_WRONLY)
        try:
            os.write(fd, word)
        finally:
            os.close(fd)
    except OSError as exc:
        try:
            with open(control) as f:
                detail = json.loads(f.read() or "{}").get("error")
        except (OSError, ValueError):
            detail = None
        return detail or f"{word.decode().strip()} failed: {exc.strerror}"
    return None


def _last_commit(mnt: str) -> dict:
    try:
        with open(os.path.join(mnt, ".tfrfs", "commit")) as f:
            return json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}


def _mount_status(mnt: str) -> dict | None:
    """A writable mount's ``.tfrfs/status``; None for a read-only mount (it has none)."""
    try:
        with open(os.path.join(mnt, ".tfrfs", "status")) as f:
            return json.loads(f.read() or "{}")
    except FileNotFoundError:
        return None
    except ValueError:
        return {}


def _daemon_state(mnt: str, wait: float = 5.0) -> str:
    """"serving", "gone" (a dead daemon's mount: "Transport endpoint is not connected") or
    "silent" (no answer within ``wait`` seconds, and its process still runs). Asked on a thread:
    a hung daemon's mount would keep a stat waiting."""
    import errno as _errno
    import threading
    from . import mountrecord
    answer: list[str] = []

    def ask() -> None:
        try:
            os.stat(mnt)
            answer.append("serving")
        except OSError as exc:
            answer.append("gone" if exc.errno == _errno.ENOTCONN else "serving")

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    asking.join(wait)
    if answer:
        return answer[0]
    record = mountrecord.read(mnt)
    return "gone" if record is not None and not mountrecord.alive(record.pid) else "silent"


def _source_of(mnt: str) -> str | None:
    """The source mounted at ``mnt``: from the note its daemon left (see ``mountrecord``), else from
    the file system's name in the mount table when that is a local folder whose staging lock names
    this mount point."""
    from . import mountrecord
    from .mount import source_root
    from .staging import Staging
    record = mountrecord.read(mnt)
    if record is not None:
        return record.source
    point = os.path.abspath(mnt)
    for entry in mounttab.entries():
        if entry.point == point and entry.fstype == FSTYPE and os.path.isabs(entry.source):
            try:
                if Staging(source_root(entry.source)).holder().get("mountpoint") == point:
                    return entry.source
            except TfrfsError:
                pass
    return None


def _staged_summary(source: str) -> str:
    from .mount import staged_in
    try:
        pending = staged_in(source)
    except TfrfsError:
        return ""
    if not pending:
        return f"nothing staged in {source}"
    return f"{len(pending)} shard(s)' edits stay staged in {source}: tfrfs commit or tfrfs discard it"


def _with_progress(what: str, work: Callable[[], Any]) -> Any:
    """Run ``work`` while telling the user it is still going (after the first second)."""
    import threading
    result: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:   # raised again in the caller's thread
            failed.append(exc)
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    progress = Progress(what, delay=1.0)
    while worker.is_alive():
        worker.join(0.2)
        progress.update("writing changed shards")
    progress.update("done", final=True)
    if failed:
        raise failed[0]
    return result[0] if result else "commit did not finish"


def _print_commit(result: dict) -> None:
    """What a commit did: each shard written, the totals, and the commit's notes."""
    shards = result.get("shards", [])
    staged = {p["shard"]: p for p in result.get("staged", [])}
    for s in shards:
        p = staged.get(s["relpath"], {})
        changes = ", ".join(f"{p[k]} {k}" for k in ("edited", "deleted", "added") if p.get(k))
        print(f"{s['action']:>9}  {s['relpath']}  ({s['records']:,} records" + (f"; {changes}" if changes else "")
              + ")")
    if shards:
        changed = result.get("records_changed", 0)
        print(f"committed {len(shards)} shard(s), {changed:,} record(s) changed, in {result.get('seconds', 0)}s")
    else:
        print("nothing to commit")
    for note in result.get("notes", []):
        print(note)


def cmd_commit(args: argparse.Namespace) -> int:
    target = args.target
    if mounttab.fstype_at(target) != FSTYPE:
        return _commit_source(args)
    if _daemon_state(target) == "gone":
        source = _source_of(target) or "SOURCE"
        print(f"tfrfs: {target}: its daemon is gone; detach the dead mount (fusermount3 -u {target}), "
              f"then tfrfs commit {source}", file=sys.stderr)
        return EXIT_PROBLEMS
    if _mount_status(target) is None:
        raise UsageError(f"{target}: not a writable mount (mount with --rw to make changes)")
    failure = _with_progress("committing", lambda: _control(target, b"commit\n"))
    if failure:
        print(f"tfrfs: {failure}", file=sys.stderr)
        return EXIT_PROBLEMS
    _print_commit(_last_commit(target))
    return EXIT_OK


def _commit_source(args: argparse.Namespace) -> int:
    """tfrfs commit SOURCE: a source that is not mounted (after a crash, or a stop by a signal)."""
    from .mount import commit_source, staged_in, writable_holder
    from .repack import CommitFailed
    source = args.target
    if is_url(source):
        raise UsageError(f"{source}: a remote source is read-only: nothing is ever staged for it")
    holder = writable_holder(source)
    if holder:
        where = holder.get("mountpoint") or "MOUNTPOINT"
        raise UsageError(f"{source} is mounted writable" + (f" at {where}" if holder.get("mountpoint") else "")
                         + f": commit it there (tfrfs commit {where})")
    if not staged_in(source):
        print("nothing staged")
        return EXIT_OK
    args.source = source
    args.rw = True   # a dataset built from nothing has no shard file before its first commit
    src, indexes, cache = open_dataset(args)
    try:
        result = _with_progress("committing", lambda: commit_source(src, (indexes, cache)))
    except CommitFailed as exc:
        print(f"tfrfs: {exc}", file=sys.stderr)
        return EXIT_PROBLEMS
    finally:
        src.close()
    _print_commit(result.to_json())
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from .mount import PendingShard, staged_in
    target = args.target
    if mounttab.fstype_at(target) == FSTYPE:
        state = _daemon_state(target)
        if state != "serving":
            source = _source_of(target)
            if state == "silent":
                print(f"{target}: its tfrfs daemon does not answer (its log may say why); "
                      + (_staged_summary(source) if source else "its source is not known"))
                return EXIT_PROBLEMS
            print(f"{target}: the tfrfs daemon of this mount is gone (the mount is left as \"Transport endpoint "
                  f"is not connected\"); clean up: fusermount3 -u {target}, then tfrfs status, commit or discard "
                  f"{source or 'SOURCE'}")
            if source:
                print(f"staged in {source}:")
                _print_pending(list(staged_in(source)))
            return EXIT_PROBLEMS
        info = _mount_status(target)
        if info is None:
            from . import mountrecord
            print(f"{target}: read-only mount, nothing staged by it")
            record = mountrecord.read(target)
            if record is not None and not is_url(record.source):
                try:
                    pending = list(staged_in(record.root))
                except TfrfsError:
                    pending = []
                if pending:
                    print(f"{record.source} has staged edits from a --rw mount, not shown in this one "
                          f"(tfrfs commit or tfrfs discard it):")
                    _print_pending(pending)
            return EXIT_OK
        _print_pending([PendingShard(**p) for p in info.get("pending", [])])
        rejected = info.get("rejected", [])
        if rejected:
            print(f"refused writes (the last {len(rejected)}, oldest first; their old values stay):")
            for r in rejected:
                print(f"  {time.strftime('%H:%M:%S', time.localtime(r['time']))}  {r['path']}: {r['reason']}")
        return EXIT_OK
    from .mount import source_root, writable_holder
    from .staging import Staging
    pending = list(staged_in(target))
    holder = Staging(source_root(target)).holder() if not is_url(target) else {}
    where = holder.get("mountpoint")
    if where and not writable_holder(target) and mounttab.fstype_at(where) == FSTYPE \
            and _daemon_state(where) == "gone":
        print(f"warning: its --rw mount at {where} was left by a daemon that is gone: fusermount3 -u {where}",
              file=sys.stderr)
    _print_pending(pending)
    return EXIT_OK


def _print_pending(pending: list) -> None:
    if not pending:
        print("nothing staged")
        return
    for p in pending:
        what = "removed" if p.removed else ", ".join(
            f"{n} {k}" for k, n in (("edited", p.edited), ("deleted", p.deleted), ("added", p.added)) if n) or "empty"
        print(f"{p.shard}: {'new shard, ' if p.new else ''}{what}")


def cmd_discard(args: argparse.Namespace) -> int:
    from .mount import discard
    result = discard(args.source)
    print(f"discarded the staged edits of {result.shards} shard(s)")
    return EXIT_OK


def _warn_staged(args: argparse.Namespace) -> None:
    """tfrfs mount (read-only) of a local source with staged edits: say that they exist (the daemon
    logs it too; with -f that line is on the terminal already)."""
    if args.rw or args.foreground or is_url(args.source):
        return
    from .mount import staged_in
    try:
        pending = staged_in(args.source)
    except TfrfsError:
        return   # the daemon says what is wrong with SOURCE
    if pending:
        print(f"warning: {args.source} has staged edits that a read-only mount does not show "
              f"({', '.join(p.shard for p in pending)}); mount it --rw, or tfrfs commit / tfrfs discard it",
              file=sys.stderr)


# --- verify / inspect ------------------------------------------------------------

def _shard_progress(what: str, shards: int) -> Callable[[Any, int, int], None]:
    """Progress of a command that reads shard after shard: shards done, and the bytes read of the
    one being read."""
    progress = Progress(what)

    def show(shard: Any, done: int, done_bytes: int) -> None:
        if done == shards:
            progress.update(f"{done}/{shards} shards", final=True)
        else:
            progress.update(f"{done}/{shards} shards, {shard.relpath}: {done_bytes / 2**20:,.0f} MiB")
    return show


def _problem_line(shard: str, p: Any) -> str:
    where = f"record {p.index}" if p.index is not None else "stream"
    line = f"{shard}: {where} at offset {p.offset}: {p.reason}"
    if p.compressed_offset is not None:
        line += f" (compressed offset {p.compressed_offset})"
    return line


def cmd_verify(args: argparse.Namespace) -> int:
    from .verify import verify_source
    src = open_args(args)
    try:
        shards = src.discovery.shards
        total = problems = 0
        reports = []
        for report in verify_source(src, records=args.records, progress=_shard_progress("verifying", len(shards))):
            total += report.records
            problems += len(report.problems)
            if args.json:
                reports.append(report.as_json())
            for p in report.problems if not args.json else ():
                print(_problem_line(report.shard.relpath, p), flush=True)
    finally:
        src.close()
    if args.json:
        print(json.dumps({"shards": reports, "records": total, "problems": problems}, indent=1, ensure_ascii=False))
    else:
        print(f"{len(shards)} shards, {total:,} records checked, {problems} problem(s)")
    return EXIT_PROBLEMS if problems else EXIT_OK


def cmd_repair(args: argparse.Namespace) -> int:
    from .repair import repair_source
    from .tfrecord import OVERHEAD
    src = open_args(args)
    failed = repaired = 0
    try:
        shards = src.discovery.shards
        results = repair_source(src, backup=not args.no_backup, dry_run=args.dry_run,
                                progress=_shard_progress("checking", len(shards)))
        for r in results:
            rel = r.shard.relpath
            for p in r.report.problems:
                if p.index not in r.report.unparsable:
                    print(_problem_line(rel, p))
            dropped = [f"record {i} (bytes {o}..{o + n + OVERHEAD})" for i, o, n in r.dropped_records]
            dropped += [f"bytes {a}..{b}" for a, b in r.dropped_ranges if b > a]
            if r.compressed_tail:
                a, b = r.compressed_tail
                dropped.append(f"compressed bytes {a}..{b} (do not inflate)" if b > a else
                               f"nothing more: the compressed stream is cut short at byte {a}")
            if r.error:
                failed += 1
                print(f"{rel}: NOT repaired: {r.error}", file=sys.stderr)
                continue
            repaired += 1
            verb = "would keep" if args.dry_run else "repaired: kept"
            print(f"{rel}: {verb} {r.kept:,} records; dropped {', '.join(dropped) or 'nothing'}")
            if r.backup:
                print(f"{rel}: the damaged original is kept as {os.path.relpath(r.backup, src.discovery.root)}")
            for note in r.notes:
                print(f"{rel}: {note}")
    finally:
        src.close()
    what = "damaged shard(s) found" if args.dry_run else "shard(s) repaired"
    print(f"{len(shards)} shards checked, {repaired} {what}" + (f", {failed} could not be" if failed else ""))
    return EXIT_PROBLEMS if failed else EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    from .mount import open_mount
    src, indexes, cache = open_dataset(args)
    m = open_mount(src, records=args.records, decode_raw=not args.no_decode_raw, indexed=(indexes, cache))
    try:
        schema = m.tree.schema.summary()
        problems = len(m.tree.errors)
    finally:
        m.close()
    if args.json:
        print(json.dumps(schema, indent=2, ensure_ascii=False))
        return EXIT_OK
    rows = [(s["shard"], s["compression"], s["kind"], f"{s['records']:,}") for s in schema["shards"]]
    _table(("shard", "compression", "records as", "count"), rows)
    print(f"\n{len(rows)} shards, {sum(s['records'] for s in schema['shards']):,} records\n")
    for section in ("features", "feature_lists"):
        feats = schema.get(section)
        if not feats:
            continue
        frows = [(k, _kind_words(v["kind"]), f"{v['records']:,}", f"{v['min_values']}..{v['max_values']}",
                  " ".join(v["shown_as"])) for k, v in sorted(feats.items())]
        _table((section[:-1] if section == "features" else "feature list", "kind", "records", "values",
                "shown as"), frows)
        print()
    damaged = [i for i in indexes if i.problems]
    for idx in damaged[:20]:
        first = idx.problems[0]
        more = f" (and {len(idx.problems) - 1} more)" if len(idx.problems) > 1 else ""
        print(f"damaged: {_problem_line(idx.shard.relpath, first)}{more}")
    if len(damaged) > 20:
        print(f"damaged: {len(damaged) - 20} more shard(s)")
    if problems:
        print(f"{problems} problem(s) found; run `tfrfs verify {args.source}` for details "
              f"and `tfrfs repair` to rewrite damaged shards")
    return EXIT_OK


def _kind_words(kind: str | None | list[str | None]) -> str:
    """A feature's kinds as schema.json gives them (one, or a list, most records first), in words:
    ``bytes_list or none`` (none: a feature with no kind)."""
    kinds = kind if isinstance(kind, list) else [kind]
    return " or ".join(k or "none" for k in kinds)


def cmd_index(args: argparse.Namespace) -> int:
    from .sources import ship_indexes
    started = time.monotonic()
    src, indexes, cache = open_dataset(args)
    try:
        write = args.beside or args.out_dir or args.format == "dali"
        shipped = ship_indexes(src, indexes, cache, fmt=args.format, out_dir=args.out_dir) if write else []
    finally:
        src.close()
    for s in shipped:
        if s.skipped:
            print(f"{s.shard}: no index file written: {s.skipped}", file=sys.stderr)
    records = sum(i.count for i in indexes)
    problems = sum(len(i.problems) for i in indexes)
    reused = len(indexes) - cache.scans
    print(f"{len(indexes)} shards, {records:,} records indexed in {time.monotonic() - started:.1f}s "
          f"({cache.scans} scanned, {reused} from the cache or index files)")
    written = [s for s in shipped if s.path]
    if written:
        where = args.out_dir or "beside the shards"
        print(f"wrote {len(written)} {args.format} index file(s) {where}")
    if problems:
        print(f"{problems} problem(s) found; run `tfrfs verify {args.source}` for details", file=sys.stderr)
    return EXIT_PROBLEMS if problems or any(s.skipped for s in shipped) else EXIT_OK


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for row in (header, *rows):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())


# --- parser ------------------------------------------------------------------------

def _size(text: str) -> int:
    """A size in bytes: a whole number with an optional K, M, G or T (powers of 1024)."""
    try:
        return options.size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
  log=FILE, poll_us=N, debug, foreground
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
    parser = argparse.ArgumentParser(
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
                                   "is written anew (temporary file, fsync, check, rename). On failure the old "
                                   "shards and the staged edits stay as they were; exit status 1. A SOURCE "
                                   "mounted writable is refused (exit 2): commit its mount point.")
    p.add_argument("target", metavar="MOUNTPOINT|SOURCE")
    p.add_argument("--cache-dir", metavar="DIR", help="where indexes are kept (SOURCE only; default: "
                                                      "$XDG_CACHE_HOME/tfrfs or ~/.cache/tfrfs)")
    p.set_defaults(func=cmd_commit)

    p = sub.add_parser("status", help="list staged edits",
                       description="List what is staged for a writable mount (MOUNTPOINT) or for a source "
                                   "(SOURCE), per shard, and a mount's last refused writes with their reasons. "
                                   "Says so when a mount's daemon is gone, and how to clean up.")
    p.add_argument("target", metavar="MOUNTPOINT|SOURCE")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("discard", help="drop every staged edit of SOURCE",
                       description="Drop every staged edit of SOURCE, and the scratch files made in its records. "
                                   "Refused while SOURCE is mounted writable (use tfrfs umount --discard).")
    p.add_argument("source", metavar="SOURCE")
    p.set_defaults(func=cmd_discard)

    p = sub.add_parser("verify", help="check every checksum and parse, without mounting",
                       description="Check every record of SOURCE: framing, checksums and parsing. "
                                   "Prints each problem; exit status 1 if there are any.")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--records", choices=("example", "sequence", "raw"), help="check records as this kind")
    p.add_argument("--json", action="store_true",
                   help="print one JSON document: per shard its records, kind and problems")
    _add_source_options(p, index_dir=False)
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("repair", help="rewrite damaged shards with every record that can be saved",
                       description="Check every shard of SOURCE (a local folder, shard or glob) and rewrite "
                                   "each damaged one with every record whose checksums hold, in order and "
                                   "byte for byte, by the commit's crash-safe path. The damaged original is "
                                   "kept as .tfrfs-damaged/NAME beside it (never shown in a mount). Prints "
                                   "what was dropped. Refused while SOURCE is mounted writable. Exit status "
                                   "0 when every damaged shard was repaired, 1 when one could not be.")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--no-backup", action="store_true", help="do not keep the damaged originals")
    p.add_argument("--dry-run", action="store_true", help="say what would be dropped; change nothing")
    p.set_defaults(func=cmd_repair)

    p = sub.add_parser("inspect", help="list shards, record counts and the schema, without mounting",
                       description="Print SOURCE's shards, record counts and feature schema.")
    p.add_argument("source", metavar="SOURCE")
    _add_read_options(p)
    _add_source_options(p)
    p.add_argument("--json", action="store_true", help="print the schema as JSON (as .tfrfs/schema.json)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("index", help="index SOURCE's shards, and ship the indexes beside them",
                       description="Index every shard of SOURCE into the local cache (reusing index files "
                                   "found beside the shards or in --index-dir when they match). With --beside, "
                                   "write each shard's index next to it (NAME.tfrfs-idx: small, with the "
                                   "shard's size and identity inside), so that every later mount of the "
                                   "dataset, anywhere, needs no scan. --format dali writes the `OFFSET LENGTH` "
                                   "text indexes of DALI's tfrecord2idx and the tfrecord package instead "
                                   "(NAME.idx; uncompressed shards only).")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--beside", action="store_true", help="write each shard's index file next to the shard")
    p.add_argument("--format", choices=("tfrfs", "dali"), default="tfrfs",
                   help="index file format to write (default tfrfs; dali implies writing them)")
    p.add_argument("--out-dir", metavar="DIR", help="write the index files into DIR (the source's folders mirrored) instead of beside the shards; mount with --index-dir DIR to use them")
    _add_source_options(p)
    p.set_defaults(func=cmd_index)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = _mount_without_command(list(sys.argv[1:] if argv is None else argv), parser)
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


if __name__ == "__main__":
    sys.exit(main())
