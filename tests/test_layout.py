"""The package layout rules of docs/architecture.md, checked on the source tree.

Packages form floors: each may import only from packages on lower floors (or
from itself). No import circles between modules, no two modules with the same
name, no module over 400 lines and no function over 60 lines.
"""

from __future__ import annotations

import ast
import collections
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "stageopt"
# Bottom floor first; a package imports only from packages before it in this list.
FLOORS = ["errors", "_deprecated", "console", "inputs", "model", "frameworks", "graph", "parallel", "hardware", "workload", "launch", "chakra", "astrasim",
          "program", "sim", "serving", "search", "validation", "commands", "cli"]


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(name: str, path: pathlib.Path, mods: dict[str, pathlib.Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        found |= {t for t in targets if t in mods and t != name}
    return found


def _floor(module: str) -> int:
    parts = module.split(".")
    return FLOORS.index(parts[1] if len(parts) > 1 else "cli")


def test_every_package_has_a_floor():
    tops = {p.name.removesuffix(".py") for p in ROOT.iterdir() if p.suffix == ".py" or p.is_dir()}
    tops -= {"__init__", "__pycache__"}
    assert sorted(tops - set(FLOORS)) == []


def test_imports_only_go_down():
    mods = _modules()
    upward = [f"{a} -> {b}" for a, p in mods.items() if a != "stageopt" for b in _imports(a, p, mods)
              if b != "stageopt" and _floor(b) > _floor(a)]
    assert upward == []


def test_no_import_circles():
    mods = _modules()
    edges = {a: {b for b in _imports(a, p, mods) if not mods[b].name == "__init__.py"} for a, p in mods.items()}
    state: dict[str, int] = collections.defaultdict(int)
    circles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state[nxt] == 1:
                circles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif state[nxt] == 0:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for start in sorted(edges):
        if state[start] == 0:
            visit(start, [start])
    assert circles == []


def test_module_names_are_unique():
    names = collections.defaultdict(list)
    for name, path in _modules().items():
        if name != "stageopt":
            names[name.rsplit(".", 1)[-1]].append(name)
    assert {k: v for k, v in names.items() if len(v) > 1} == {}


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_and_function_size(path):
    source = path.read_text()
    assert source.count("\n") <= 400, f"{path.name} has {source.count(chr(10))} lines"
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 60]
    assert long == []


def test_every_package_says_what_it_owns():
    for init in ROOT.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "Owns" in doc or "owns" in doc, f"{init.parent.name}/__init__.py docstring must say what it owns"
