"""Edits of a writable mount (SPEC 7): the durable journal of staged edits, the editors of feature
files and folders, rename, changes to a record message, and the commit that repacks changed
shards.

May import: ``tfrfs.view``, ``tfrfs.index``, ``tfrfs.storage``, ``tfrfs.format``, ``tfrfs.errors``.
"""
