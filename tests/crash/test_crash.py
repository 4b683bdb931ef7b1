"""Crash safety, proven (SPEC 7, Durability and Commit).

1. In process, no FUSE: at every write, fsync, rename and unlink that a commit, and that each
   staging call, makes (``durable.fault_hook``), either the step fails with EIO, or a forked "daemon"
   dies right there (``os._exit``: no handler or ``finally`` runs, as with ``kill -9``). Then the
   next mount is assembled as ``tfrfs mount --rw`` does (``open_mount``: lock, load, recover, load,
   record store, tree, editors) and we check: every shard file is wholly old or wholly new, every staged change is still staged until
   its shard is replaced, no temporary file survives, the mount shows the state before or after the
   interrupted call, and committing writes exactly the records the mount shows.
2. ``kill -9`` of the real daemon after closed writes, then a new mount.
3. A commit on a full (small tmpfs) disk.
4. A second --rw mount, and ``tfrfs discard``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tfrfs.storage import durable
from tfrfs.format import proto
from tfrfs.edit import repack
from tfrfs.format import tfrecord
from tfrfs.index.discovery import STAGING_DIR
from tfrfs.edit.journal import INTENT, Staging, shard_id

from conftest import force_unmount, is_mounted, run_tfrfs
from inprocess import Session
from support import reference
from support.daemons import daemon_pid, wait_gone
from support.files import disk_files, tmpfs

NONE, GZIP, ZLIB = tfrecord.NONE, tfrecord.GZIP, tfrecord.ZLIB

# relpath, compression, records
SHARDS = (
    ("a.tfrecord", NONE, 6),
    ("b.tfrecord.gz", GZIP, 5),
    ("d.tfrecord", NONE, 2),
    ("e.tfrecord.zlib", ZLIB, 4),
    ("sub/c.tfrecord", NONE, 4),
)


# --- the dataset ------------------------------------------------------------------------------

def example(i: int, blob: int = 40) -> bytes:
    ex = proto.Example()
    f = ex.features.feature
    f["label"].int64_list.value.append(i)
    f["score"].float_list.value.append(i / 4)
    f["name"].bytes_list.value.append(f"record {i}".encode())
    f["image/encoded"].bytes_list.value.append(bytes((i * 7 + k) % 251 for k in range(blob)))
    return ex.SerializeToString(deterministic=True)


def write_shard(path: Path, compression: str, records: list[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        w = tfrecord.StreamWriter(f, compression)
        for r in records:
            w.write(r)
        w.close()


def build_dataset(root: Path) -> dict[str, list[bytes]]:
    out = {}
    for n, (rel, comp, count) in enumerate(SHARDS):
        records = [example(100 * n + i) for i in range(count)]
        write_shard(root / rel, comp, records)
        out[rel] = records
    (root / "README.txt").write_text("not a shard\n")
    return out


def shard_records(path: Path) -> list[bytes]:
    """A shard's records, read by the test suite's own reader: it must be whole."""
    return reference.written_records(path)


def disk_shard_records(root: Path) -> dict[str, list[bytes]]:
    return {rel: shard_records(root / rel) for rel in disk_files(root) if rel != "README.txt"}


def journal(root: Path) -> dict[str, dict]:
    """The staged changes on disk, as a fresh process would load them (no lock needed to read)."""
    st = Staging(root)
    out = {}
    for rel, ch in st.load().items():
        out[rel] = {"new": ch.new, "removed": ch.removed, "compression": ch.compression, "kind": ch.kind,
                    "edited": {i: st.get_edit(ch, i) for i in sorted(ch.edited)},
                    "deleted": sorted(ch.deleted),
                    "added": {name: st.get_added(ch, name) for name in ch.added_names()}}
    return out


def strays(root: Path) -> list[str]:
    """Temporary files that recovery should have removed."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            full = Path(dirpath) / name
            if name.startswith(repack.TMP_PREFIX) or (STAGING_DIR in full.parts and name.startswith(".tmp-")):
                found.append(str(full.relative_to(root)))
    tmp = root / STAGING_DIR / "tmp"
    if tmp.is_dir():
        found += [f"{STAGING_DIR}/tmp/{n}" for n in os.listdir(tmp)]
    return sorted(found)


def has_scratch(root: Path, relpath: str) -> bool:
    return (root / STAGING_DIR / "scratch" / shard_id(relpath)).exists()


class InjectedFault(OSError):
    def __init__(self, op: str, path: str) -> None:
        super().__init__(errno.EIO, f"injected fault at {op} {path}")


class Faults:
    """``durable.fault_hook``: counts durable calls, and raises at the ``at``-th one."""

    def __init__(self, at: int | None = None) -> None:
        self.at = at
        self.calls: list[tuple[str, str]] = []
        self.fired: tuple[str, str] | None = None

    def __call__(self, op: str, path: str) -> None:
        self.calls.append((op, path))
        if self.at is not None and len(self.calls) == self.at:
            self.fired = (op, path)
            raise InjectedFault(op, path)


CRASHED = 86


