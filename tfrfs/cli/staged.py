"""Staged edits (SPEC 7): tfrfs umount (commit, or --discard, then unmount), commit, status and
discard, of a mount through its .tfrfs control files or of a source that is not mounted."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any, Callable

from tfrfs.fuse import mounttab
from tfrfs.errors import TfrfsError, UsageError
from tfrfs.storage.factory import is_url
from tfrfs.cli.common import EXIT_OK, EXIT_PROBLEMS, FSTYPE, Progress, index_options, open_args, runner_of


def _fusermount() -> str:
    """libfuse3's fusermount3 where it is installed (it mounted us), else fusermount."""
    return "fusermount3" if shutil.which("fusermount3") else "fusermount"


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
            failure = _with_progress("committing", lambda: _commit_now(mnt))
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
    from tfrfs.fuse.mountrecord import alive
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


def _commit_now(mnt: str) -> str | None:
    """Commit a writable mount's staged edits: ``commit`` written to its ``.tfrfs/commit`` starts
    the commit (the mount keeps answering while it runs), and that file says when it is over
    (``running``, and ``commits`` started so far); None on success, else the reason."""
    before = _read_commit(mnt)
    failure = _control(mnt, b"commit\n")
    if failure is not None:
        return failure
    while True:
        try:
            doc = _commit_state(mnt)
        except (OSError, ValueError) as exc:
            return f"the mount stopped answering while it committed ({exc}; its log says why)"
        if "running" not in doc:
            break   # a daemon that committed inside the write
        if not doc["running"] and (doc.get("commits", 0) > (before or {}).get("commits", 0)
                                   or (before or {}).get("running")):
            break
        time.sleep(0.05)
    if doc.get("ok") is False:
        return str(doc.get("error") or "the commit failed")
    return None


def _read_commit(mnt: str) -> dict | None:
    """A writable mount's ``.tfrfs/commit``, or None when it cannot be read."""
    try:
        return _commit_state(mnt)
    except (OSError, ValueError):
        return None


def _commit_state(mnt: str) -> dict:
    """A writable mount's ``.tfrfs/commit``; OSError or ValueError (what is wrong) when it cannot be read."""
    with open(os.path.join(mnt, ".tfrfs", "commit")) as f:
        text = f.read()
    doc = json.loads(text or "{}")
    if not isinstance(doc, dict):
        raise ValueError(f".tfrfs/commit holds no JSON object: {text[:80]!r}")
    return doc


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
    from tfrfs.fuse import mountrecord
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


def _busy_with(mnt: str) -> str | None:
    """What the daemon at ``mnt`` has been busy with for long, as its request watcher noted it
    (read without asking the mount: a daemon busy with one request answers no other)."""
    from tfrfs.fuse import mountrecord
    busy = mountrecord.read_busy(mnt)
    if busy is None:
        return None
    seconds = max(0.0, time.time() - float(busy["since"]))
    return (f"the daemon has been busy with one request for {seconds:.0f} s: {busy.get('op', '?')} "
            f"{busy.get('path') or ''} (its log shows where it is)")


def _source_of(mnt: str) -> str | None:
    """The source mounted at ``mnt``: from the note its daemon left (see ``mountrecord``), else from
    the file system's name in the mount table when that is a local folder whose staging lock names
    this mount point."""
    from tfrfs.fuse import mountrecord
    from tfrfs.dataset.assembly import source_root
    from tfrfs.edit.journal import Staging
    record = mountrecord.read(mnt)
    if record is not None:
        return record.source
    point = os.path.abspath(mnt)
    for entry in mounttab.entries():
        if entry.point == point and entry.fstype == FSTYPE and os.path.isabs(entry.source):
            try:
                if Staging(source_root(entry.source)).lock.holder().get("mountpoint") == point:
                    return entry.source
            except TfrfsError:
                pass
    return None


