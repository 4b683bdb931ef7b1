"""The package's layout: the sample dataset (tfrfs.sample, for the demo and the tests) stays off the
runtime's import path."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import tfrfs


def test_runtime_modules_do_not_import_the_sample() -> None:
    # A fresh interpreter: this test process has imported tfrfs.sample for other tests.
    modules = [m.name for m in pkgutil.iter_modules(tfrfs.__path__) if not m.ispkg and m.name != "__main__"]
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module('tfrfs.' + name)\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('tfrfs.sample'))))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "cli" in modules and "fuse_ops" in modules
    assert proc.stdout.strip() == ""
