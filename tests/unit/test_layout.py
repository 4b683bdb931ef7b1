"""The package's layout: the sample dataset (tfrfs.sample, for the demo and the tests) stays off the
runtime's import path."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys

import tfrfs


def test_runtime_modules_do_not_import_the_sample() -> None:
    # A fresh interpreter: this test process has imported tfrfs.sample for other tests.
    modules = [name for name in _modules(tfrfs.__path__, "tfrfs.") if not name.startswith("tfrfs.sample")]
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('tfrfs.sample'))))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert {"tfrfs.cli", "tfrfs.cli.mounting", "tfrfs.fuse.operations", "tfrfs.storage.local_reader"} <= set(modules)
    assert proc.stdout.strip() == ""


def _modules(path: list[str], prefix: str) -> list[str]:
    """Every module and package under ``path``, without importing them; no ``__main__`` (importing
    one runs the command line)."""
    found = []
    for m in pkgutil.iter_modules(path, prefix):
        if m.name.endswith(".__main__"):
            continue
        found.append(m.name)
        if m.ispkg:
            found += _modules([os.path.join(path[0], m.name.rsplit(".", 1)[1])], m.name + ".")
    return found


def test_commands_import_only_what_they_share() -> None:
    """tfrfs.cli's parser imports the command modules; a command module imports no other command
    module, only tfrfs.cli.common (so none of them can form an import cycle)."""
    import ast
    folder = os.path.join(tfrfs.__path__[0], "cli")
    for name in ("common", "mounting", "staged", "data"):
        with open(os.path.join(folder, name + ".py")) as f:
            tree = ast.parse(f.read())
        siblings = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1}
        assert siblings <= ({"common"} if name != "common" else set()), (name, siblings)


def test_only_the_storage_factory_asks_whether_bytes_are_remote() -> None:
    # Where bytes live is the storage's to know (tfrfs.storage: one factory tells a URL from a
    # path); the command line may look at its arguments. Anywhere else a branch on "is it a URL",
    # a ``.remote`` flag, the raw fsspec object or the store's type is a second answer to the
    # same question, and the next storage would have to find and fix every one of them.
    import re
    patterns = {
        "is_url(": re.compile(r"\bis_url\("),
        ".remote flag": re.compile(r"\.remote\b(?!\()"),   # Ray's ``f.remote(...)`` is a call
        "raw fsspec .fs": re.compile(r"\.fs\b"),
        "isinstance(..., Store)": re.compile(r"isinstance\([^)]*\bStore\b"),
        "the store's protocol": re.compile(r"\.protocol\b"),
    }
    root = os.path.dirname(tfrfs.__file__)
    found = []
    for folder, _dirs, files in os.walk(root):
        rel_folder = os.path.relpath(folder, root)
        if rel_folder.split(os.sep)[0] in ("storage", "cli"):
            continue
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    code = line.split("#", 1)[0]
                    if code.lstrip().startswith(("\"", "'")) or "``" in code:
                        continue   # prose (docstrings) may name what the code no longer does
                    for what, pattern in patterns.items():
                        if pattern.search(code):
                            found.append(f"{os.path.relpath(path, root)}:{n}: {what}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_read_side_never_imports_the_write_side() -> None:
    """Nothing under tfrfs/view/ imports tfrfs.edit (at the top, inside a function, or for types):
    the edits are an overlay that the read side asks through ``tfrfs.view.overlay``."""
    import ast
    folder = os.path.join(tfrfs.__path__[0], "view")
    found = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(folder, name)) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level == 1:
                    base = f"tfrfs.view.{base}" if base else "tfrfs.view"
                elif node.level == 2:
                    base = f"tfrfs.{base}" if base else "tfrfs"
                modules = [base] + ([f"{base}.{alias.name}" for alias in node.names] if base == "tfrfs" else [])
            else:
                continue
            found += [(name, m) for m in modules if m == "tfrfs.edit" or m.startswith("tfrfs.edit.")]
    assert found == []


def test_no_module_takes_a_private_name_of_another() -> None:
    """A name with a leading underscore is its module's own: another module that imports it
    (``from tfrfs.x import _name``) or reaches for it (``x._name`` on an imported tfrfs module)
    depends on what its owner may change without notice. Shared names are public."""
    import ast
    root = os.path.dirname(tfrfs.__file__)
    found = []
    for folder, _dirs, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            modules: set[str] = set()   # local names bound to tfrfs modules
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfrfs"):
                    for alias in node.names:
                        if alias.name.startswith("_") and not alias.name.startswith("__"):
                            found.append(f"{os.path.relpath(path, root)}:{node.lineno}: imports {alias.name}")
                        modules.add(alias.asname or alias.name)
                elif isinstance(node, ast.Import):
                    modules.update(a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("tfrfs"))
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                        and node.attr.startswith("_") and not node.attr.startswith("__")):
                    found.append(f"{os.path.relpath(path, root)}:{node.lineno}: uses {node.value.id}.{node.attr}")
    assert found == []