def crash_at(n: int, root: Path, cache: Path, work: Callable[[Session, list[int]], None]) -> dict:
    """Run ``work`` on a mount of ``root`` in a forked child that dies at its ``n``-th durable call:
    ``os._exit`` before the call, so no exception handler or ``finally`` runs, as with ``kill -9``.
    ``work`` counts the calls it finished in its list; returns that count and the call it died at."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: never returns into pytest
        code = 3
        try:
            os.close(r)
            s = Session(root, cache)
            progress = [0]
            count = [0]

            def die(op: str, path: str) -> None:
                count[0] += 1
                if count[0] == n:
                    os.write(w, json.dumps({"done": progress[0], "at": [op, path]}).encode())
                    os._exit(CRASHED)

            durable.fault_hook = die
            work(s, progress)
            os.write(w, json.dumps({"done": progress[0], "at": None}).encode())
            code = 0
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        report = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), status
    info = json.loads(report) if report else {}
    info["status"] = os.WEXITSTATUS(status)
    assert info["status"] in (0, CRASHED), f"the child failed before the fault: {info}"
    return info


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int | None], Faults]]:
    """Installs a ``Faults`` hook. The in-process tests simulate crashes and I/O errors, not power
    loss, so the fsyncs themselves (each still passing through the hook) are made free: thousands of
    them run here."""
    monkeypatch.setattr(durable.os, "fsync", lambda fd: None)

    def install(at: int | None = None) -> Faults:
        f = Faults(at)
        durable.fault_hook = f
        return f
    try:
        yield install
    finally:
        durable.fault_hook = None


def caused_by_fault(exc: BaseException) -> bool:
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 20:
        if isinstance(e, InjectedFault):
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


def copy_source(template: Path, dest: Path) -> Path:
    shutil.copytree(template, dest, symlinks=True)
    return dest


# --- 1a. faults during commit --------------------------------------------------------------------

def stage_commit_edits(s: Session) -> None:
    """One change of every kind, across every compression."""
    s.write("/a.tfrecord/000001/label.json", b"[101, 102]\n")
    s.create("/a.tfrecord/000002/.label.json.swp")            # an editor's swap file: scratch
    s.write("/a.tfrecord/000002/.label.json.swp", b"swap")
    s.rm_r("/a.tfrecord/000003")
    s.mkdir("/a.tfrecord/zz-added")
    s.write("/a.tfrecord/zz-added/label.json", b"[7]\n")
    s.write("/a.tfrecord/zz-added/note.txt", b"hello")
    s.write("/b.tfrecord.gz/000000/name.txt", b"renamed in gzip")
    s.rm_r("/b.tfrecord.gz/000004")
    s.mkdir("/e.tfrecord.zlib/added")
    s.write("/e.tfrecord.zlib/added/score.json", b"[0.5]\n")
    s.write("/e.tfrecord.zlib/000002/label.json", b"[-3]\n")
    s.rm_r("/d.tfrecord")                      # a whole shard removed
    s.mkdir("/sub/new.tfrecord")               # a new shard
    s.mkdir("/sub/new.tfrecord/r0")
    s.write("/sub/new.tfrecord/r0/label.json", b"[1, 2, 3]\n")


@pytest.fixture(scope="module")
def commit_case(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A source with edits staged, and what a clean commit of it makes."""
    base = tmp_path_factory.mktemp("commit-case")
    cache = base / "cache"
    template = base / "template"
    original = build_dataset(template)
    s = Session(template, cache)
    stage_commit_edits(s)
    expected_records = s.records()
    s.close()
    clean = copy_source(template, base / "clean")
    s = Session(clean, cache)
    s.commit()
    s.close()
    case = {"base": base, "cache": cache, "template": template, "original": original,
            "old_files": disk_files(template), "new_files": disk_files(clean), "staged": journal(template),
            "expected_records": expected_records}
    # The clean commit is what the mount showed, and every change was staged.
    assert disk_shard_records(clean) == expected_records
    assert journal(clean) == {} and strays(clean) == []
    assert has_scratch(template, "a.tfrecord") and not has_scratch(clean, "a.tfrecord")
    assert set(case["staged"]) == {"a.tfrecord", "b.tfrecord.gz", "d.tfrecord", "e.tfrecord.zlib",
                                   "sub/new.tfrecord"}
    assert case["new_files"]["sub/c.tfrecord"] == case["old_files"]["sub/c.tfrecord"]
    assert "d.tfrecord" not in case["new_files"]
    return case


def _count_commit_calls(case: dict, dest: Path, faults) -> list[tuple[str, str]]:
    copy_source(case["template"], dest)
    s = Session(dest, case["cache"])
    counter = faults(None)
    s.commit()
    durable.fault_hook = None
    s.close()
    assert disk_files(dest) == case["new_files"]
    return counter.calls


def check_after_recovery(case: dict, root: Path, s: Session, where: str = "") -> None:
    """Each shard wholly old or wholly new; staged changes kept exactly until their shard is new."""
    old, new, staged = case["old_files"], case["new_files"], case["staged"]
    now = disk_files(root)
    assert set(now) <= set(old) | set(new), f"{where}: unexpected files: {set(now) - set(old) - set(new)}"
    assert strays(root) == [], where
    current = journal(root)
    for rel in sorted(set(old) | set(new)):
        got = now.get(rel)
        is_old, is_new = got == old.get(rel), got == new.get(rel)
        assert is_old or is_new, f"{where}: {rel} is neither the old nor the new shard"
        if rel not in staged:
            assert is_old and is_new, where
            continue
        if is_new:
            assert rel not in current, f"{where}: {rel} was committed but its edits are still staged"
            # Scratch files of records a commit renumbered would turn up in other records.
            assert not has_scratch(root, rel), f"{where}: {rel} was committed but its scratch files are left"
        else:
            assert current.get(rel) == staged[rel], f"{where}: {rel} is still old but its staged changes changed"
    assert set(current) <= set(staged), where
    # The mount shows the same records as before the commit (renumbered where committed).
    assert s.records() == case["expected_records"], where


def test_commit_counts_every_durable_step(commit_case: dict, faults, tmp_path: Path) -> None:
    calls = _count_commit_calls(commit_case, tmp_path / "count", faults)
    ops = {op for op, _ in calls}
    assert ops == {"write", "fsync", "rename", "unlink"}, ops
    # Every changed shard went through tmp write, fsync, marker, rename, folder fsync.
    renamed = {os.path.basename(p) for op, p in calls if op == "rename"}
    assert {"a.tfrecord", "b.tfrecord.gz", "e.tfrecord.zlib", "new.tfrecord", "committing"} <= renamed
    assert any(op == "unlink" and p.endswith("d.tfrecord") for op, p in calls)


