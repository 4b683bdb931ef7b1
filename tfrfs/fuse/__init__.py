"""The FUSE face: the only place that imports the binding (``mfusepy``) and libfuse; operations
over the dataset's tree with errors mapped once, the request loop, mount options, the mount table
and what a running daemon notes about itself.

May import: ``tfrfs.dataset`` and everything below it; no other face (``cli``, ``ray``,
``library``).
"""
