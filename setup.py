"""The optional compiled part of tfrfs (everything else is in pyproject.toml).

``tfrfs.fuse._answer`` answers a read-only mount's lookups, attributes and reads in C. It is
optional: where it cannot be built (no compiler, no Python headers), pip installs tfrfs without
it and the mount answers those requests in Python (``tfrfs/fuse/direct.py``) with the same bytes.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tfrfs.fuse._answer", ["tfrfs/fuse/_answer.c"],
                             depends=["tfrfs/fuse/_answer_table.h", "tfrfs/fuse/_answer_folder.h"],
                             optional=True, extra_compile_args=["-O2", "-Wall"])])
