"""The dataset manifest (SPEC 1.2): one small file at a dataset's root, ``.tfrfs-manifest``.

``tfrfs index SOURCE --beside`` writes it with the shipped indexes: every shard's path relative
to the root, size, identity, compression, record kind and count (and what indexing found wrong:
problems, records that do not parse, gaps), its index file's size and checksum, the plain files
and folders with their sizes and times, and the schema summary of SPEC 5. A read-only mount of a
folder or bucket holding one starts from it: no listing, no request per shard, until a record of
a shard is looked up (``IndexCache.from_manifest``).

A local folder is compared with the manifest when it is first visited
(``tfrfs.view.folder_check.FolderCheck``, which changes the mounted tree): one
listing of that folder and a ``stat`` of each file in it. What differs (a shard added, deleted,
or of another size or identity; a plain file or folder added or gone) is shown as it is, indexed
as usual, and reported once in the log and ``.tfrfs/errors``. A bucket's manifest is taken as
its listing (no LIST request at all): a shard changed since is caught by the checks every index
and record get (the sampled headers, the checksums).
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import crc32c

from tfrfs.index import idxfile
from tfrfs.format import tfrecord
from tfrfs.index.shard_index import IndexCache, ShardIndex
from tfrfs.index.discovery import Discovery, ShardFile, SourceFiles

if TYPE_CHECKING:
    from tfrfs.storage.places import Place

log = logging.getLogger("tfrfs")

NAME = ".tfrfs-manifest"
VERSION = 1
# A manifest that names, for some shard, an object other than its shown path (a bucket commit's,
# SPEC 7.1): a reader that knows only version 1 would read the old object there, so it refuses.
VERSION_OBJECTS = 2


class ManifestError(ValueError):
    """Not a manifest of this version, or damaged."""


@dataclass(frozen=True)
class Entry:
    """One shard as the manifest names it."""

    path: str            # relative to the dataset's root, "/"-separated
    size: int
    identity: str
    mtime_ns: int
    compression: str
    kind: str
    count: int
    summary: dict        # the index header's fields a mount needs before the offsets (problems, bad, gaps, ...)
    index: dict | None   # {"file": NAME.tfrfs-idx, "size": N, "crc32c": N}, or None
    object: str = ""     # the object that holds it, relative to the root, when not ``path`` (SPEC 7.1)

    @property
    def held_at(self) -> str:
        """The relative path of the file or object that holds the shard."""
        return self.object or self.path


@dataclass(frozen=True)
class Manifest:
    shards: tuple[Entry, ...]
    files: tuple[tuple[str, int, int], ...]     # plain files: (path, size, mtime_ns)
    dirs: tuple[tuple[str, int], ...]           # folders: (path, mtime_ns); "" is the root
    schema: dict | None
    made_by: str | None = None        # the commit (or reshard plan) that wrote it
    retired: tuple[str, ...] = ()     # objects the manifest before it named and it does not (SPEC 7.1)
    held: dict[str, str] = field(default_factory=dict)   # plain file -> the object that holds it, where another

    def entry(self, relpath: str) -> Entry | None:
        for e in self.shards:
            if e.path == relpath:
                return e
        return None


# --- what a manifest's body names (SPEC 7.1) ---------------------------------------------

def shard_entries(body: dict | None) -> dict[str, dict]:
    return {e["path"]: e for e in (body or {}).get("shards", ())}


def held_by(entry: dict) -> str:
    return str(entry.get("object") or entry["path"])


def objects_named(body: dict | None) -> set[str]:
    """Every object a manifest names: the shards' and their index files', and its plain files'."""
    out: set[str] = set()
    for e in shard_entries(body).values():
        out.add(held_by(e))
        if e.get("index"):
            out.add(held_by(e) + idxfile.SUFFIX)
    out.update(held_by(f) for f in (body or {}).get("files", ()))
    return out


def retire(body: dict, before: set[str]) -> list[str]:
    """Of the objects ``before`` (named by the version before, or retired by it), those the
    manifest ``body`` does not name: retired, for the next commit to delete."""
    return sorted(before - objects_named(body))


def version_of(body: dict) -> int:
    """VERSION_OBJECTS where the manifest names, for some shard, an object other than its path."""
    return VERSION_OBJECTS if any(e.get("object") for e in body["shards"]) else VERSION


