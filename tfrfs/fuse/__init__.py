"""The FUSE face: libfuse3's low-level API (``libfuse``, the only module that loads it), the
requests by node id (``requests``, ``inodes``), the operations by path over the dataset's tree with
errors mapped once (``operations``, ``edge``), the request loop's parts (``loop``), mount options,
the mount table and what a running daemon notes about itself.

May import: ``tfrfs.dataset`` and everything below it; no other face (``cli``, ``ray``,
``library``).
"""
