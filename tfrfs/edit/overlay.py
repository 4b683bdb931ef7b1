"""The staged edits as the read side sees them: the edit session behind the overlay interface.

``tfrfs.view.overlay.Overlay`` is what the record store and the tree ask of the edits laid over
the shards. ``EditSession`` answers from the journal (``Staging``), which the editors change, and
keeps what else an edit decides about the view: the names a changed record keeps showing until a
commit (its pin), and which record views the store must render again (``pin_names``, ``unpin``,
``invalidate``).
"""

from __future__ import annotations

import threading

from tfrfs.edit.journal import ShardChanges, Staging
from tfrfs.view.nodes import RecordId
from tfrfs.view.pins import NamePin, pin_from_shown
from tfrfs.view.records import RecordStore


class EditSession:
    """A writable mount's staged edits, as an ``Overlay`` over its shards, and the names they pin.

    Made before the record store that reads through it; ``attach`` gives it that store."""

    def __init__(self, staging: Staging) -> None:
        self.staging = staging
        self._store: RecordStore | None = None
        self._pins: dict[tuple[int, RecordId], NamePin] = {}   # names kept until a commit
        self._lock = threading.Lock()   # the store renders on the request thread, a commit forgets on its own

    def attach(self, store: RecordStore) -> None:
        self._store = store

    @property
    def store(self) -> RecordStore:
        assert self._store is not None, "attach the record store first"
        return self._store

    # -- the overlay interface ----------------------------------------------------------

    def layer(self, relpath: str) -> ShardChanges | None:
        return self.staging.shards.get(relpath)

    def record(self, relpath: str, rid: RecordId) -> bytes | None:
        ch = self.staging.shards.get(relpath)
        if isinstance(rid, str):
            if ch is None:
                raise KeyError(rid)
            return self.staging.get_added(ch, rid)
        if ch is not None and rid in ch.edited:
            return self.staging.get_edit(ch, rid)
        return None

    def scratch_dir(self, relpath: str, rid: RecordId) -> str:
        # An original record's folder is named by its index, an added one's by its name: the
        # tags keep the two apart (an added record may be named like an index).
        tag = f"#{rid}" if isinstance(rid, int) else f"+{rid}"
        return str(self.staging.scratch_dir(relpath, tag))

    def pin(self, shard: int, rid: RecordId) -> NamePin | None:
        with self._lock:
            return self._pins.get((shard, rid))

    def keep_pin(self, shard: int, rid: RecordId, pin: NamePin | None) -> None:
        with self._lock:
            if pin is not None:
                self._pins[(shard, rid)] = pin
            else:
                self._pins.pop((shard, rid), None)

    def forget_shard(self, shard: int) -> None:
        with self._lock:
            for key in [k for k in self._pins if k[0] == shard]:
                del self._pins[key]

    # -- what the editors decide about the view --------------------------------------------

    def invalidate(self, shard: int, rid: RecordId) -> None:
        """The record's content or its scratch entries changed: render it again when next asked."""
        self.store.invalidate(shard, rid)

    def names_shown(self, shard: int, rid: RecordId) -> NamePin:
        """How the record's features are shown now, with their values' digests: the pin a change
        to the record starts from."""
        store = self.store
        view = store.view(shard, rid)
        data, damaged = store.record_bytes(shard, rid)
        if damaged or not view.shown:
            return NamePin()
        try:
            message = store.parse(shard, data)
        except Exception:  # noqa: BLE001 - a record that does not parse shows no features to keep
            return NamePin()
        return pin_from_shown(view.shown, message)

    def pin_names(self, shard: int, rid: RecordId, pin: NamePin, *, build: bool = True) -> None:
        """Show the record (whose staged content just changed) with the names of ``pin`` where they
        hold. ``build=False`` leaves rendering it to the next lookup (a large record: the writer
        still holds its content, and a second copy of it is not worth a smaller pin)."""
        self.keep_pin(shard, rid, pin)
        self.invalidate(shard, rid)
        if not build:
            return
        try:
            # Rendered now, so the pin shrinks at once to what it changes (memory stays small when
            # a script edits many records), instead of at the record's next lookup.
            self.store.view(shard, rid)
        except OSError:
            pass   # the next lookup reports it

    def unpin(self, shard: int, rid: RecordId) -> None:
        """Forget the names kept for a record (deleted, or its name given to another record)."""
        self.keep_pin(shard, rid, None)
