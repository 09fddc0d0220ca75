"""The suite's own layout: no test file imports another (shared code and fixtures live in
tests/helpers/), and no module path handed to a worker names a test file."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _imported(path: Path) -> set[str]:
    """Every module `path` imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            if node.module == "tests":  # `from tests import test_x`
                found |= {f"tests.{a.name}" for a in node.names}
    return found


def test_no_test_file_imports_another() -> None:
    sources = [*TESTS.glob("*.py"), *TESTS.glob("helpers/*.py"), *ROOT.glob("bench/*.py")]
    assert len(sources) > 50
    bad = {}
    for path in sources:
        wrong = sorted(m for m in _imported(path)
                       if re.fullmatch(r"tests\.(test_\w+|conftest|fixtures_\w+|parity)", m))
        if wrong:
            bad[str(path.relative_to(ROOT))] = wrong
    assert bad == {}, "move what they share to tests/helpers/"


def test_builders_named_by_module_path_are_in_helpers_or_their_own_file() -> None:
    # a "module:function" string a worker imports: another test file imported there would
    # run that file's module-level code in every worker
    named = {}
    for path in TESTS.glob("*.py"):
        own = f"tests.{path.stem}"
        for module in re.findall(r"[\"'](tests\.[\w.]+):\w+[\"']", path.read_text("utf-8")):
            named.setdefault(module, set()).add(own)
    assert "tests.helpers.builders" in named, "no shared builder found: update this test"
    wrong = {m: users for m, users in named.items()
             if not m.startswith("tests.helpers.") and users != {m}}
    assert wrong == {}