@pytest.mark.parametrize("mode", ["crash", "error", "retry"])
def test_fault_at_every_commit_step(commit_case: dict, faults, tmp_path: Path, monkeypatch, mode: str) -> None:
    """crash: the daemon dies (os._exit) at the step; the next mount recovers.
    error: the step fails with EIO; the commit reports it and the same mount still shows every
    change; the daemon then stops and the next mount recovers.
    retry: as error, then the same mount commits again and finishes the job."""
    monkeypatch.setattr(repack, "COPY_CHUNK", 256)   # several writes per copied run
    case = commit_case
    total = len(_count_commit_calls(case, tmp_path / "count", faults))
    assert total > 40
    for n in range(1, total + 1):
        root = copy_source(case["template"], tmp_path / f"f{n}")
        if mode == "crash":
            info = crash_at(n, root, case["cache"], lambda s, progress: s.commit())
            assert info["status"] == CRASHED, info
            where = f"crash {n}/{total} at {info['at']}"
            s = Session(root, case["cache"])     # the next mount: lock, recover
            check_after_recovery(case, root, s, where)
            s.commit()
            s.close()
        else:
            s = Session(root, case["cache"])
            hook = faults(n)
            failure: BaseException | None = None
            try:
                s.commit()
            except OSError as exc:
                failure = exc
            finally:
                durable.fault_hook = None
            where = f"fault {n}/{total} at {hook.fired}"
            assert hook.fired is not None, where
            if failure is not None:
                assert caused_by_fault(failure), f"{where}: {failure!r}"
                assert isinstance(failure, repack.CommitFailed), f"{where}: {failure!r}"
                msg = str(failure)
                assert "\n" not in msg and msg.startswith("commit of ") and " failed: " in msg, msg
                assert "stay staged" in msg, msg
                assert s.mount.last_commit is not None and s.mount.last_commit.error == msg, where
            else:
                # Only clearing the journal of an already replaced shard may fail without failing the commit.
                op, path = hook.fired
                assert f"/{STAGING_DIR}/" in path and op in ("rename", "fsync"), where
            # The running mount still shows every change, and lists what is still staged.
            assert s.records() == case["expected_records"], where
            pending = set(s.pending())
            assert set(journal(root)) >= pending, where
            if failure is not None:
                failed = str(failure).split()[2]
                assert failed in pending, where
                if "old shard is unchanged" in str(failure):
                    assert disk_files(root).get(failed) == case["old_files"].get(failed), where
                    # ... and nothing is left that would block editing it.
                    assert not s.staging.committing_path(s.staging.shards[failed]).exists(), where
            if mode == "retry":
                if failure is not None:
                    s.commit()
                assert s.pending() == [], where
                s.close()
                assert disk_files(root) == case["new_files"], where
            else:
                s.close()
                s = Session(root, case["cache"])     # the next mount: lock, recover
                check_after_recovery(case, root, s, where)
                s.commit()
                s.close()
        s = Session(root, case["cache"])
        assert s.pending() == [], where
        s.close()
        assert disk_files(root) == case["new_files"], where
        assert journal(root) == {} and strays(root) == [], where
        assert not has_scratch(root, "a.tfrecord"), where
        shutil.rmtree(root)


@pytest.mark.parametrize("at", ["write", "rename"])
def test_failed_commit_keeps_old_shard_and_edits(at: str, commit_case: dict, faults, tmp_path: Path) -> None:
    """An I/O error writing the first shard's new file, or renaming it over the old one: nothing
    changes on disk, everything stays staged, and the shard can still be edited and committed."""
    case = commit_case
    root = copy_source(case["template"], tmp_path / "src")
    s = Session(root, case["cache"])
    calls = _count_commit_calls(case, tmp_path / "count", faults)
    n = 1 if at == "write" else calls.index(("rename", str(tmp_path / "count" / "a.tfrecord"))) + 1
    hook = faults(n)
    with pytest.raises(repack.CommitFailed) as exc:
        s.commit()
    durable.fault_hook = None
    assert hook.fired is not None and hook.fired[0] == at
    if at == "rename":
        assert hook.fired[1] == str(root / "a.tfrecord")
    assert str(exc.value).startswith("commit of a.tfrecord failed: ")
    assert "old shard is unchanged" in str(exc.value)
    assert exc.value.errno == errno.EIO
    assert disk_files(root) == case["old_files"]
    assert journal(root) == case["staged"]
    assert strays(root) == []
    assert s.mount.last_commit is not None and not s.mount.last_commit.ok and "a.tfrecord" in s.mount.last_commit.error
    # Still editable: the failed commit left nothing that blocks the shard.
    s.write("/a.tfrecord/000000/label.json", b"[55]\n")
    s.commit()
    s.close()
    assert feature(shard_records(root / "a.tfrecord")[0], "label") == [55]


