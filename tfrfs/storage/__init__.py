"""Where bytes live: local folders and bucket or web URLs (through fsspec), the shard readers that
serve a shard's bytes to everything above, read-ahead, durable writes and the places a dataset's
own small files go.

May import: ``tfrfs.format``, ``tfrfs.errors``.
"""
