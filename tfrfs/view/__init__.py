"""The read-only view of a dataset (SPEC 2-5): the record store, a record rendered as feature
files (a pure function), names that stay stable, the namespace tree and the dataset's schema.

May import: ``tfrfs.index``, ``tfrfs.storage``, ``tfrfs.format``, ``tfrfs.errors``; never ``edit``
(the edits reach the view through ``view.overlay``) or anything above it.
"""
