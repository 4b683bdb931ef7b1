"""Where the benchmark keeps its files (bench-out/ beside the repository) and the helpers every
part of it uses: a progress line on stderr, a command that must succeed, a timed shell pipeline,
and an os.walk error handler that raises instead of skipping."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "bench-out"
WORK = OUT / "work"


def progress(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc


def timed_shell(cmd: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed, proc.stdout.strip()


def raise_error(exc: OSError) -> None:
    raise exc
