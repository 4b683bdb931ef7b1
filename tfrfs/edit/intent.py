"""Intents: the changes of one call that touches several journal files, made all or none.

See ``tfrfs.edit.journal`` for when a call is one: its new contents are prepared in ``tmp/``
(``prepare``), one JSON file listing every step is published by a single durable rename, and the
steps are taken (``carry_out``), each a rename or a removal that does nothing when done already,
so running the list again from any point finishes the call. This module holds the steps, their
JSON form and the files of the journal's record format they write; ``Staging`` publishes and
retires intents.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from tfrfs.storage import durable

if TYPE_CHECKING:
    from tfrfs.edit.journal import ShardChanges

INTENT_VERSION = 1


def shard_id(relpath: str) -> str:
    return hashlib.sha256(relpath.encode("utf-8", "surrogateescape")).hexdigest()[:24]


def name_id(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def added_blob(name: str, data: bytes) -> bytes:
    """An added record's journal file: its name (u32 length, UTF-8), then its bytes."""
    return added_head(name) + data


def added_head(name: str) -> bytes:
    raw = name.encode("utf-8", "surrogateescape")
    return struct.pack("<I", len(raw)) + raw


def prepare(intent: Intent, journal: Path) -> None:
    """Write the content each step of ``intent`` brings into a file of its own in ``journal``'s
    ``tmp/``, fsynced, before the intent is published."""
    for op in intent.ops:
        if op.data is not None and op.src is None:
            fd, tmp = durable.mkstemp(journal / "tmp", prefix="intent-")
            op.src = Path(tmp)
            with os.fdopen(fd, "wb") as f:
                durable.write(f, op.data, tmp)
                f.flush()
                durable.fsync(f.fileno(), tmp)
    durable.fsync_dir(journal / "tmp")


def carry_out(ops: list[Op], journal: Path) -> None:
    """Take every step of an intent, in order; each does nothing when done already."""
    for op in ops:
        if op.kind == "put":
            _put(op, journal)
        else:
            _drop(op, journal)

def _put(op: Op, journal: Path) -> None:
    assert op.src is not None
    try:
        st = op.src.lstat()
    except FileNotFoundError:
        return                        # done already
    if op.ino is not None and st.st_ino != op.ino:
        return                        # not the file this step was planned for
    if not op.dst.parent.is_dir():
        return                        # its journal was dropped since (tfrfs discard)
    # The planned file or folder takes the place of whatever is there (an empty folder, for the
    # editor checks the rest), so a published intent can always be finished.
    try:
        there = op.dst.lstat()
    except FileNotFoundError:
        there = None
    if there is not None and (stat.S_ISDIR(st.st_mode) or stat.S_ISDIR(there.st_mode)):
        _drop(Op("drop", op.dst), journal)
    durable.rename(op.src, op.dst)
    durable.fsync_dir(op.dst.parent)

def _drop(op: Op, journal: Path) -> None:
    try:
        st = op.dst.lstat()
    except FileNotFoundError:
        return
    if op.ino is not None and st.st_ino != op.ino:
        return
    if not stat.S_ISDIR(st.st_mode):
        durable.unlink(op.dst)
        return
    # A folder goes by one rename, so a crash never leaves half of it.
    doomed = journal / "tmp" / f"drop-{secrets.token_hex(8)}"
    durable.rename(op.dst, doomed)
    durable.fsync_dir(op.dst.parent)
    shutil.rmtree(doomed, ignore_errors=True)


@dataclass
class Op:
    """One step of an intent: "put" renames ``src`` over ``dst`` if ``src`` is still there, "drop"
    removes ``dst`` if it is there. With ``ino``, only if the path is still that very file."""

    kind: str
    dst: Path
    src: Path | None = None
    ino: int | None = None
    data: bytes | None = None     # content to prepare as ``src`` (in tmp/) before publishing