# --- writing ------------------------------------------------------------------------

def build(discovery: Discovery, indexes: list[ShardIndex], cache: IndexCache,
          shipped: dict[str, tuple[int, int]], schema: dict | None, before: Manifest | None = None) -> bytes:
    """The manifest of a dataset whose shards are ``indexes``; ``shipped``: (size, CRC-32C) of the
    index file each shard got beside it, by relative path; ``before``: the manifest it replaces,
    whose plain files held elsewhere stay held there, and whose retired objects stay listed for
    the next commit to delete (SPEC 7.1)."""
    files = discovery.access
    shards = [shard_json(idx, cache, shipped.get(idx.shard.relpath)) for idx in indexes]
    root = _posix(discovery.root.rstrip("/")) + "/"
    for entry, idx in zip(shards, indexes):
        # A shard held by another object than its path (a bucket commit's) stays held there.
        path = _posix(idx.shard.path)
        held = path[len(root):] if path.startswith(root) else entry["path"]
        if held != entry["path"]:
            entry["object"] = held
            if entry["index"]:
                entry["index"]["file"] = posixpath.basename(held) + idxfile.SUFFIX
    plain = {}
    for rel in discovery.plain_files:
        size, mtime_ns = files.plain_stat(rel)
        plain[rel] = {"path": _posix(rel), "size": size, "mtime_ns": mtime_ns}
        if before is not None and rel in before.held:
            plain[rel]["object"] = _posix(before.held[rel])
    for rel, (size, _) in shipped.items():
        # The index files just written beside the shards are shown as plain files too (SPEC 1).
        rel += idxfile.SUFFIX
        try:
            mtime_ns = files.written_mtime_ns(rel)
        except OSError:
            continue
        plain[rel] = {"path": _posix(rel), "size": size, "mtime_ns": mtime_ns}
    dirs = [{"path": _posix(rel), "mtime_ns": files.dir_mtime_ns(rel)} for rel in discovery.dirs]
    body: dict[str, Any] = {"shards": shards, "files": [plain[rel] for rel in sorted(plain)], "dirs": dirs,
                            "schema": schema}
    body["tfrfs_manifest"] = version_of(body)
    if before is not None and before.retired:
        body["retired"] = retire(body, {_posix(r) for r in before.retired})
    return (json.dumps(body, separators=(",", ":"), sort_keys=True) + "\n").encode()


def shard_json(idx: ShardIndex, cache: IndexCache, written: tuple[int, int] | None) -> dict:
    """A shard's entry; ``written``: (size, CRC-32C) of its index file beside it, if any."""
    shard = idx.shard
    meta = cache.meta(idx)
    return {
        "path": _posix(shard.relpath), "size": shard.size, "identity": shard.identity,
        "mtime_ns": shard.mtime_ns, "compression": shard.compression, "kind": idx.detected_kind,
        "count": idx.count, "stream_size": meta["stream_size"], "problems": meta["problems"],
        "bad": meta["bad"], "gaps": meta["gaps"],
        "index": None if written is None else {"file": posixpath.basename(_posix(shard.relpath)) + idxfile.SUFFIX,
                                               "size": written[0], "crc32c": written[1]},
    }


def _posix(rel: str) -> str:
    return rel.replace(os.sep, "/")


