"""A command run in a forked child with ``durable.fault_hook`` set (the crash tests' way to stop
it at a chosen durable step: the hook calls ``os._exit``)."""

from __future__ import annotations

import os
from typing import Callable

from tfrfs.storage import durable


def exit_status(hook: Callable[[str, str], None], command: Callable[[], int]) -> int:
    """``command()`` in a forked child with ``hook`` as the fault hook: the child's exit status
    (what the command returned, or what the hook exited with)."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            durable.fault_hook = hook
            code = command()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), status
    return os.WEXITSTATUS(status)
