"""One dataset, assembled once: ``factory.open_dataset`` opens SOURCE (``sources``: storage,
shards, readers), indexes its shards (``sources.index_source``: the one indexer, on a runner or
the default local pool) and makes the record store and schema; the mount (``assembly.open_mount``,
its staged edits laid over as the overlay), ``tfrfs.open``, every command and, through
``tfrfs.open``, the Ray source take their dataset from it.

May import: every layer below the faces (``jobs``, ``edit``, ``view``, ``index``, ``storage``,
``format``, ``errors``); never ``fuse``, ``cli``, ``ray`` or the library.
"""
