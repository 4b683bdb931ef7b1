"""Edits of a writable mount (SPEC 7): the durable journal of staged edits (``journal``, its
``intent``s), the edit session that lays them over the read-only view (``overlay``: the record
store reads through it; it keeps the pinned names), the editors of feature files and folders,
rename, changes to a record message, and the commit (``commit``, on a thread of its own inside a
mount) that repacks changed shards (``repack``).

May import: ``tfrfs.view``, ``tfrfs.index`` (``index.where.Where`` is what a commit's shard job
needs to find SOURCE), ``tfrfs.storage``, ``tfrfs.format``, ``tfrfs.errors``; never ``jobs`` or
anything above it.
"""