def test_edits_after_an_unsettled_commit_are_not_lost(commit_case: dict, faults, tmp_path: Path) -> None:
    """The folder fsync after a shard's rename fails: the new file is in place but not known durable.
    A change to that shard before a successful commit would be dropped by recovery along with the
    committed journal, so it is refused; committing again settles the shard and edits work again."""
    case = commit_case
    root = copy_source(case["template"], tmp_path / "src")
    s = Session(root, case["cache"])

    class AfterRename(Faults):
        def __call__(self, op: str, path: str) -> None:
            self.calls.append((op, path))
            if op == "fsync" and path == str(root) and self.fired is None \
                    and ("rename", str(root / "a.tfrecord")) in self.calls:
                self.fired = (op, path)
                raise InjectedFault(op, path)

    durable.fault_hook = hook = AfterRename()
    with pytest.raises(repack.CommitFailed) as exc:
        s.commit()
    durable.fault_hook = None
    assert hook.fired
    assert "a.tfrecord" in str(exc.value) and "stay staged" in str(exc.value)
    assert disk_files(root)["a.tfrecord"] == case["new_files"]["a.tfrecord"]
    assert s.records() == case["expected_records"]
    with pytest.raises(OSError, match="commit again") as refused:
        s.write("/a.tfrecord/000000/label.json", b"[66]\n")
    assert refused.value.errno == errno.EBUSY
    assert s.records() == case["expected_records"]
    s.commit()
    s.write("/a.tfrecord/000000/label.json", b"[66]\n")
    s.close()
    s = Session(root, case["cache"])          # a crash now loses nothing
    assert json.loads(s.view()["/a.tfrecord/000000/label.json"]) == [66]
    s.commit()
    s.close()
    assert feature(shard_records(root / "a.tfrecord")[0], "label") == [66]


# --- 1b. faults during staging -------------------------------------------------------------------

def _staging_template(base: Path, cache: Path) -> Path:
    template = base / "template"
    build_dataset(template)
    s = Session(template, cache)
    # Changes staged earlier, which no later fault may lose.
    s.write("/a.tfrecord/000000/name.txt", b"staged earlier")
    s.mkdir("/b.tfrecord.gz/early")
    s.write("/b.tfrecord.gz/early/label.json", b"[9]\n")
    s.close()
    return template


def _script(name: str, s: Session) -> list[tuple]:
    """System calls of one scenario; each must be all or nothing."""
    if name == "edit-features":
        return [("write", "/a.tfrecord/000002/label.json", b"[5, 6]\n"),
                ("write", "/a.tfrecord/000000/name.txt", b"staged again"),          # over a staged edit
                ("write", "/b.tfrecord.gz/000001/score.json", b"[2.5]\n"),
                ("write", "/b.tfrecord.gz/000003/extra.json", b"[1.5, 2]\n"),       # a new feature
                ("unlink", "/e.tfrecord.zlib/000001/image/encoded.bin"),           # keeps image/
                ("rmdir", "/e.tfrecord.zlib/000001/image"),
                ("rename", "/sub/c.tfrecord/000002/label.json", "/sub/c.tfrecord/000002/target.json")]
    if name == "records":
        return ([("mkdir", "/a.tfrecord/new-rec"),
                 ("write", "/a.tfrecord/new-rec/label.json", b"[42]\n"),
                 ("write", "/b.tfrecord.gz/early/label.json", b"[10]\n"),           # an added record again
                 ("mkdir", "/a.tfrecord/new-rec/folder"),
                 ("write", "/a.tfrecord/new-rec/folder/x.txt", b"x")]
                + s.rm_r_calls("/a.tfrecord/000000")                               # edited, then deleted
                + s.rm_r_calls("/b.tfrecord.gz/early"))                            # an added record
    if name == "shards":
        return ([("mkdir", "/sub/new.tfrecord"),
                 ("mkdir", "/sub/new.tfrecord/r0"),
                 ("write", "/sub/new.tfrecord/r0/label.json", b"[1]\n")]
                + s.rm_r_calls("/d.tfrecord")
                + [("mkdir", "/d.tfrecord")])                                      # removed, made again
    if name == "scratch":
        # Scratch files are plain files: creating one and writing it are separate calls.
        return [("create", "/a.tfrecord/000004/.label.json.swp"),
                ("write", "/a.tfrecord/000004/.label.json.swp", b"swap"),
                ("rename", "/a.tfrecord/000004/label.json", "/a.tfrecord/000004/label.json~"),
                ("write", "/a.tfrecord/000004/label.json", b"[4, 4]\n"),
                ("rename", "/a.tfrecord/000004/label.json~", "/a.tfrecord/000004/label.json")]  # backup restored
    if name == "rename-in-record":
        r = "/a.tfrecord/000001"
        image = "/a.tfrecord/000002/image"
        encoded = f"{image}/" + next(n for n, _ in s.tree.names(s.tree.lookup(image)))   # its suffix: by its value
        return [("create", f"{r}/sedAb12Cd"),                    # sed -i: its temp file over the feature
                ("write", f"{r}/sedAb12Cd", b"[8]\n"),
                ("rename", f"{r}/sedAb12Cd", f"{r}/label.json"),
                ("mkdir", f"{r}/notes"),                                       # a folder of scratch files only
                ("create", f"{r}/notes/.n.swp"),
                ("write", f"{r}/notes/.n.swp", b"n"),
                ("rename", f"{r}/notes", f"{r}/notes2"),
                ("create", f"{r}/image/.x.swp"),                               # features and a scratch file
                ("write", f"{r}/image/.x.swp", b"x"),
                ("rename", f"{r}/image", f"{r}/picture"),
                ("rename", encoded, encoded + "~")]                                # in a folder
    if name == "large-values":
        # Values staged from their temporary files (largevalue): a new one, one over it, a text
        # value (its newline rule) in a compressed shard, one in an added record.
        big = bytes(range(256)) * 5000
        return [("write", "/a.tfrecord/000002/blob.bin", big),
                ("write", "/a.tfrecord/000002/blob.bin", big[::-1] + b"more"),
                ("write", "/b.tfrecord.gz/000001/notes.txt", b"a line\n" * 200_000),
                ("mkdir", "/a.tfrecord/big-rec"),
                ("write", "/a.tfrecord/big-rec/blob.bin", big[7:])]
    if name == "move-record":
        return [("rename", "/a.tfrecord/000005", "/sub/c.tfrecord/moved")]
    if name == "move-records":
        return ([("mkdir", "/a.tfrecord/new"),                                  # an added record, with a scratch file
                 ("write", "/a.tfrecord/new/label.json", b"[1]\n"),
                 ("create", "/a.tfrecord/new/.label.json.swp"),
                 ("write", "/a.tfrecord/new/.label.json.swp", b"swap"),
                 ("rename", "/a.tfrecord/new", "/sub/c.tfrecord/new2"),
                 ("rename", "/a.tfrecord/000002", "/a.tfrecord/renamed"),           # within its shard
                 ("rename", "/b.tfrecord.gz/early", "/b.tfrecord.gz/early2"),       # added by an earlier mount
                 ("mkdir", "/sub/c.tfrecord/empty"),                                # over an empty added record
                 ("rename", "/a.tfrecord/000003", "/sub/c.tfrecord/empty"),
                 ("write", "/a.tfrecord/000004/label.json", b"[44]\n"),             # edited, with a user folder
                 ("mkdir", "/a.tfrecord/000004/mine"),
                 ("rename", "/a.tfrecord/000004", "/e.tfrecord.zlib/x")]
                + [c for c in s.rm_r_calls("/d.tfrecord/000000") if c[0] == "unlink"]
                + [("rename", "/a.tfrecord/000005", "/d.tfrecord/000000")])         # over an emptied original one
    raise AssertionError(name)


