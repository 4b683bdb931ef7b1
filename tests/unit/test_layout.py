"""The package's layout: the sample dataset (tfrfs.sample, for the demo and the tests) stays off the
runtime's import path."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys

from typing import Any

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
    # path); the command line may look at its arguments. Anywhere else a branch on "is it a URL"
    # (``is_url``, a "://" in it, its scheme, a parse of it), a ``.remote`` flag, the raw fsspec object or the store's type is a second answer to the
    # same question, and the next storage would have to find and fix every one of them.
    import re
    patterns = {
        "is_url(": re.compile(r"\bis_url\("),
        ".remote flag": re.compile(r"\.remote\b(?!\()"),   # Ray's ``f.remote(...)`` is a call
        "raw fsspec .fs": re.compile(r"\.fs\b"),
        "isinstance(..., Store)": re.compile(r"isinstance\([^)]*\bStore\b"),
        "the store's protocol": re.compile(r"\.protocol\b"),
        'a "://" test': re.compile(r"""["']://["']"""),
        "a scheme's prefix": re.compile(r"""startswith\(\s*\(?\s*[rbf]?["'][A-Za-z][A-Za-z0-9+.-]*://"""),
        "a URL parsed": re.compile(r"\burl(?:parse|split)\b|\burllib\.parse\b"),
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


# Highest first: a module may import its own subpackage and any lower layer, never a higher one.
LAYERS = ("faces", "dataset", "jobs", "edit", "view", "index", "storage", "format", "errors")
# The faces stand side by side at the top; one uses another only where ``FACE_USES`` says: the
# command line mounts through the FUSE face and reads the package's version, the Ray source
# opens datasets as the library does. ``tfrfs`` is the package itself (``tfrfs.open``).
FACES = ("cli", "fuse", "ray", "library", "fsspec_fs", "sample", "tfrfs")
FACE_USES = {"cli": ("fuse", "tfrfs"), "ray": ("library",), "tfrfs": ("library", "ray")}
# The sample dataset writes shards: it may use the bytes on disk, and nothing of the runtime.
SAMPLE_USES = ("format", "errors")
# Imports that break the order (none; an entry here would say why it must).
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _part_of(module: str) -> str:
    """The subpackage (or top module) ``tfrfs.x.y`` belongs to: ``x``; ``tfrfs`` for the package
    and what it holds itself (``tfrfs.__version__``)."""
    part = module.split(".")[1] if "." in module else "tfrfs"
    return "tfrfs" if part.startswith("__") else part


def _layer_of(part: str) -> str:
    return "faces" if part in FACES else part


def _imports_of(tree: Any, module: str, is_package: bool) -> list[str]:
    """Every ``tfrfs`` module ``tree`` imports, wherever the import is (at the top, inside a
    function, under ``TYPE_CHECKING``): ``from tfrfs import x`` counts as ``tfrfs.x`` when ``x``
    is a module or subpackage, else as the package itself."""
    import ast
    root = os.path.dirname(tfrfs.__file__)
    package = module if is_package else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("tfrfs.")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            if base == "tfrfs" or base.startswith("tfrfs."):
                folder = os.path.join(root, *base.split(".")[1:])
                found += [f"{base}.{a.name}" if os.path.exists(os.path.join(folder, a.name)) or
                          os.path.exists(os.path.join(folder, a.name + ".py")) else base for a in node.names]
    return found


def _may_import(mine: str, theirs: str) -> bool:
    """Whether a module of ``mine`` (a subpackage or top module) may import one of ``theirs``."""
    if mine == theirs:
        return True
    if mine == "sample":
        return theirs in SAMPLE_USES
    if theirs in FACES:
        return theirs in FACE_USES.get(mine, ())
    if mine in FACES:
        return True
    return LAYERS.index(theirs) > LAYERS.index(mine)


def test_layers_import_only_downward() -> None:
    """The layers, highest first: the faces (cli, fuse, ray, library, sample) -> dataset -> jobs ->
    edit -> view -> index -> storage -> format -> errors. Each subpackage's docstring says so;
    this holds every module to it (imports inside functions and for types too), so a lower layer
    never learns of a higher one."""
    import ast
    root = os.path.dirname(tfrfs.__file__)
    found = []
    for folder, _dirs, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(folder, name), root)[:-3].replace(os.sep, ".")
            is_package = rel == "__init__" or rel.endswith(".__init__")
            # ``python -m tfrfs`` is the command line.
            module = {"__init__": "tfrfs", "__main__": "tfrfs.cli.__main__"}.get(rel, "tfrfs." + rel.removesuffix(".__init__"))
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
            mine = _part_of(module)
            for target in _imports_of(tree, module, is_package):
                theirs = _part_of(target)
                if _layer_of(theirs) not in LAYERS:
                    found.append(f"{module} -> {target}: in no layer")
                elif not _may_import(mine, theirs) and \
                        (module.removeprefix("tfrfs."), ".".join(target.split(".")[1:3])) not in KNOWN_UPWARD:
                    found.append(f"{module} -> {target}")
    assert found == [], "\n".join(found)
