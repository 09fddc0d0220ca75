"""What the window may use of the engine (pyproject.toml, "the window uses the engine's light
modules only"): the rules it shows are asked of light engine modules, never written again,
and the engine's machinery stays in the engine's process."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.helpers.imports import ROOT, copy_tree, lint_imports

NAME = "the window uses the engine's light modules only"


def _contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return next(c for c in config["tool"]["importlinter"]["contracts"] if c["name"] == NAME)


def test_every_part_of_the_engine_is_allowed_or_forbidden_by_name() -> None:
    contract = _contract()
    allowed = {"catalog", "config", "core", "layout"}
    forbidden = {m.removeprefix("engine.") for m in contract["forbidden_modules"]}
    children = {p.stem if p.suffix else p.name for p in (ROOT / "engine").iterdir()
                if (p.suffix == ".py" and p.stem != "__init__")
                or (p.is_dir() and any(p.glob("*.py")))}
    assert not allowed & forbidden
    assert allowed | forbidden == children, children - allowed - forbidden


def test_the_window_breaks_the_contract_by_importing_the_trainer(tmp_path: Path) -> None:
    copy_tree(tmp_path)
    page = tmp_path / "gui" / "pages" / "train" / "settings.py"
    page.write_text(page.read_text(encoding="utf-8")
                    + "\n\nfrom engine.train.driver import train  # noqa: E402,F401\n",
                    encoding="utf-8")
    proc = lint_imports(tmp_path)
    assert proc.returncode != 0, proc.stdout
    assert f"{NAME} BROKEN" in proc.stdout, proc.stdout
    assert "gui.pages.train.settings -> engine.train.driver" in proc.stdout, proc.stdout
    # the tree as it is keeps it
    kept = lint_imports(ROOT)
    assert f"{NAME} KEPT" in kept.stdout, kept.stdout
