"""import-linter over a tree (pyproject.toml [tool.importlinter]): the engine's layers and
what the window may use of the engine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the console script of the venv running the tests
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH first: the tree in `cwd` is the one analysed, not the installed one
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def copy_tree(to: Path) -> None:
    """The engine, the window and the contracts, to change a copy and lint it."""
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("engine", "gui"):
        shutil.copytree(ROOT / name, to / name, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", to / "pyproject.toml")
