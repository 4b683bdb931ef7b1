"""What the read side asks of edits laid over it: the overlay interface.

A writable mount shows its shards with the staged edits laid over them, as git shows a work tree
over its objects. The record store and the tree are the read side: they know records by shard
and index, and ask an ``Overlay`` (implemented by the edit session, ``tfrfs.edit.overlay``) which
records it changed, deleted or added, for a changed one its bytes, and which names a changed
record keeps showing (its pin, ``view.pins``) until a commit. The read side never
imports the write side; a read-only mount has no overlay.
"""

from __future__ import annotations

from typing import AbstractSet, Mapping, Protocol

from tfrfs.view.nodes import RecordId
from tfrfs.view.pins import NamePin


class ShardLayer(Protocol):
    """What an overlay changes in one shard (read here, never changed)."""

    @property
    def removed(self) -> bool:
        """The whole shard goes at the next commit."""

    @property
    def edited(self) -> AbstractSet[int]:
        """Original records that hold other bytes now."""

    @property
    def deleted(self) -> AbstractSet[int]:
        """Original records that are gone (their names stay free until a commit)."""

    @property
    def added(self) -> Mapping[str, str]:
        """Records made in the mount, by name."""

    def added_names(self) -> list[str]:
        """The added records' names in the order they are listed (and committed)."""


class Overlay(Protocol):
    """Edits laid over a mount's shards."""

    def layer(self, relpath: str) -> ShardLayer | None:
        """What is changed in the shard at ``relpath`` (relative to SOURCE), or None: nothing."""

    def record(self, relpath: str, rid: RecordId) -> bytes | None:
        """The bytes a record of that shard holds now when the overlay changed or added it, else
        None (the shard's own bytes are current). KeyError for an added name it does not hold."""

    def scratch_dir(self, relpath: str, rid: RecordId) -> str:
        """The real folder holding the user's own folders and scratch files of a record."""

    def pin(self, shard: int, rid: RecordId) -> NamePin | None:
        """The names a record changed in the mount keeps showing, if any."""

    def keep_pin(self, shard: int, rid: RecordId, pin: NamePin | None) -> None:
        """What of a record's pin still makes a difference, once the record is rendered with it."""

    def forget_shard(self, shard: int) -> None:
        """Shard ``shard`` is read anew (a commit renumbered it): its records' pins go."""
