"""The commit of a writable mount of a bucket prefix (SPEC 7.1): published through the manifest.

A bucket has no rename, and readers may be reading the old objects: nothing a reader uses is
written over. A commit:

1. looks at the manifest: still the version the mount read (``Base``), or another writer
   committed since and this commit fails (``Conflict``: the edits stay staged; remounting applies
   them to the new version, ``rebase``);
2. writes each changed shard anew into a local file (the jobs of a local commit,
   ``repack.write_job``, reading the old shard from the bucket), checks and indexes it;
3. uploads it as ``OBJECTS/ID/RELPATH`` (ID: this commit's) with its index file beside it, each
   checked against the local file (size, and the store's checksum: ``Storage.upload_checked``);
   a TFDS ``dataset_info.json`` beside them follows as an object of this commit too, and shards an
   earlier commit left away from their paths come back (``bucket_versions.come_home``);
4. writes the new manifest with a conditional write against the version it read: that write is
   the commit. The manifest names, for each shard, the object that holds it (its shown path is
   kept), and the objects the version before named and it does not (``retired``);
5. then: the staged edits of the committed shards are dropped and the mount serves the new
   objects; the objects the base version retired are deleted (a reader of the version before
   it has had a whole commit's time to finish), and uploads of commits that never were (older
   than the base version, named by none).

A crash before step 4 leaves the bucket as it was (the uploads are named by no manifest) and
the edits staged: the next commit writes them again. After step 4, the next mount or commit finds
the manifest ``made_by`` the commit its record names (``RECORD`` in the journal) and finishes
step 5.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import posixpath
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import crc32c

from tfrfs.edit import repack
from tfrfs.edit.commit import CommitResult, Committer, WriteJobs, next_written, pending_shard
from tfrfs.edit.journal import ShardChanges, Staging
from tfrfs.edit.repack import CommitFailed, ShardPlan, ShardResult
from tfrfs.index import idxfile, manifest
from tfrfs.index.manifest import held_by, objects_named, shard_entries
from tfrfs.index.discovery import OBJECTS_DIR, TMP_PREFIX, ShardFile
from tfrfs.index.shard_index import IndexCache, ShardIndex
from tfrfs.edit.bucket_versions import Base, changed_under, come_home, read_base, seal, tidy
from tfrfs.storage import durable
from tfrfs.storage.base import Conflict, NotSupported, ObjectInfo, Storage
from tfrfs.storage.remote_reader import RemoteReaders

log = logging.getLogger("tfrfs")

RECORD = "bucket-commit.json"   # in the journal's folder: the commit between its manifest write and its end
UPLOADS_AT_ONCE = 4             # new shards uploaded at a time (each in parts, PARTS_AT_ONCE at a time)


def staging_root(url: str, cache_dir: Path) -> Path:
    """The local folder that holds the staged edits of the bucket prefix ``url`` (keyed by it)."""
    key = hashlib.sha256(url.rstrip("/").encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return Path(cache_dir) / "edits" / key


def note_source(root: Path, url: str) -> None:
    """Say, in the staging folder, whose edits it holds (for people who look)."""
    root.mkdir(parents=True, exist_ok=True)
    note = root / "SOURCE"
    if not note.exists():
        durable.write_file(note, (url.rstrip("/") + "\n").encode())


def conflict(root: str, now: Base, staged: dict[str, dict]) -> CommitFailed:
    """The failure of a commit that another writer's commit came before."""
    hit = changed_under(now, staged)
    which = f"; of the shards with staged edits it changed: {', '.join(hit)}" if hit else \
        "; it changed none of the shards with staged edits"
    return CommitFailed(
        f"commit refused: another writer committed to {root} since this mount read it{which}. Nothing was "
        "written; the edits stay staged. To apply them to the new version, mount it again (unmount with "
        "fusermount3 -u: the edits stay staged; or tfrfs commit SOURCE when it is not mounted): the edits of "
        "shards it did not change are applied, and those of shards it changed are set aside and listed", errno.EBUSY)


