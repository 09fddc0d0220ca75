"""The import graph of the engine and the window: no circles, no re-export shims, no
private names used across modules.

Every import counts, at the top of a module, inside a function or under
`TYPE_CHECKING`: a circle hidden in a function is still two modules that need each
other. A name is imported from the module that defines it, not from one that merely
imports it too (a package's `__init__` is its public face and may gather names).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from tests.helpers.imports import ROOT, copy_tree

PARTS = ("engine", "gui")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path) -> dict[str, Path]:
    return {_module_name(p, root): p for part in PARTS for p in (root / part).rglob("*.py")
            if "__pycache__" not in p.parts}


def _imports(path: Path, name: str) -> Iterator[ast.ImportFrom | ast.Import]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom | ast.Import):
            yield node


def _absolute(node: ast.ImportFrom, name: str, path: Path) -> str:
    if not node.level:
        return node.module or ""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _graph(root: Path) -> dict[str, set[str]]:
    """{module: the modules of the tree it imports}, every import counted."""
    modules = _modules(root)

    def owner(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str | None] = set()
        for node in _imports(path, name):
            if isinstance(node, ast.Import):
                targets |= {owner(a.name) for a in node.names}
                continue
            source = _absolute(node, name, path)
            targets |= {owner(f"{source}.{a.name}") if f"{source}.{a.name}" in modules
                        else owner(source) for a in node.names}
        graph[name] = {t for t in targets if t and t != name}
    return graph


def circles(root: Path) -> list[list[str]]:
    """The groups of modules that import each other, directly or round a loop (Tarjan)."""
    graph = _graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = [stack.pop()]
            while group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@cache
def _defined(path: Path) -> set[str]:
    """The names a module binds at its top level itself (not by importing them)."""
    names: set[str] = set()
    body = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.If | ast.Try):
            body += [*node.body, *node.orelse, *getattr(node, "finalbody", []),
                     *(s for h in getattr(node, "handlers", []) for s in h.body)]
    return names


def _engine_imports(root: Path) -> Iterator[tuple[str, str, str]]:
    """(where, module, name) of each `from engine.x import name` in the engine."""
    modules = _modules(root)
    for name, path in modules.items():
        if not name.startswith("engine"):
            continue
        for node in _imports(path, name):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _absolute(node, name, path)
            for alias in node.names:
                if source in modules and f"{source}.{alias.name}" not in modules:
                    where = f"{path.relative_to(root)}:{node.lineno}"
                    yield where, source, alias.name


def test_no_module_imports_itself_round_a_circle() -> None:
    assert circles(ROOT) == []


def test_a_circle_hidden_under_type_checking_is_found(tmp_path: Path) -> None:
    """prompts needed voice for a type hint while voice imported prompts: one circle."""
    copy_tree(tmp_path)
    prompts = tmp_path / "engine" / "layout" / "prompts.py"
    prompts.write_text(prompts.read_text(encoding="utf-8") + "\n\nif TYPE_CHECKING:\n"
                       "    from engine.layout.voice import Voice  # noqa: F401\n",
                       encoding="utf-8")
    assert circles(tmp_path) == [["engine.layout.prompts", "engine.layout.voice"]]


def test_names_come_from_their_homes() -> None:
    """No shim: a name is imported from the module that defines it."""
    modules = _modules(ROOT)
    shims = [f"{where} {module}.{name}" for where, module, name in _engine_imports(ROOT)
             if not modules[module].name == "__init__.py"
             and name not in _defined(modules[module])]
    assert shims == []


def test_private_names_stay_in_their_module() -> None:
    private = [f"{where} {module}.{name}" for where, module, name in _engine_imports(ROOT)
               if name.startswith("_") and not name.startswith("__")]
    assert private == []
