"""The layers of the package import only downwards: faces (``cli``, ``fuse``, ``ray``,
``library``) -> ``dataset`` -> ``jobs`` -> ``edit`` -> ``view`` -> ``index`` -> ``storage`` ->
``format`` -> ``errors``; and one dataset is assembled in one place (``dataset.factory``)."""

from __future__ import annotations

import ast
import os
from typing import Iterator

import tfrfs

ROOT = os.path.dirname(tfrfs.__file__)
RANKS = {"errors": 0, "format": 1, "storage": 2, "index": 3, "view": 4, "edit": 5, "jobs": 6, "dataset": 7}
FACES = ("cli", "fuse", "ray", "library")


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for folder, _dirs, files in os.walk(ROOT):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, ROOT), ast.parse(f.read())


def _imported(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Every tfrfs module a module imports (at the top, inside a function, or for types)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names if a.name.startswith("tfrfs"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfrfs"):
            yield node.lineno, node.module or ""


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1].removesuffix(".py") if len(parts) > 1 else ""


def test_no_layer_imports_a_face_and_jobs_and_dataset_import_only_downwards() -> None:
    """No layer imports ``cli``, ``fuse``, ``ray`` or the library; ``dataset`` and ``jobs`` import
    only layers below them (``jobs`` types an opened SOURCE by ``index.opened.OpenedSource``)."""
    found = []
    for rel, tree in _modules():
        here = rel.split(os.sep)[0].removesuffix(".py")
        if here not in RANKS:
            continue
        for line, module in _imported(tree):
            there = _layer(module)
            if there in FACES or (here in ("jobs", "dataset") and there in RANKS and RANKS[there] > RANKS[here]):
                found.append(f"{rel}:{line}: imports {module}")
    assert found == []


def test_the_dataset_factory_alone_makes_a_record_store_and_a_schema() -> None:
    found = []
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("RecordStore", "Schema") and rel != os.path.join("dataset", "factory.py"):
                found.append(f"{rel}:{node.lineno}: {node.func.id}(...)")
    assert found == []


def test_the_library_reads_no_fuse_option() -> None:
    tree = dict(_modules())["library.py"]
    assert [m for _, m in _imported(tree) if _layer(m) == "fuse"] == []