def run_staging_faults(name: str, tmp_path: Path, faults, *, live_is_next_mount: bool = False) -> None:
    cache = tmp_path / "cache"
    template = _staging_template(tmp_path, cache)
    s = Session(template, cache)
    calls = _script(name, s)
    s.close()
    # A clean run: the view after every call, and how many durable calls each makes.
    root = copy_source(template, tmp_path / "clean")
    s = Session(root, cache)
    states = [s.view()]
    counts = []
    for call in calls:
        counter = faults(None)
        s.do(call)
        durable.fault_hook = None
        counts.append(len(counter.calls))
        states.append(s.view())
    s.close()
    assert all(c > 0 for c in counts), list(zip(calls, counts))
    total = sum(counts)
    def run(s: Session, progress: list[int]) -> None:
        for call in calls:
            s.do(call)
            progress[0] += 1

    for n in range(1, total + 1):
        # The daemon killed at the n-th durable step.
        root = copy_source(template, tmp_path / f"c{n}")
        info = crash_at(n, root, cache, run)
        assert info["status"] == CRASHED, info
        where = f"crash {n}/{total} at {info['at']} during {calls[info['done']][:2]}"
        check_next_mount(root, cache, states[info["done"]:info["done"] + 2], where)
        # The n-th durable step fails with EIO; the mount goes on, then stops.
        root = copy_source(template, tmp_path / f"f{n}")
        s = Session(root, cache)
        hook = faults(n)
        done = 0
        try:
            for call in calls:
                s.do(call)
                done += 1
        except OSError as exc:
            assert caused_by_fault(exc), f"fault {n}: {exc!r}"
        finally:
            durable.fault_hook = None
        where = f"fault {n}/{total} at {hook.fired} during {calls[min(done, len(calls) - 1)][:2]}"
        allowed = states[done:done + 2]
        live = s.view()
        assert live in allowed, where + _diff(live, allowed)
        s.close()
        check_next_mount(root, cache, allowed, where, live if live_is_next_mount else None)


def check_next_mount(root: Path, cache: Path, allowed: list[dict], where: str, live: dict | None = None) -> None:
    """The next mount shows one of the ``allowed`` views, and commits exactly what it shows."""
    s = Session(root, cache)
    assert strays(root) == [], where
    again = s.view()
    assert again in allowed, where + _diff(again, allowed)
    if live is not None:
        assert again == live, where + _diff(again, [live])
    shown = s.records()
    s.commit()
    s.close()
    assert disk_shard_records(root) == shown, where
    assert journal(root) == {} and strays(root) == [], where
    shutil.rmtree(root)


def _diff(got: dict, allowed: list[dict]) -> str:
    lines = []
    for k, want in enumerate(allowed):
        keys = sorted(set(got) | set(want))
        d = [f"  {p}: {want.get(p, '<absent>')!r:.60} -> {got.get(p, '<absent>')!r:.60}"
             for p in keys if got.get(p, b"<absent>") != want.get(p, b"<absent>")]
        lines.append(f"\n vs state {k}:\n" + "\n".join(d[:12]))
    return "".join(lines)


@pytest.mark.parametrize("name", ["edit-features", "records", "shards"])
def test_fault_at_every_staging_step(name: str, tmp_path: Path, faults) -> None:
    run_staging_faults(name, tmp_path, faults)


def test_fault_at_every_step_of_staging_large_values(tmp_path: Path, faults) -> None:
    run_staging_faults("large-values", tmp_path, faults)


def test_running_mount_shows_what_the_next_mount_will(tmp_path: Path, faults) -> None:
    run_staging_faults("edit-features", tmp_path, faults, live_is_next_mount=True)


def test_fault_at_every_step_of_rename_to_scratch(tmp_path: Path, faults) -> None:
    run_staging_faults("scratch", tmp_path, faults)


def test_fault_at_every_step_of_record_move(tmp_path: Path, faults) -> None:
    run_staging_faults("move-record", tmp_path, faults)


@pytest.mark.parametrize("name", ["rename-in-record", "move-records"])
def test_fault_at_every_step_of_renames(name: str, tmp_path: Path, faults) -> None:
    """Renames that change a record and a scratch file, or two records, are one step each."""
    run_staging_faults(name, tmp_path, faults)


def _intent_published(calls: list[tuple[str, str]]) -> int:
    """How many durable calls it takes to publish the (first) intent: up to its rename."""
    return next(i for i, (op, path) in enumerate(calls, 1) if op == "rename" and path.endswith(f"/{INTENT}"))


MOVE = ("/a.tfrecord/000005", "/sub/c.tfrecord/moved")