class Intent:
    """The changes of one call that must take effect together; built here, made by ``Staging.run``.

    Changes to records reuse the journal's own files (edit/N, del/N, add/H); the user's scratch
    files and folders are moved or removed as they are."""

    def __init__(self, shard_dir: Callable[[ShardChanges], Path]) -> None:
        self._shard_dir = shard_dir   # a shard's journal folder
        self.ops: list[Op] = []
        self.shards: list[ShardChanges] = []
        self._memory: list[Callable[[], None]] = []
        self.after: Callable[[], None] = lambda: None   # once the files are in place (a later settle)
        self.published = False    # the call has happened (even if ``run`` then raised)

    def _shard(self, ch: ShardChanges) -> Path:
        if all(c is not ch for c in self.shards):
            self.shards.append(ch)
        return self._shard_dir(ch)

    def edit(self, ch: ShardChanges, index: int, data: bytes) -> None:
        """Original record ``index`` gets new bytes."""
        self.ops.append(Op("put", self._shard(ch) / "edit" / str(index), data=data))
        self._memory.append(lambda: ch.edited.add(index))

    def add(self, ch: ShardChanges, name: str, data: bytes) -> None:
        """An added record ``name`` (replacing one of that name)."""
        fid = ch.added.get(name) or name_id(name)
        self.ops.append(Op("put", self._shard(ch) / "add" / fid, data=added_blob(name, data)))

        def note() -> None:
            ch.added[name] = fid
        self._memory.append(note)

    def delete(self, ch: ShardChanges, rid: int | str) -> None:
        """A record goes: an added one's file, or an original one by its del marker (its edit too)."""
        sdir = self._shard(ch)
        if isinstance(rid, str):
            self.ops.append(Op("drop", sdir / "add" / ch.added[rid]))
            def note_dropped() -> None:
                ch.added.pop(rid, None)
            self._memory.append(note_dropped)
            return
        self.ops.append(Op("put", sdir / "del" / str(rid), data=b""))
        self.ops.append(Op("drop", sdir / "edit" / str(rid)))

        def note() -> None:
            ch.deleted.add(rid)
            ch.edited.discard(rid)
        self._memory.append(note)

    def write_file(self, path: str | os.PathLike[str], data: bytes) -> None:
        """A scratch file gets ``data`` (made, or replaced)."""
        self.ops.append(Op("put", Path(path), data=data))

    def move(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        """A scratch file or folder moves (over an empty folder or a file at ``dst``)."""
        src = Path(src)
        self.ops.append(Op("put", Path(dst), src=src, ino=src.lstat().st_ino))

    def drop(self, path: str | os.PathLike[str]) -> None:
        """A scratch file or folder goes, if there is one."""
        path = Path(path)
        try:
            ino = path.lstat().st_ino
        except FileNotFoundError:
            return
        self.ops.append(Op("drop", path, ino=ino))

    def to_json(self, root: Path) -> bytes:
        def rel(p: Path) -> str:
            return p.relative_to(root).as_posix()
        steps = [{"op": op.kind, "dst": rel(op.dst), **({"src": rel(op.src)} if op.src is not None else {}),
                  **({"ino": op.ino} if op.ino is not None else {})} for op in self.ops]
        return json.dumps({"version": INTENT_VERSION, "steps": steps}).encode()

    def discard_prepared(self) -> None:
        for op in self.ops:
            if op.data is not None and op.src is not None:
                try:
                    os.unlink(op.src)
                except OSError:
                    pass

    def note_in_memory(self) -> None:
        for note in self._memory:
            note()
        self._memory = []


def parse_intent(raw: bytes, root: Path) -> list[Op]:
    """The steps of a published intent; ValueError unless every one names a path inside the journal."""
    doc = json.loads(raw)
    if doc.get("version") != INTENT_VERSION or not isinstance(doc.get("steps"), list):
        raise ValueError("not an intent")

    def path(rel: object, tops: tuple[str, ...]) -> Path:
        parts = rel.split("/") if isinstance(rel, str) else []
        if not parts or parts[0] not in tops or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"bad path in intent: {rel!r}")
        return root.joinpath(*parts)

    ops = []
    for step in doc["steps"]:
        kind, ino = step["op"], step.get("ino")
        if kind not in ("put", "drop") or not (ino is None or isinstance(ino, int)):
            raise ValueError(f"bad step in intent: {step!r}")
        src = path(step["src"], ("tmp", "scratch")) if kind == "put" else None
        ops.append(Op(kind, path(step["dst"], ("shards", "scratch")), src=src, ino=ino))
    return ops
