"""ruff's rules (pyproject.toml [tool.ruff]) hold over the whole tree, in the suite, so
CI fails on a function that grows past 8 arguments or complexity 15 (PLR0913, C901)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).parent / "ruff"


def test_ruff_is_clean() -> None:
    out = subprocess.run([str(RUFF), "check", "--no-cache", "--output-format", "concise",
                          "engine", "gui", "tests", "bench", "packaging"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_size_rules_are_on() -> None:
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert {"C901", "PLR0913"} <= set(lint["select"])
    # imports at the top; the start-up seams are named (docs/dev/architecture.md)
    assert "PLC0415" in lint["select"]
    assert lint["mccabe"]["max-complexity"] == 15 and lint["pylint"]["max-args"] == 8
