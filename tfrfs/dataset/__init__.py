"""One dataset, assembled once: SOURCE opened into storage, indexes, record store and schema, for
the mount, ``tfrfs.open``, every command and the Ray source.

May import: every layer below the faces (``edit``, ``view``, ``jobs``, ``index``, ``storage``,
``format``, ``errors``); never ``fuse``, ``cli`` or ``ray``.
"""
