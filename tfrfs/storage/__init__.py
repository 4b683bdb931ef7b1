"""Where bytes live: local folders and bucket or web URLs (through fsspec), the shard readers that
serve a shard's bytes to everything above, read-ahead, descriptors of files read by path, durable
writes and the places a dataset's own small files go; and how threads reading at once share work
(``sharing``).

May import: ``tfrfs.format``, ``tfrfs.errors``.
"""
