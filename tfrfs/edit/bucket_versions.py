"""The versions of a bucket dataset, each one manifest (SPEC 7.1): the version read with its
identity (``Base``), what a version names, how two compare, and what a commit leaves to delete
(``tidy``), brings back home (``come_home``) or ``tfrfs repair`` deletes at once
(``remove_unnamed``). The commit that writes a version is ``bucket_commit``'s."""

from __future__ import annotations

import errno
import json
import logging
import os
import posixpath
from dataclasses import dataclass

import crc32c

from tfrfs.edit.repack import CommitFailed
from tfrfs.index import idxfile, manifest
from tfrfs.index.manifest import objects_named, shard_entries
from tfrfs.index.discovery import OBJECTS_DIR
from tfrfs.storage.base import Conflict, NotSupported, Storage

log = logging.getLogger("tfrfs")


@dataclass(frozen=True)
class Base:
    """The version of the dataset's manifest a mount read: its identity (None: the prefix had no
    manifest), its body, and its time."""

    identity: str | None
    body: dict | None
    mtime_ns: int = 0

    @property
    def made_by(self) -> str | None:
        got = (self.body or {}).get("made_by")
        return str(got) if got is not None else None


def read_base(storage: Storage, root: str) -> Base:
    """The manifest at ``root`` now, with its identity: looked up before and after it is read,
    so that the body is of that identity (read again if a commit came between)."""
    url = storage.join(root, manifest.NAME)
    for _ in range(5):
        before = storage.stat(url)
        if before is None:
            return Base(None, None)
        try:
            data = storage.read(url)
        except FileNotFoundError:
            continue
        after = storage.stat(url)
        if after is not None and after.identity == before.identity:
            try:
                body = json.loads(data)
            except ValueError as exc:
                raise CommitFailed(f"{url}: damaged manifest ({exc}); tfrfs index --beside writes it anew",
                                   errno.EIO) from None
            return Base(before.identity, body, before.mtime_ns)
    raise CommitFailed(f"{url}: it changes faster than it can be read", errno.EAGAIN)


def changed_under(now: Base, staged: dict[str, dict]) -> list[str]:
    """Which shards, of those with staged edits (relative path: the ``base`` their edits were
    staged against, size and identity), are not there as they were in the version ``now``."""
    entries = shard_entries(now.body)
    out = []
    for rel, base in sorted(staged.items()):
        e = entries.get(rel.replace(os.sep, "/"))
        if e is None or (e.get("size"), e.get("identity")) != (base.get("size"), base.get("identity")):
            out.append(rel)
    return out


def come_home(storage: Storage, url: str, base: dict | None, body: dict, changed: set[str]) -> dict[str, dict]:
    """Shards held away from their own path by an earlier commit, and not changed by this one,
    copied back to it on the store's side (none of their bytes pass through here), with their
    index files, where the version this commit replaces no longer names that path (the commit
    that moved them away retired it). ``body``, the new manifest, then names them there again, so
    that after two commits the prefix reads as a plain dataset to tools that list it. Returns the
    entries moved, by path."""
    was = objects_named(base)
    home: dict[str, dict] = {}
    for entry in body["shards"]:
        rel, away = entry["path"], entry.get("object")
        if not away or away == rel or rel in changed or rel in was:
            continue
        storage.copy(storage.join(url, away), storage.join(url, rel))
        got = storage.stat(storage.join(url, rel))
        if got is None or got.size != entry["size"]:
            raise CommitFailed(f"{rel}: its copy home is not whole; the commit stopped before its manifest", errno.EIO)
        del entry["object"]
        entry.update(identity=got.identity, mtime_ns=got.mtime_ns)
        if entry.get("index"):
            # The index file says which bytes it is of (size and identity): the copy's, where the
            # store gave the copy an identity of its own.
            meta, offsets = idxfile.load(storage.read(storage.join(url, away + idxfile.SUFFIX)))
            data = idxfile.dump(dict(meta, identity=got.identity, size=got.size), offsets)
            storage.write(storage.join(url, rel + idxfile.SUFFIX), data)
            entry["index"] = {"file": posixpath.basename(rel) + idxfile.SUFFIX, "size": len(data),
                              "crc32c": crc32c.crc32c(data)}
        home[rel] = entry
    return home


def seal(body: dict, before: set[str]) -> None:
    """Finish a new manifest once everything in it is named: the objects the version it replaces
    named (``before``) and it does not are ``retired``, and its version is 2 only where it names
    an object other than a shard's path (a reader of version 1 refuses it)."""
    body["retired"] = manifest.retire(body, before)
    body["tfrfs_manifest"] = manifest.version_of(body)


def tidy(storage: Storage, url: str, old: Base, new: Base) -> list[str]:
    """After a commit: delete what ``old`` (the version it replaced) had retired and ``new``
    does not name, and the uploads under OBJECTS/ older than ``old`` that neither names (of
    commits that never were: a commit that began later read ``old`` or newer, and uploads
    after that). Failures are notes: the next commit tries again."""
    keep = objects_named(new.body) | objects_named(old.body)
    doomed = {r for r in (old.body or {}).get("retired", ()) if r not in keep}
    notes = []
    if old.identity is not None and old.mtime_ns:
        try:
            listed = storage.list(storage.join(url, OBJECTS_DIR), recursive=True) or []
        except OSError as exc:
            listed = []
            notes.append(f"{OBJECTS_DIR}/: not listed ({exc}); the next commit looks again")
        for e in listed:
            rel = posixpath.join(OBJECTS_DIR, e.name)
            if rel not in keep and e.stat.mtime_ns < old.mtime_ns:
                doomed.add(rel)
    for rel in sorted(doomed):
        try:
            storage.delete(storage.join(url, rel))
        except OSError as exc:
            notes.append(f"{rel}: not deleted yet ({exc}); the next commit tries again")
    if doomed:
        failed = sum(1 for n in notes if n.endswith("the next commit tries again"))
        notes.append(f"deleted {len(doomed) - failed} object(s) no manifest names any more")
    for note in notes:
        log.info("%s", note)
    return notes


def remove_unnamed(storage: Storage, url: str) -> list[str]:
    """What ``tfrfs repair`` of a bucket does at once that commits leave to the next one (SPEC
    7.1): delete every object the manifest no longer names (it retired them) and every upload of
    a commit that never was, whatever its age (a reader of an older version then fails), and
    write the manifest again with nothing retired. Returns what was done, one line each."""
    now = read_base(storage, url)
    if now.body is None:
        return []
    named = objects_named(now.body)
    doomed = {r for r in now.body.get("retired", ()) if r not in named}
    for e in storage.list(storage.join(url, OBJECTS_DIR), recursive=True) or []:
        rel = posixpath.join(OBJECTS_DIR, e.name)
        if rel not in named:
            doomed.add(rel)
    notes = []
    for rel in sorted(doomed):
        storage.delete(storage.join(url, rel))
    if doomed:
        notes.append(f"deleted {len(doomed)} object(s) the manifest no longer names (a reader of an older "
                     "version can no longer read them)")
    if now.body.get("retired"):
        body = dict(now.body, retired=[])
        try:
            storage.write_if(storage.join(url, manifest.NAME),
                             (json.dumps(body, separators=(",", ":"), sort_keys=True) + "\n").encode(),
                             identity=now.identity)
        except (Conflict, NotSupported) as exc:
            notes.append(f"{manifest.NAME}: not written again ({exc}): it still lists objects already deleted")
    return notes
