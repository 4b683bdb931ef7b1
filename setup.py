"""The optional compiled part of tfrfs (everything else is in pyproject.toml).

``tfrfs.fuse._answer`` answers a read-only mount's lookups, attributes and reads in C;
``tfrfs.format._floats`` writes float32 values as their shortest decimal (SPEC 3.2);
``tfrfs.format._example`` shows the features of an Example in the usual encoding as files;
``tfrfs.format._records`` walks a shard's records, checks their checksums and parse, and tallies
their schema (``index``, ``verify``, ``reshard``, ``repair``). All are optional: where they cannot
be built (no compiler, no Python headers), pip installs tfrfs without them, the mount answers
those requests in Python (``tfrfs/fuse/direct.py``), floats are written by
``tfrfs/format/jsontext.py``, records rendered by ``tfrfs/format/codec.py`` and walked by
``tfrfs/format/salvage.py``, with the same results.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tfrfs.fuse._answer", ["tfrfs/fuse/_answer.c"],
                             depends=["tfrfs/fuse/_answer_table.h", "tfrfs/fuse/_answer_folder.h"],
                             optional=True, extra_compile_args=["-O2", "-Wall"]),
                   Extension("tfrfs.format._floats", ["tfrfs/format/_floats.c"],
                             depends=["tfrfs/format/_float_text.h"],
                             optional=True, extra_compile_args=["-O2", "-Wall"]),
                   Extension("tfrfs.format._example", ["tfrfs/format/_example.c"],
                             depends=["tfrfs/format/_float_text.h", "tfrfs/format/_example_wire.h"],
                             optional=True, extra_compile_args=["-O2", "-Wall"]),
                   Extension("tfrfs.format._records", ["tfrfs/format/_records.c"],
                             depends=["tfrfs/format/_crc32c.h", "tfrfs/format/_example_wire.h"],
                             optional=True, extra_compile_args=["-O2", "-Wall"])])
