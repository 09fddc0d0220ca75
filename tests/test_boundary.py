"""The engine never imports Qt; the GUI never imports torch, ray or the model code."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules(package: str) -> list[str]:
    names = [package]
    for info in pkgutil.walk_packages([str(ROOT / package)], prefix=package + "."):
        names.append(info.name)
    return names


def _loaded_after_import(modules: list[str], forbidden: list[str]) -> dict[str, list[str]]:
    code = (
        "import importlib, sys, json\n"
        f"mods = {modules!r}\nforbidden = {forbidden!r}\nbad = {{}}\n"
        "for m in mods:\n"
        "    importlib.import_module(m)\n"
        "    hit = [f for f in forbidden if f in sys.modules]\n"
        "    if hit: bad[m] = hit\n"
        "print(json.dumps(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True, env=None)
    import json

    return json.loads(out.stdout.strip().splitlines()[-1])


def test_engine_never_imports_qt() -> None:
    modules = _modules("engine")
    assert len(modules) > 5
    bad = _loaded_after_import(modules, ["PySide6", "PyQt5", "PyQt6", "pyqtgraph", "gui"])
    assert bad == {}


def test_gui_never_imports_torch_ray_or_model_code() -> None:
    if not (ROOT / "gui").is_dir():
        raise AssertionError("gui/ is missing")
    modules = _modules("gui")
    bad = _loaded_after_import(modules, ["torch", "ray", "transformers", "qwen_tts"])
    assert bad == {}


def test_boundary_holds_in_source_text() -> None:
    # Catches imports hidden inside functions, which importing alone would miss.
    import re

    qt = re.compile(r"^\s*(from|import)\s+(PySide6|PyQt\d|pyqtgraph|gui)\b", re.M)
    heavy = re.compile(r"^\s*(from|import)\s+(torch|ray|transformers|qwen_tts)\b", re.M)
    offenders = [str(p) for p in (ROOT / "engine").rglob("*.py") if qt.search(p.read_text())]
    offenders += [str(p) for p in (ROOT / "gui").rglob("*.py") if heavy.search(p.read_text())]
    assert offenders == []


def _bundle_excludes() -> list[str]:
    """The packages the window's PyInstaller bundle leaves out (packaging/voxshard.spec)."""
    import ast

    tree = ast.parse((ROOT / "packaging" / "voxshard.spec").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "excludes" for t in node.targets):
            return [str(x) for x in ast.literal_eval(node.value)]
    raise AssertionError("packaging/voxshard.spec has no `excludes` list")


def test_the_window_imports_nothing_its_bundle_leaves_out() -> None:
    # every engine module the window names, at the top of a file or inside a function:
    # importing one must not load a package the frozen app does not have
    import re

    named = re.compile(r"^\s*(?:from|import)\s+(engine(?:\.\w+)*)", re.M)
    modules = sorted({m for p in (ROOT / "gui").rglob("*.py") for m in named.findall(
        p.read_text())})
    assert len(modules) > 5
    excluded = [e for e in _bundle_excludes() if "." not in e]
    # scipy and pyloudnorm are the window's too: the Record page judges a take with
    # Prepare's own judge (engine.prepare.check), whose loudness meter needs them
    assert "torch" in excluded and "starlette" in excluded and "scipy" not in excluded
    assert _loaded_after_import(modules, excluded) == {}
