"""What is known about a dataset before a record is read: shard discovery (a local folder, or a
dataset in a store through its ``Storage``: ``storage_discovery``), the compact record
offsets and their cache, index files beside shards and the loaders' own index files, the manifest
(SPEC 1.2), TFDS metadata, each shard's schema tally (SPEC 5), and how a job in any process
reaches a dataset's bytes (``where.Where``). Work that runs in parallel
runs on a runner given from above (``running.Runner``; ``tfrfs.jobs.runner`` holds them).

May import: ``tfrfs.storage``, ``tfrfs.format``, ``tfrfs.errors``; nothing above.
"""