def _staged_summary(source: str) -> str:
    from tfrfs.dataset.assembly import staged_in
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
    failure = _with_progress("committing", lambda: _commit_now(target))
    if failure:
        print(f"tfrfs: {failure}", file=sys.stderr)
        return EXIT_PROBLEMS
    _print_commit(_last_commit(target))
    return EXIT_OK


def _commit_source(args: argparse.Namespace) -> int:
    """tfrfs commit SOURCE: a source that is not mounted (after a crash, or a stop by a signal)."""
    from tfrfs.dataset.assembly import commit_source, staged_in, unfinished_commit, writable_holder
    from tfrfs.dataset.sources import index_source
    from tfrfs.edit.repack import CommitFailed
    source = args.target
    holder = writable_holder(source, args.cache_dir)
    if holder:
        where = holder.get("mountpoint") or "MOUNTPOINT"
        raise UsageError(f"{source} is mounted writable" + (f" at {where}" if holder.get("mountpoint") else "")
                         + f": commit it there (tfrfs commit {where})")
    if not staged_in(source, args.cache_dir) and not unfinished_commit(source, args.cache_dir):
        print("nothing staged")
        return EXIT_OK
    args.source = source
    args.rw = True   # a dataset built from nothing has no shard file before its first commit
    # The shards not indexed yet are indexed, and the changed ones written anew, as shard jobs.
    with runner_of(args) as runner:
        options = index_options(args)
        src = open_args(args)
        try:
            # Indexed before the commit's own progress starts (as a mount is, in open_mount).
            indexed = index_source(src, runner=runner, **options)
            result = _with_progress("committing", lambda: commit_source(src, indexed, runner))
        except CommitFailed as exc:
            print(f"tfrfs: {exc}", file=sys.stderr)
            return EXIT_PROBLEMS
        finally:
            src.close()
    _print_commit(result.to_json())
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from tfrfs.dataset.assembly import PendingShard, staged_in
    target = args.target
    if mounttab.fstype_at(target) == FSTYPE:
        state = _daemon_state(target)
        busy = _busy_with(target)
        if state != "serving":
            source = _source_of(target)
            if state == "silent":
                print(f"{target}: its tfrfs daemon does not answer (its log may say why); "
                      + (_staged_summary(source) if source else "its source is not known"))
                if busy:
                    print(busy)
                return EXIT_PROBLEMS
            print(f"{target}: the tfrfs daemon of this mount is gone (the mount is left as \"Transport endpoint "
                  f"is not connected\"); clean up: fusermount3 -u {target}, then tfrfs status, commit or discard "
                  f"{source or 'SOURCE'}")
            if source:
                print(f"staged in {source}:")
                _print_pending(list(staged_in(source)))
            return EXIT_PROBLEMS
        if busy:
            print(busy)
        info = _mount_status(target)
        if info is None:
            from tfrfs.fuse import mountrecord
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
        if info.get("committing"):
            print("a commit is running (changes are refused until it is over)")
        _print_pending([PendingShard(**p) for p in info.get("pending", [])])
        rejected = info.get("rejected", [])
        if rejected:
            print(f"refused writes (the last {len(rejected)}, oldest first; their old values stay):")
            for r in rejected:
                print(f"  {time.strftime('%H:%M:%S', time.localtime(r['time']))}  {r['path']}: {r['reason']}")
        return EXIT_OK
    from tfrfs.dataset.assembly import source_root, writable_holder
    from tfrfs.edit.journal import Staging
    pending = list(staged_in(target, args.cache_dir))
    holder = Staging(source_root(target, args.cache_dir)).lock.holder()
    where = holder.get("mountpoint")
    if where and not writable_holder(target, args.cache_dir) and mounttab.fstype_at(where) == FSTYPE \
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
    from tfrfs.dataset.assembly import discard
    result = discard(args.source, args.cache_dir)
    print(f"discarded the staged edits of {result.shards} shard(s)")
    return EXIT_OK