def follow(root: str, cache: IndexCache, written: list[ShardIndex], removed: list[str],
           schema: dict | None, place: "Place | None" = None) -> list[str]:
    """After a commit or repair wrote shards anew (``written``, indexed) or removed them (by
    relative path): the index file beside each (where it had one, or the dataset has a manifest)
    and the dataset's manifest (where it has one) follow, each replaced whole, after the shards
    (in a local folder: temporary file, fsync, rename; in a bucket: one PUT; ``place``, the local
    folder ``root`` by default). A crash between leaves an index file or manifest of the old
    shard, which its size and identity tell apart: it is ignored (and reported) until the next
    ``tfrfs index --beside``. ``schema``: the new schema summary, None when not known.
    Returns what was done or could not be, one line each."""
    from tfrfs.storage.places import Place
    place = place if place is not None else Place.at(root)
    where = place.join(NAME)
    has_manifest = place.stat(where) is not None
    notes: list[str] = []
    shipped: dict[str, tuple[int, int]] = {}
    for idx in written:
        beside = idx.shard.path + idxfile.SUFFIX
        if not (has_manifest or place.stat(beside) is not None):
            continue
        try:
            data = cache.shipped_bytes(idx)
            place.write(beside, data)
            shipped[idx.shard.relpath] = (len(data), crc32c.crc32c(data))
        except OSError as exc:
            notes.append(f"{idx.shard.relpath}{idxfile.SUFFIX}: not written anew ({exc.strerror or exc}): "
                         "it is ignored, as of another version of the shard, until tfrfs index --beside")
    for rel in removed:
        stale = place.join(rel + idxfile.SUFFIX)
        if place.stat(stale) is not None:
            try:
                place.unlink(stale)
            except OSError as exc:   # harmless: an index file is never a shard
                notes.append(f"{rel}{idxfile.SUFFIX}: the index of the removed shard stays ({exc.strerror or exc})")
    if not has_manifest:
        return notes
    try:
        body = json.loads(place.read(where))
        entries = {e["path"]: e for e in body["shards"]}
        plain = {e["path"]: e for e in body["files"]}
        for rel in removed:
            entries.pop(_posix(rel), None)
            plain.pop(_posix(rel + idxfile.SUFFIX), None)
        # A shard an earlier commit or repair replaced or removed before it could get here (a
        # crash between): its entry follows now too.
        done = {_posix(i.shard.relpath) for i in written} | {_posix(r) for r in removed}
        for rel, e in list(entries.items()):
            if rel in done:
                continue
            held = _rel(e.get("object") or rel)
            seen = place.stat(place.join(held))
            if seen is None:
                del entries[rel]
                plain.pop(rel + idxfile.SUFFIX, None)
                stale = place.join(held + idxfile.SUFFIX)
                if place.stat(stale) is not None:
                    place.unlink(stale)
                continue
            size, identity, mtime_ns = seen
            if (size, identity) != (e.get("size"), e.get("identity")):
                shard = ShardFile(path=place.join(held), relpath=_rel(rel), compression=e["compression"],
                                  size=size, mtime_ns=mtime_ns, identity=identity)
                idx, _ = cache.get(shard)
                data = cache.shipped_bytes(idx)
                place.write(shard.path + idxfile.SUFFIX, data)
                shipped[shard.relpath] = (len(data), crc32c.crc32c(data))
                written = [*written, idx]
        if not written and len(entries) == len(body["shards"]):
            return notes   # nothing to follow
        for idx in written:
            rel = _posix(idx.shard.relpath)
            held_at = (entries.get(rel) or {}).get("object")
            entries[rel] = shard_json(idx, cache, shipped.get(idx.shard.relpath))
            if held_at:   # rewritten where it is held (a bucket's repair): still there
                entries[rel]["object"] = held_at
                entries[rel]["index"] = entries[rel]["index"] and \
                    dict(entries[rel]["index"], file=posixpath.basename(held_at) + idxfile.SUFFIX)
            elif idx.shard.relpath in shipped:   # (the index file of a shard held elsewhere is not shown)
                got = place.stat(idx.shard.path + idxfile.SUFFIX)
                if got is None:
                    raise FileNotFoundError(idx.shard.path + idxfile.SUFFIX)
                plain[rel + idxfile.SUFFIX] = {"path": rel + idxfile.SUFFIX, "size": got[0], "mtime_ns": got[2]}
        body["shards"] = [entries[k] for k in sorted(entries)]
        body["files"] = [plain[k] for k in sorted(plain)]
        body["schema"] = schema
        place.write(where, (json.dumps(body, separators=(",", ":"), sort_keys=True) + "\n").encode())
        notes.append(f"{NAME}: updated for {len(written) + len(removed)} shard(s)"
                     if written or removed else f"{NAME}: updated")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        notes.append(f"{NAME}: not updated ({exc}): a mount reports the shards that differ from it; "
                     "tfrfs index --beside writes it anew")
    return notes


# --- reading ------------------------------------------------------------------------

