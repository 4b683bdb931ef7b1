"""Work that runs shard by shard (SPEC 8): index, verify, inspect, repair, reshard and the commit's
shards, as plain functions (indexing on every core among them), and the runner that runs them in
process, on a local pool or on Ray; publishing a new dataset whole or not at all.

May import: ``tfrfs.edit``, ``tfrfs.view``, ``tfrfs.index``, ``tfrfs.storage``, ``tfrfs.format``,
``tfrfs.errors``; never ``dataset`` or a face.
"""
