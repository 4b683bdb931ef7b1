"""The staged edits as the read side sees them: the journal behind the overlay interface.

``tfrfs.view.overlay.Overlay`` is what the record store and the tree ask of the edits laid over
the shards; ``StagedOverlay`` answers from the journal (``Staging``), which the editors change.
"""

from __future__ import annotations

from tfrfs.edit.journal import ShardChanges, Staging
from tfrfs.view.nodes import RecordId


class StagedOverlay:
    """A writable mount's staged edits, as an ``Overlay`` over its shards."""

    def __init__(self, staging: Staging) -> None:
        self.staging = staging

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
