"""What the index layer asks of a runner: ``jobs.runner`` holds the runners (this process, a pool
of local processes, Ray) and a caller above passes one in; the index layer never imports jobs.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol, Sequence


class Runner(Protocol):
    """Runs a module-level function over many argument tuples (``jobs.runner.Runner``)."""

    workers: int   # jobs that run at the same time

    def run(self, fn: Callable[..., Any], jobs: Sequence[tuple[Any, ...]]) -> Iterator[tuple[int, Any]]:
        """``(n, fn(*jobs[n]))`` for every job, as they finish."""
        ...

    def close(self) -> None:
        """Stop what the runner started (its worker processes)."""
        ...
