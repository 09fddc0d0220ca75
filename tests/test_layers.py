"""The engine's layers (pyproject.toml [tool.importlinter]), checked by import-linter.

A module imports only from layers below its own, inner (function-level) imports
included; docs/dev/architecture.md draws the order. tests/test_boundary.py keeps
the window and the engine apart.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path
from typing import Any

from tests.helpers.imports import ROOT, copy_tree
from tests.helpers.imports import lint_imports as _lint_imports


def _layers_contract() -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["type"] == "layers" and c["containers"] == ["engine"])


def _engine_children() -> set[str]:
    """Every subpackage and top-level module of the engine, from the file tree."""
    engine = ROOT / "engine"
    # a folder of modules counts even without an __init__.py (a namespace package)
    packages = {p.name for p in engine.iterdir()
                if p.is_dir() and p.name != "__pycache__" and any(p.glob("*.py"))}
    modules = {p.stem for p in engine.glob("*.py") if p.name != "__init__.py"}
    return packages | modules


def test_the_layers_hold() -> None:
    proc = _lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "engine layers KEPT" in proc.stdout, proc.stdout


def test_the_contract_names_every_part_of_the_engine() -> None:
    contract = _layers_contract()
    # exhaustive: import-linter itself refuses a child of `engine` missing from the layers
    assert contract["exhaustive"] is True
    names = [n.strip() for layer in contract["layers"] for n in layer.split("|")]
    assert len(names) == len(set(names)), names
    assert set(names) == _engine_children()


def test_a_forbidden_import_breaks_the_contract(tmp_path: Path) -> None:
    """The same check on a copy of the tree with one upward import (core -> cli) added,
    inside a function as the engine used to hide them: it must fail and name it."""
    copy_tree(tmp_path)
    errors = tmp_path / "engine" / "core" / "errors.py"
    errors.write_text(errors.read_text(encoding="utf-8")
                      + "\n\ndef _upward() -> None:\n    import engine.cli.main  # noqa: F401\n",
                      encoding="utf-8")
    proc = _lint_imports(tmp_path)
    assert proc.returncode != 0, proc.stdout
    assert "engine layers BROKEN" in proc.stdout, proc.stdout
    assert "engine.core.errors -> engine.cli.main" in proc.stdout, proc.stdout


def _says_why(lines: list[str], node: ast.ImportFrom) -> bool:
    """A comment on the import, or above it (through the imports grouped with it)."""
    if "#" in " ".join(lines[node.lineno - 1:node.end_lineno]):
        return True
    k = node.lineno - 2
    while k >= 0:
        text = lines[k].strip()
        if text.startswith("#"):
            return True
        if not text.startswith(("from ", "import ")) and not text.endswith((",", "(")):
            return False
        k -= 1
    return False


def test_function_level_engine_imports_say_why() -> None:
    # Imports stay at the top of a module; one inside a function must say why (start-up
    # cost: torch, a native library). The CLI and the API import everything lazily so
    # that `--help` and `from engine import api` stay instant; their docstrings say so.
    lazy_by_design = [ROOT / "engine" / "cli", ROOT / "engine" / "api.py"]
    silent = []
    for path in sorted((ROOT / "engine").rglob("*.py")):
        if any(path == d or d in path.parents for d in lazy_by_design):
            continue
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("engine")
                        and not _says_why(lines, node)):
                    silent.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}")
    assert sorted(set(silent)) == []
