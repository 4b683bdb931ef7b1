"""A TensorFlow subprocess that answers requests: the tests' way to ask real TensorFlow how it
reads (or writes) shards without importing it into the test process.

The worker is a Python program (``script``) that prints ``READY`` once TensorFlow is loaded, then
reads one JSON request per line and answers ``OK <json>`` or ``ERR <reason>`` on one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.commands import end_by_stdin

REPO = Path(__file__).resolve().parents[2]


class TfWorker:
    def __init__(self, script: str) -> None:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        self.proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env, cwd=REPO)
        self._answer("READY")

    def _answer(self, prefix: str) -> str:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"the TensorFlow worker died (exit {self.proc.poll()})")
            if line.startswith(prefix):
                return line[len(prefix):].strip()
            if line.startswith("ERR "):
                raise AssertionError(f"TensorFlow failed: {line[4:]}")

    def request(self, req: dict) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._answer("OK "))

    def close(self) -> None:
        end_by_stdin(self.proc)