class BucketCommitter(Committer):
    """Commits a writable bucket mount's staged changes through its manifest (see the module)."""

    def __init__(self, *args: Any, storage: Storage, base: Base, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.storage = storage
        self.url = self.root               # the prefix (the tree's root)
        self.base = base
        self.local = str(Path(self.staging.dir).parent)   # where the new shards are written first
        self.unsure = False   # a manifest write whose outcome could not be told: no commit until remounted

    def _manifest_url(self) -> str:
        return self.storage.join(self.url, manifest.NAME)

    def commit(self, write_jobs: WriteJobs) -> CommitResult:
        staging = self.staging
        started = time.monotonic()
        store = self.tree.store
        plans: dict[str, ShardPlan] = {}
        written: Iterator[Any] = iter(())
        try:
            with self.guard:
                self.tree.schema.forget()
                todo = [(rel, ch) for rel, ch in sorted(staging.shards.items()) if not ch.empty]
                if todo:
                    repack.settle(staging, todo[0][1])
                for relpath, ch in todo:
                    if ch.removed:
                        continue
                    n = store.shard_number(relpath)
                    try:
                        plans[relpath] = repack.plan_shard(self.local, ch, store.shards[n] if n is not None else None)
                    except OSError as exc:
                        raise repack.failure(ch, exc, False) from exc
            if not todo:
                self.last = CommitResult(True, (), round(time.monotonic() - started, 3))
                return self.last
            try:
                now = read_base(self.storage, self.url)
            except OSError as exc:
                raise CommitFailed(f"commit of {self.url} failed: its manifest cannot be read ({exc}); nothing was "
                                   "committed and the edits stay staged", exc.errno or errno.EIO) from exc
            if now.identity != self.base.identity:
                raise conflict(self.url, now, {rel: ch.base for rel, ch in todo if not ch.new})
            cid = uuid.uuid4().hex[:16]
            written = write_jobs(list(plans.values()))
            uploaded: dict[str, tuple[str, ShardIndex, tuple[int, int]]] = {}
            tallies = {}
            # Each new shard is uploaded as soon as its job has written it, a few at a time (their
            # requests wait on the network), while the next jobs write theirs.
            with ThreadPoolExecutor(UPLOADS_AT_ONCE, thread_name_prefix="tfrfs-upload") as pool:
                pending = {}
                for relpath, ch in todo:
                    n = store.shard_number(relpath)
                    tallies[relpath] = self._tally_after(n, ch)
                    if ch.removed:
                        continue
                    got = next_written(written)
                    if got.error is not None:
                        raise repack.failure(ch, got.error, False)
                    pending[relpath] = pool.submit(self._upload, cid, plans[relpath], tallies[relpath])
                for relpath, future in pending.items():
                    uploaded[relpath] = future.result()
            body, before = self._new_body(cid, todo, uploaded)
            notes = self._tfds_object(cid, body, todo, uploaded)
            try:
                home = come_home(self.storage, self.url, self.base.body, body,
                                 {rel.replace(os.sep, "/") for rel, _ in todo})
            except OSError as exc:
                raise CommitFailed(f"commit of {self.url} failed: {exc}; nothing was committed and the edits stay "
                                   "staged", exc.errno or errno.EIO) from exc
            seal(body, before)
            identity = self._publish(cid, body, todo)
            old = self.base
            self.base = Base(identity, body, time.time_ns())
            results = self._after(todo, uploaded, tallies)
            self._serve_home(home)
            notes += tuple(f"{rel}: back at its own path (a copy in the store)" for rel in home)
            notes += tuple(tidy(self.storage, self.url, old, self.base))
            self._drop_record()
        except CommitFailed as exc:
            log.error("%s", exc)
            with self.guard:
                self.last = CommitResult(False, (), error=str(exc))
            raise
        finally:
            close = getattr(written, "close", None)
            if close is not None:
                close()
            repack.take_back(plans.values())
            shutil.rmtree(Path(self.local) / TMP_PREFIX, ignore_errors=True)
        with self.guard:
            self.last = CommitResult(True, tuple(results), round(time.monotonic() - started, 3),
                                     staged=tuple(pending_shard(ch) for _, ch in todo), notes=notes)
            return self.last

    # -- the steps ------------------------------------------------------------------------

    def _publish(self, cid: str, body: dict, todo: list[tuple[str, ShardChanges]]) -> str:
        """The commit itself: the new manifest written on the condition that it is still the
        version the mount read; the identity it was written with. Raises CommitFailed."""
        if self.unsure:
            raise CommitFailed(f"commit of {self.url} refused: whether the last one was written is not known; "
                               "unmount, then tfrfs commit SOURCE finishes it (or writes it again)", errno.EIO)
        data = (json.dumps(body, separators=(",", ":"), sort_keys=True) + "\n").encode()
        staged = {rel: ch.base for rel, ch in todo if not ch.new}
        self._write_record(cid, [rel for rel, _ in todo])
        try:
            return self.storage.write_if(self._manifest_url(), data, identity=self.base.identity)
        except Conflict:
            self._drop_record()
            raise conflict(self.url, read_base(self.storage, self.url), staged) from None
        except NotSupported as exc:
            self._drop_record()
            raise CommitFailed(f"commit of {self.url} failed: {exc}", errno.EOPNOTSUPP) from None
        except OSError as exc:
            failed = exc
        # Written or not? The manifest says which commit made it.
        try:
            now = read_base(self.storage, self.url)
        except OSError:
            self.unsure = True   # the journal's record tells the next mount or tfrfs commit SOURCE
            raise CommitFailed(f"commit of {self.url}: writing its manifest failed ({failed}) and whether it was "
                               "written cannot be told now; the edits stay staged: unmount, then tfrfs commit SOURCE "
                               "finishes it or writes it again", failed.errno or errno.EIO) from failed
        if now.made_by == f"commit:{cid}" and now.identity is not None:
            return now.identity
        self._drop_record()
        raise CommitFailed(f"commit of {self.url} failed while writing its manifest ({failed}); nothing was "
                           "committed and the edits stay staged", failed.errno or errno.EIO) from failed

    def _upload(self, cid: str, plan: ShardPlan, tally: Any) -> tuple[str, ShardIndex, tuple[int, int]]:
        """Upload a shard's new file (written and checked by its job) and its index file:
        (the object's path relative to the root, its index, (size, CRC-32C) of the index file)."""
        ch = plan.ch
        rel = posixpath.join(OBJECTS_DIR, cid, ch.relpath.replace(os.sep, "/"))
        url = self.storage.join(self.url, rel)
        try:
            st = self.storage.upload_checked(plan.tmp, url)
            if isinstance(self.cache.readers, RemoteReaders):   # (the mount then opens it with no look-up)
                self.cache.readers.know([ObjectInfo(url, st.size, st.identity, st.mtime_ns)])
            local = ShardFile(path=plan.tmp, relpath=ch.relpath, compression=plan.compression,
                              size=os.path.getsize(plan.tmp), mtime_ns=0, identity=f"local:{cid}")
            # Indexed where it was written (a compressed one inflated there too), by a cache of
            # local files that goes with the commit's other local files.
            built = IndexCache(Path(self.local) / TMP_PREFIX / cid).build(local)
            shard = ShardFile(path=url, relpath=ch.relpath, compression=plan.compression, size=st.size,
                              mtime_ns=st.mtime_ns, identity=st.identity, shipped=(url + idxfile.SUFFIX,))
            idx = ShardIndex(shard, built.data_path, built.offsets, built.detected_kind, built.problems,
                             built.bad, ends=built.ends, tally=tally)
            data = self.cache.shipped_bytes(idx)
            self.storage.write(url + idxfile.SUFFIX, data)
            self.cache.save(idx)   # the mount serves the new object from this cache entry
        except OSError as exc:
            raise repack.failure(ch, exc, False) from exc
        return rel, idx, (len(data), crc32c.crc32c(data))

    def _new_body(self, cid: str, todo: list[tuple[str, ShardChanges]],
                  uploaded: dict[str, tuple[str, ShardIndex, tuple[int, int]]]) -> tuple[dict, set[str]]:
        """The new manifest (the base version's, or the listing's, with the committed shards'
        entries replaced) and the objects the version it replaces names (``seal`` retires those
        it no longer does, once the rest of the commit changed it)."""
        body = json.loads(json.dumps(self.base.body)) if self.base.body is not None else self._listed_body()
        entries = shard_entries(body)
        files = {f["path"]: f for f in body.get("files", ())}
        before = objects_named(body)
        for relpath, ch in todo:
            rel = relpath.replace(os.sep, "/")
            files.pop(rel + idxfile.SUFFIX, None)   # an index file at the shown path is the old shard's
            if ch.removed:
                entries.pop(rel, None)
                continue
            obj, idx, shipped = uploaded[relpath]
            entry = manifest.shard_json(idx, self.cache, shipped)
            entry["path"] = rel
            entry["object"] = obj
            entry["index"] = {"file": posixpath.basename(obj) + idxfile.SUFFIX, "size": shipped[0], "crc32c": shipped[1]}
            entries[rel] = entry
        body["shards"] = [entries[k] for k in sorted(entries)]
        body["files"] = [files[k] for k in sorted(files)]
        body["made_by"] = f"commit:{cid}"
        body["schema"] = self._summary_after(todo, uploaded)
        return body, before

    def _tfds_object(self, cid: str, body: dict, todo: list[tuple[str, ShardChanges]],
                     uploaded: dict[str, tuple[str, ShardIndex, tuple[int, int]]]) -> tuple[str, ...]:
        """A TFDS ``dataset_info.json`` beside committed shards follows them (SPEC 7): written as a
        new object of this commit and named by the new manifest (``body``, changed here), so a
        reader of either version reads the file of its own. Not a failure of the commit: notes."""
        from tfrfs.index import tfds_info as tfds
        files = {f["path"]: f for f in body["files"]}
        store = self.tree.store
        removed = {rel for rel, ch in todo if ch.removed}
        notes: list[str] = []
        for folder in sorted({posixpath.dirname(rel.replace(os.sep, "/")) for rel, _ in todo}):
            rel = posixpath.join(folder, tfds.INFO)
            entry = files.get(rel)
            if entry is None:
                continue
            figures = {}
            for idx in store.shards:
                shard_rel = idx.shard.relpath.replace(os.sep, "/")
                if posixpath.dirname(shard_rel) == folder and idx.shard.relpath not in removed:
                    new = uploaded.get(idx.shard.relpath)
                    figures[posixpath.basename(shard_rel)] = tfds.figures_of(new[1] if new else idx)
            changed = {posixpath.basename(r.replace(os.sep, "/")) for r, _ in todo
                       if posixpath.dirname(r.replace(os.sep, "/")) == folder}
            try:
                info = json.loads(self.storage.read(self.storage.join(self.url, held_by(entry))))
            except (OSError, ValueError) as exc:
                notes.append(f"{rel}: not updated: cannot read it ({exc})")
                continue
            done = tfds.follow(info, figures, changed)
            notes += [f"{rel}: {line}" for line in done.changes + done.problems]
            if not done.changes:
                continue
            data = (json.dumps(info, indent=2, ensure_ascii=False) + "\n").encode()
            obj = posixpath.join(OBJECTS_DIR, cid, rel)
            try:
                self.storage.write(self.storage.join(self.url, obj), data)
            except OSError as exc:
                raise CommitFailed(f"commit of {self.url} failed writing {rel}: {exc}", exc.errno or errno.EIO) from exc
            files[rel] = {"path": rel, "size": len(data), "mtime_ns": time.time_ns(), "object": obj}
        body["files"] = [files[k] for k in sorted(files)]
        for note in notes:
            log.info("%s", note)
        return tuple(notes)

    def _listed_body(self) -> dict:
        """A manifest of the prefix as the mount listed it (its first commit gives it one)."""
        store = self.tree.store
        indexes = [store.shards[n] for n in range(len(store.shards))
                   if not store.shards[n].shard.relpath in self.staging.shards
                   or not self.staging.shards[store.shards[n].shard.relpath].new]
        return json.loads(manifest.build(self.tree.discovery, indexes, self.cache, {}, None))

    def _summary_after(self, todo: list[tuple[str, ShardChanges]],
                       uploaded: dict[str, tuple[str, ShardIndex, tuple[int, int]]]) -> dict | None:
        """The schema summary of the dataset as the commit leaves it, where every shard's tally is
        known (else None: a mount reads it from the index files)."""
        from tfrfs.index import schema_summary
        store = self.tree.store
        removed = {rel for rel, ch in todo if ch.removed}
        shards, tallies = [], []
        for n, idx in enumerate(store.shards):
            rel = idx.shard.relpath
            if rel in removed:
                continue
            new = uploaded.get(rel)
            tally = new[1].tally if new is not None else idx.tally
            if tally is None:
                return None
            count = new[1].count if new is not None else idx.count
            shards.append({"shard": rel, "records": count, "kind": store.kinds[n], "compression": idx.shard.compression})
            tallies.append(tally)
        tables = schema_summary.summarize(tallies, store.decode_raw)
        out: dict = {"shards": shards, "features": tables["features"]}
        if tables["feature_lists"]:
            out["feature_lists"] = tables["feature_lists"]
        return out

    def _after(self, todo: list[tuple[str, ShardChanges]], uploaded: dict[str, tuple[str, ShardIndex, tuple[int, int]]],
               tallies: dict[str, Any]) -> list[ShardResult]:
        """Committed: each shard's staged edits dropped and the mount serving its new object."""
        store = self.tree.store
        results = []
        for relpath, ch in todo:
            n = store.shard_number(relpath)
            with self.guard:
                self._forget(relpath)
                if ch.removed:
                    results.append(ShardResult(relpath, "removed", 0, 0))
                    if n is not None:
                        self.tree.hide_shard(n)
                    continue
                _, idx, _ = uploaded[relpath]
                served, _ = self.cache.get(idx.shard)
                results.append(ShardResult(relpath, "created" if ch.new else "rewritten", idx.count, idx.shard.size))
                if n is not None:
                    self.tree.replace_shard(n, served)
                    self.tree.schema.committed(n, tallies.get(relpath))
            log.info("committed %s: %s", relpath, results[-1].action)
        return results

    def _serve_home(self, home: dict[str, dict]) -> None:
        """The mount reads the shards that came home from there (the objects it read them from go
        with the next commit)."""
        store = self.tree.store
        for rel, entry in home.items():
            n = store.shard_number(rel.replace("/", os.sep))
            if n is None:
                continue
            url = self.storage.join(self.url, rel)
            old = store.shards[n].shard
            shard = ShardFile(path=url, relpath=old.relpath, compression=old.compression, size=entry["size"],
                              mtime_ns=entry["mtime_ns"], identity=entry["identity"],
                              shipped=(url + idxfile.SUFFIX,) if entry.get("index") else ())
            with self.guard:
                self.tree.replace_shard(n, self.cache.get(shard)[0])

    def _forget(self, relpath: str) -> None:
        try:
            self.staging.drop_shard(relpath)
        except OSError as exc:
            log.warning("%s is committed, but its staged edits could not be cleared yet: %s", relpath, exc)
            self.staging.shards.pop(relpath, None)

    # -- the record of a commit between its manifest write and its end ---------------------

    def _write_record(self, cid: str, relpaths: list[str]) -> None:
        durable.write_file(Path(self.staging.dir) / RECORD, json.dumps(
            {"commit": f"commit:{cid}", "base": self.base.identity, "shards": relpaths,
             "base_body": self.base.body}).encode())

    def _drop_record(self) -> None:
        try:
            durable.unlink(str(Path(self.staging.dir) / RECORD))
        except FileNotFoundError:
            pass


def recover(staging: Staging, storage: Storage, url: str, now: Base) -> list[str]:
    """At a writable mount's start (or ``tfrfs commit``): a commit whose record is in the journal
    either wrote its manifest (``now`` was made by it: its shards' staged edits are dropped, and
    what it would have deleted is deleted) or did not (the record is dropped: its edits stay
    staged, its uploads are named by no manifest). Returns what was done, for the log."""
    path = Path(staging.dir) / RECORD
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        durable.unlink(str(path))
        return ["an unreadable record of an interrupted commit was dropped; its edits stay staged"]
    done = []
    if now.made_by == record.get("commit"):
        for relpath in record.get("shards", ()):
            if relpath in staging.shards:
                staging.drop_shard(relpath)
        done.append(f"an interrupted commit had written its manifest: {len(record.get('shards', ()))} shard(s) "
                    "committed, their staged edits cleared")
        done += tidy(storage, url, Base(record.get("base"), record.get("base_body"), 1), now)
    else:
        done.append("an interrupted commit had not written its manifest; its edits stay staged")
    durable.unlink(str(path))
    return done


def rebase(staging: Staging, shards: dict[str, ShardFile]) -> list[str]:
    """The staged edits of shards that changed since they were staged (another writer's commit),
    set aside: moved out of the journal into ``conflicts/TIME/`` beside it, nothing deleted.
    ``shards``: the shards as the mount found them, by relative path. Returns one line each
    (shard, and the records its edits touched)."""
    out = []
    for relpath, ch in sorted(staging.shards.items()):
        if ch.new or not ch.base:
            continue
        now = shards.get(relpath)
        was = ch.base
        same = now is not None and now.size == was.get("size") and \
            (now.identity == was["identity"] if "identity" in was else now.mtime_ns == was.get("mtime_ns"))
        if same:
            continue
        records = sorted(ch.edited | ch.deleted)
        where = staging.set_aside(relpath)
        what = (f"records {', '.join(map(str, records[:20]))}{' ...' if len(records) > 20 else ''}"
                if records else "no original record")
        out.append(f"{relpath}: changed by another commit since its edits were staged ({what}"
                   f"{f', {len(ch.added)} added' if ch.added else ''}); its edits are set aside in {where}")
    return out


__all__ = ["Base", "BucketCommitter", "RECORD", "rebase", "read_base", "recover", "staging_root"]