def parse(data: bytes) -> Manifest:
    """Raises ManifestError."""
    try:
        body = json.loads(data)
        if not isinstance(body, dict) or body.get("tfrfs_manifest") not in (VERSION, VERSION_OBJECTS):
            raise ManifestError(f"manifest version {body.get('tfrfs_manifest') if isinstance(body, dict) else '?'}, "
                                f"not {VERSION} or {VERSION_OBJECTS}")
        shards = tuple(Entry(path=_rel(s["path"]), size=int(s["size"]), identity=str(s["identity"]),
                             mtime_ns=int(s["mtime_ns"]), compression=str(s["compression"]), kind=str(s["kind"]),
                             count=int(s["count"]),
                             summary={k: s[k] for k in ("stream_size", "problems", "bad", "gaps")},
                             index=s.get("index"), object=_rel(s["object"]) if s.get("object") else "")
                       for s in body["shards"])
        retired = tuple(_rel(r) for r in body.get("retired") or ())
        made_by = body.get("made_by")
        files = tuple((_rel(f["path"]), int(f["size"]), int(f["mtime_ns"])) for f in body["files"])
        held = {_rel(f["path"]): _rel(f["object"]) for f in body["files"] if f.get("object")}
        dirs = tuple((_rel(d["path"]) if d["path"] else "", int(d["mtime_ns"])) for d in body["dirs"])
    except ManifestError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise ManifestError(f"damaged manifest: {exc}") from exc
    if compressions := {e.compression for e in shards} - {tfrecord.NONE, tfrecord.GZIP, tfrecord.ZLIB}:
        raise ManifestError(f"damaged manifest: unknown compression {sorted(compressions)}")
    return Manifest(shards, files, dirs, body.get("schema"), str(made_by) if made_by is not None else None, retired,
                    held)


def _rel(path: Any) -> str:
    """A relative path of the manifest, refused if it would leave the dataset's folder."""
    if not isinstance(path, str) or not path or path.startswith("/") or \
            any(part in ("", ".", "..") for part in path.split("/")):
        raise ManifestError(f"damaged manifest: bad path {path!r}")
    return path.replace("/", os.sep)


class ManifestFiles(SourceFiles):
    """A local dataset's plain files and folder times, as its manifest gives them (no stat)."""

    def __init__(self, root: str, manifest: Manifest) -> None:
        super().__init__(root)
        self._files = {rel: (size, mtime) for rel, size, mtime in manifest.files}
        self._dirs = dict(manifest.dirs)

    def dir_mtime_ns(self, rel: str) -> int:
        got = self._dirs.get(rel)
        return got if got is not None else super().dir_mtime_ns(rel)

    def plain_stat(self, rel: str) -> tuple[int, int]:
        got = self._files.get(rel)
        return got if got is not None else super().plain_stat(rel)


def shard_file(root: str, entry: Entry, join: Callable[[str, str], str] = os.path.join) -> ShardFile:
    """The shard as ``entry`` names it: shown at its path, read from the object that holds it."""
    held = entry.held_at
    path = join(root, held if join is os.path.join else held.replace(os.sep, "/"))
    shipped = (path + idxfile.SUFFIX,) if entry.index else ()
    return ShardFile(path=path, relpath=entry.path, compression=entry.compression, size=entry.size,
                     mtime_ns=entry.mtime_ns, identity=entry.identity, shipped=shipped)


def local_discovery(root: str, manifest: Manifest) -> Discovery:
    """What a local dataset holds, as its manifest says (nothing listed, nothing opened)."""
    root = os.path.abspath(root)
    return Discovery(root=root, shards=tuple(shard_file(root, e) for e in manifest.shards),
                     plain_files=tuple(rel for rel, _, _ in manifest.files),
                     dirs=tuple(rel for rel, _ in manifest.dirs) or ("",), mirrors_dir=True,
                     files=ManifestFiles(root, manifest))


def read_local(root: str) -> Manifest | None:
    """The manifest of a local folder, or None when it has none (or one that cannot be used:
    then the folder is listed as usual, and the log says why)."""
    path = os.path.join(root, NAME)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("%s: cannot read it (%s): the folder is listed instead", path, exc.strerror)
        return None
    try:
        return parse(data)
    except ManifestError as exc:
        log.warning("%s: %s: the folder is listed instead", path, exc)
        return None