def _move_published_at(template: Path, tmp_path: Path, cache: Path, faults) -> int:
    """The durable call at which MOVE publishes its intent, counted on a copy of ``template``."""
    root = copy_source(template, tmp_path / "count")
    s = Session(root, cache)
    counter = faults(None)
    s.rename(*MOVE)
    durable.fault_hook = None
    s.close()
    shutil.rmtree(root)
    return _intent_published(counter.calls)


def test_a_step_failing_twice_is_finished_by_the_next_change(tmp_path: Path, faults) -> None:
    """The intent is published, then its steps fail and fail again: the call reports the error, the
    running mount counts it as done, and the next change (or commit, or mount) puts its files in place."""
    cache = tmp_path / "cache"
    template = _staging_template(tmp_path, cache)
    clean = copy_source(template, tmp_path / "clean")
    s = Session(clean, cache)
    s.rename(*MOVE)
    s.write("/a.tfrecord/000001/label.json", b"[11]\n")
    expected = s.view()
    s.close()

    published = _move_published_at(template, tmp_path, cache, faults)

    for change in ("write", "commit"):
        root = copy_source(template, tmp_path / change)
        s = Session(root, cache)

        class Twice(Faults):
            def __call__(self, op: str, path: str) -> None:
                self.calls.append((op, path))
                if published + 1 < len(self.calls) <= published + 3:   # the first step, and its retry
                    self.fired = (op, path)
                    raise InjectedFault(op, path)

        durable.fault_hook = hook = Twice()
        with pytest.raises(OSError) as exc:
            s.rename(*MOVE)
        durable.fault_hook = None
        assert caused_by_fault(exc.value) and hook.fired
        assert (root / STAGING_DIR / INTENT).exists()
        assert "moved" in dict(s.tree.names(s.tree.lookup("/sub/c.tfrecord")))
        assert "000005" not in dict(s.tree.names(s.tree.lookup("/a.tfrecord")))
        if change == "write":
            s.write("/a.tfrecord/000001/label.json", b"[11]\n")
            assert not (root / STAGING_DIR / INTENT).exists()
            assert s.view() == expected
            s.close()
            check_next_mount(root, cache, [expected], change)
        else:
            s.commit()                     # the shards get all of the move
            assert not (root / STAGING_DIR / INTENT).exists()
            s.write("/a.tfrecord/000001/label.json", b"[11]\n")
            s.commit()
            s.close()
            s = Session(clean, cache)
            s.commit()
            s.close()
            assert disk_shard_records(root) == disk_shard_records(clean)
            assert journal(root) == {} and strays(root) == []


def test_a_damaged_or_torn_intent_is_never_carried_out(tmp_path: Path, faults) -> None:
    """Only a whole intent, published by its rename, counts: a torn one (a .tmp- file) and one that
    does not parse are dropped, with whatever they prepared, and the journal stays as it was."""
    cache = tmp_path / "cache"
    template = _staging_template(tmp_path, cache)
    s = Session(template, cache)
    before = s.view()
    s.close()
    published = _move_published_at(template, tmp_path, cache, faults)
    for case in ("torn", "damaged", "outside"):
        root = copy_source(template, tmp_path / case)
        # The daemon dies just before the intent's rename: its content is whole, beside its name.
        info = crash_at(published, root, cache, lambda s, progress: s.rename(*MOVE))
        assert info["status"] == CRASHED and info["at"][1].endswith(f"/{INTENT}"), info
        staging = root / STAGING_DIR
        torn = [p for p in staging.glob(".tmp-*")]
        assert len(torn) == 1 and json.loads(torn[0].read_bytes())["steps"], torn
        if case == "damaged":
            torn[0].write_bytes(torn[0].read_bytes()[:-7])
            torn[0].rename(staging / INTENT)
        elif case == "outside":
            doc = json.loads(torn[0].read_bytes())
            doc["steps"][0]["dst"] = "../../a.tfrecord"
            torn[0].write_text(json.dumps(doc))
            torn[0].rename(staging / INTENT)
        check_next_mount(root, cache, [before], case)


def test_discard_drops_a_published_intent(tmp_path: Path, faults) -> None:
    """tfrfs discard after a crash that left an intent half done: nothing of it comes back."""
    cache = tmp_path / "cache"
    build_dataset(tmp_path / "template")
    template = tmp_path / "template"
    s = Session(template, cache)
    original = s.view()
    s.close()
    published = _move_published_at(template, tmp_path, cache, faults)
    for extra in (1, 3):     # just published; one step done
        root = copy_source(template, tmp_path / f"d{extra}")
        info = crash_at(published + extra, root, cache, lambda s, progress: s.rename(*MOVE))
        assert info["status"] == CRASHED, info
        assert (root / STAGING_DIR / INTENT).exists()
        proc = run_tfrfs("discard", str(root))
        assert proc.returncode == 0, proc.stderr
        assert journal(root) == {} and not (root / STAGING_DIR / INTENT).exists()
        check_next_mount(root, cache, [original], f"discard after {extra}")


