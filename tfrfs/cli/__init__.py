"""Command line: the only package that prints to the user or chooses an exit status.

May import: every layer (``tfrfs.dataset`` and everything below it), the FUSE face (it mounts)
and the package's version; not ``ray`` or ``library``.

Exit status: 0 success, 1 the command ran and found problems (or failed at
its work), 2 bad usage or bad input.
"""

from tfrfs.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
