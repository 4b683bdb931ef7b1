"""TensorFlow's view of shards (``tf_records.py``, run under TensorFlow in a subprocess) and the
comparison of tfrfs's plain values with it. Nothing here imports TensorFlow."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parent / "tf_records.py"
_KINDS = {int: "int64_list", float: "float_list", bytes: "bytes_list"}


def tf_view(shards: list[tuple[str, str, str]], timeout: float = 600) -> dict[str, dict]:
    """``{path: {"records", "values", "error"}}`` for (path, compression, kind) shards."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, str(SCRIPT), *(":".join(s) for s in shards)], capture_output=True,
                          text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"tf_records.py exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _feature_differs(ours: list | None, theirs: list, where: str) -> list[str]:
    kind, values = theirs
    if kind is None:
        return [] if ours is None else [f"{where}: TensorFlow has a Feature with no kind, tfrfs {ours!r}"]
    if ours is None or not isinstance(ours, list):
        return [f"{where}: tfrfs gives {ours!r} for a {kind}"]
    if any(_KINDS.get(type(v)) != kind for v in ours):
        return [f"{where}: tfrfs values {[type(v).__name__ for v in ours][:3]} for a {kind}"]
    got = [sha(v) for v in ours] if kind == "bytes_list" else ours
    if len(got) != len(values) or any(a != b and not (a != a and b != b) for a, b in zip(got, values)):
        return [f"{where}: values differ: tfrfs {got[:5]}, TensorFlow {values[:5]}"]
    return []


def differences(ours: dict, theirs: dict, where: str) -> list[str]:
    """How a record's plain values (``tfrfs.open(...).example``) differ from TensorFlow's parse."""
    if "context" in theirs and "feature_lists" in theirs and set(ours) == {"context", "feature_lists"}:
        out = differences(ours["context"], theirs["context"], where + " context")
        ol, tl = ours["feature_lists"], theirs["feature_lists"]
        if set(ol) != set(tl):
            return out + [f"{where}: feature lists {sorted(ol)} vs {sorted(tl)}"]
        for k in tl:
            if len(ol[k]) != len(tl[k]):
                out.append(f"{where} {k}: {len(ol[k])} steps vs {len(tl[k])}")
                continue
            for n, (a, b) in enumerate(zip(ol[k], tl[k])):
                out += _feature_differs(a, b, f"{where} {k}[{n}]")
        return out
    if set(ours) != set(theirs):
        return [f"{where}: keys {sorted(ours)} vs TensorFlow {sorted(theirs)}"]
    out: list[str] = []
    for k, v in theirs.items():
        out += _feature_differs(ours[k], v, f"{where} {k!r}")
    return out


def tf_kinds(theirs: dict) -> dict[str, Any]:
    """key -> kind of a TensorFlow record view (an Example's features)."""
    return {k: v[0] for k, v in theirs.items()}