@pytest.mark.parametrize("at", ["rename", "fsync"])
def test_journal_left_by_a_finished_commit(at: str, tmp_path: Path, faults) -> None:
    """Clearing a committed shard's journal fails (at its rename, or the fsync after it): the commit
    stands, the journal left on disk never takes in the shard's next edit, and the next mount
    clears it (a folder half-dropped into staging/tmp does not stop that mount)."""
    cache = tmp_path / "cache"
    root = tmp_path / "src"
    build_dataset(root)
    s = Session(root, cache)
    s.write("/a.tfrecord/000001/label.json", b"[3]\n")

    class AtDrop(Faults):
        def __call__(self, op: str, path: str) -> None:
            self.calls.append((op, path))
            prev = self.calls[-2] if len(self.calls) > 1 else ("", "")
            hit = (op == "rename" and "/tmp/drop-shards-" in path) if at == "rename" else \
                (op == "fsync" and path.endswith("/shards") and "/tmp/drop-shards-" in prev[1])
            if hit and self.fired is None:
                self.fired = (op, path)
                raise InjectedFault(op, path)

    durable.fault_hook = hook = AtDrop()
    s.commit()
    durable.fault_hook = None
    assert hook.fired
    assert s.pending() == []
    assert [feature(r, "label") for r in shard_records(root / "a.tfrecord")][:2] == [[0], [3]]
    left = os.listdir(root / STAGING_DIR / ("shards" if at == "rename" else "tmp"))
    assert left, "the fault should have left the journal behind"
    s.write("/a.tfrecord/000002/label.json", b"[4]\n")
    s.close()
    s = Session(root, cache)              # a crash here must not lose the second edit
    assert s.pending() == ["a.tfrecord"]
    view = s.view()
    assert json.loads(view["/a.tfrecord/000001/label.json"]) == [3]
    assert json.loads(view["/a.tfrecord/000002/label.json"]) == [4]
    s.commit()
    s.close()
    assert [feature(r, "label") for r in shard_records(root / "a.tfrecord")][:3] == [[0], [3], [4]]
    assert strays(root) == [] and journal(root) == {}


def test_staging_memory_matches_disk_after_a_fault(tmp_path: Path, faults) -> None:
    """Whatever step of a staging call fails, the journal in memory (what the running mount shows and
    commits) says what the journal on disk (what the next mount loads) says."""
    def snapshot(shards: dict) -> dict:
        return {rel: (ch.new, ch.removed, sorted(ch.edited), sorted(ch.deleted), sorted(ch.added))
                for rel, ch in shards.items()}

    steps: list[Callable[[Staging], object]] = [
        lambda st: st.shard("a.tfrecord", base={"size": 1, "mtime_ns": 2}),
        lambda st: st.put_edit(st.shards["a.tfrecord"], 1, b"one"),
        lambda st: st.put_edit(st.shards["a.tfrecord"], 2, b"two"),
        lambda st: st.delete_record(st.shards["a.tfrecord"], 1),          # an edited record
        lambda st: st.delete_record(st.shards["a.tfrecord"], 3),
        lambda st: st.put_added(st.shards["a.tfrecord"], "n1", b"added"),
        lambda st: st.put_added(st.shards["a.tfrecord"], "n1", b"added again"),
        lambda st: st.remove_added(st.shards["a.tfrecord"], "n1"),
        lambda st: st.set_removed(st.shards["a.tfrecord"], True),
        lambda st: st.shard("sub/new.tfrecord", new=True),
        lambda st: st.put_added(st.shards["sub/new.tfrecord"], "r", b""),
        lambda st: st.drop_shard("sub/new.tfrecord"),
    ]

    def run(st: Staging) -> None:
        for step in steps:
            step(st)

    root = tmp_path / "clean"
    root.mkdir()
    st = Staging(root)
    st.acquire()
    counter = faults(None)
    run(st)
    durable.fault_hook = None
    st.release()
    total = len(counter.calls)
    assert total > 30
    for n in range(1, total + 1):
        root = tmp_path / f"f{n}"
        root.mkdir()
        st = Staging(root)
        st.acquire()
        hook = faults(n)
        with pytest.raises(OSError) as exc:
            run(st)
        durable.fault_hook = None
        assert caused_by_fault(exc.value)
        assert snapshot(st.shards) == snapshot(Staging(root).load()), f"fault {n}/{total} at {hook.fired}"
        st.release()
        shutil.rmtree(root)


# --- 2-4. the real daemon ------------------------------------------------------------------------

def kill_daemon(mnt: Path) -> None:
    """kill -9 the daemon, then detach its dead mount (fusermount3 -uz)."""
    pid = daemon_pid(mnt)
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid, 4)
    subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
    force_unmount(mnt)
    assert not is_mounted(mnt)


def sh(command: str) -> None:
    subprocess.run(["bash", "-c", command], check=True, timeout=60)


def feature(record: bytes, key: str) -> list:
    """The values of feature ``key`` ([] when the record has no such feature, or an empty one)."""
    return reference.parse_example(record).get(key, (None, []))[1]


def status_lines(target: Path) -> list[str]:
    proc = run_tfrfs("status", str(target), check=True)
    return sorted(proc.stdout.strip().splitlines())


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("tfrfs:")]


@pytest.mark.mount
def test_kill_9_after_closed_writes_loses_nothing(tmp_path: Path, tfrfs_mount) -> None:
    src = tmp_path / "src"
    original = build_dataset(src)
    old_files = disk_files(src)
    mnt = tfrfs_mount(src, "--rw")
    a, b = mnt / "a.tfrecord", mnt / "b.tfrecord.gz"
    sh(f"echo '[99]' > {a}/000001/label.json")
    os.mkdir(a / "newrec")
    sh(f"echo '[5, 6]' > {a}/newrec/x.json && printf hello > {a}/newrec/note.txt")
    sh(f"rm -r {b}/000002")
    sh(f"echo '[1.25]' > {mnt}/sub/c.tfrecord/000000/score.json")
    kill_daemon(mnt)

    assert disk_files(src) == old_files      # nothing committed, nothing lost
    assert status_lines(src) == ["a.tfrecord: 1 edited, 1 added", "b.tfrecord.gz: 1 deleted",
                                 "sub/c.tfrecord: 1 edited"]

    mnt2 = tfrfs_mount(src, "--rw")
    a, b = mnt2 / "a.tfrecord", mnt2 / "b.tfrecord.gz"
    assert json.loads((a / "000001" / "label.json").read_text()) == [99]
    assert json.loads((a / "newrec" / "x.json").read_text()) == [5, 6]
    assert (a / "newrec" / "note.txt").read_bytes() == b"hello"
    assert sorted(os.listdir(b)) == ["000000", "000001", "000003", "000004"]
    assert json.loads((mnt2 / "sub" / "c.tfrecord" / "000000" / "score.json").read_text()) == [1.25]
    assert status_lines(mnt2) == status_lines(src)

    proc = run_tfrfs("umount", str(mnt2))
    assert proc.returncode == 0, proc.stderr
    assert not is_mounted(mnt2)
    recs = shard_records(src / "a.tfrecord")
    assert len(recs) == 7
    assert feature(recs[1], "label") == [99]
    assert recs[0] == original["a.tfrecord"][0] and recs[2:6] == original["a.tfrecord"][2:]
    assert feature(recs[6], "x") == [5, 6] and feature(recs[6], "note") == [b"hello"]
    gz = original["b.tfrecord.gz"]
    assert shard_records(src / "b.tfrecord.gz") == gz[:2] + gz[3:]
    assert feature(shard_records(src / "sub" / "c.tfrecord")[0], "score") == [1.25]
    assert status_lines(src) == ["nothing staged"]
    assert journal(src) == {} and strays(src) == []


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "tmpfs", "2m") as d:
        yield d


@pytest.mark.mount
def test_commit_on_a_full_disk(small_tmpfs: Path, tfrfs_mount, tmp_path: Path) -> None:
    src = small_tmpfs / "ds"
    big = [example(i, blob=5000) for i in range(150)]            # ~750 KB: a rewrite needs as much again
    write_shard(src / "big.tfrecord", NONE, big)
    write_shard(src / "small.tfrecord", NONE, [example(i) for i in range(3)])
    old_big = (src / "big.tfrecord").read_bytes()
    mnt = tfrfs_mount(src, "--rw", mountpoint=tmp_path / "mnt")
    try:
        sh(f"echo '[-1]' > {mnt}/big.tfrecord/000005/label.json")
        st = os.statvfs(small_tmpfs)
        free = st.f_bavail * st.f_frsize
        filler = small_tmpfs / "filler"
        filler.write_bytes(b"\0" * max(0, free - len(old_big) // 2))
        assert os.statvfs(small_tmpfs).f_bavail * st.f_frsize < len(old_big)

        proc = run_tfrfs("commit", str(mnt))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr
        errors = error_lines(proc.stderr)
        assert len(errors) == 1, proc.stderr
        assert "big.tfrecord" in errors[0] and "disk full" in errors[0], errors
        assert (src / "big.tfrecord").read_bytes() == old_big
        assert strays(src) == []
        assert status_lines(mnt) == ["big.tfrecord: 1 edited"]
        assert status_lines(src) == ["big.tfrecord: 1 edited"]
        assert json.loads((mnt / "big.tfrecord" / "000005" / "label.json").read_text()) == [-1]

        proc = run_tfrfs("umount", str(mnt))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        errors = error_lines(proc.stderr)
        assert len(errors) == 1 and "disk full" in errors[0] and "stays mounted" in errors[0], proc.stderr
        assert is_mounted(mnt) and "000005" in os.listdir(mnt / "big.tfrecord")
        assert (src / "big.tfrecord").read_bytes() == old_big
        assert strays(src) == []

        filler.unlink()
        proc = run_tfrfs("commit", str(mnt))
        assert proc.returncode == 0, proc.stderr
        recs = shard_records(src / "big.tfrecord")
        assert feature(recs[5], "label") == [-1]
        assert recs[:5] == big[:5] and recs[6:] == big[6:]
        assert status_lines(mnt) == ["nothing staged"]
        proc = run_tfrfs("umount", str(mnt))
        assert proc.returncode == 0, proc.stderr
        assert strays(src) == [] and journal(src) == {}
    finally:
        if is_mounted(mnt):
            run_tfrfs("umount", str(mnt))
            force_unmount(mnt)


@pytest.mark.mount
def test_one_writable_mount_and_discard(tmp_path: Path, tfrfs_mount) -> None:
    src = tmp_path / "src"
    build_dataset(src)
    old_files = disk_files(src)
    mnt = tfrfs_mount(src, "--rw")
    label = mnt / "a.tfrecord" / "000001" / "label.json"
    original_label = label.read_bytes()

    second = tmp_path / "second"
    second.mkdir()
    proc = run_tfrfs("mount", str(src), str(second), "--rw", "--cache-dir", str(tmp_path / "cache"),
                     "--log", str(tmp_path / "second.log"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = error_lines(proc.stderr)
    assert len(errors) == 1 and "already mounted writable" in errors[0], proc.stderr
    assert not is_mounted(second)

    sh(f"echo '[77]' > {label}")
    sh(f"rm -r {mnt}/b.tfrecord.gz/000000")
    proc = run_tfrfs("discard", str(src))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(error_lines(proc.stderr)) == 1 and "mounted writable" in proc.stderr
    assert json.loads(label.read_text()) == [77]

    kill_daemon(mnt)        # unmounted without committing
    assert status_lines(src) == ["a.tfrecord: 1 edited", "b.tfrecord.gz: 1 deleted"]
    proc = run_tfrfs("discard", str(src))
    assert proc.returncode == 0, proc.stderr
    assert status_lines(src) == ["nothing staged"]
    assert journal(src) == {} and disk_files(src) == old_files

    mnt2 = tfrfs_mount(src, "--rw")
    assert (mnt2 / "a.tfrecord" / "000001" / "label.json").read_bytes() == original_label
    assert "000000" in os.listdir(mnt2 / "b.tfrecord.gz")
    proc = run_tfrfs("umount", str(mnt2))
    assert proc.returncode == 0, proc.stderr
    assert disk_files(src) == old_files
