"""The backends import one way: no module of exporter/backends/ imports, even only for type hints, one
that imports it back (readers take a protocol of their backend, not the backend class)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

ROOT = REPO / "exporter/backends"
PREFIX = "gpu_triage.exporter.backends"


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join((PREFIX, *(parts[:-1] if parts[-1] == "__init__" else parts)))


def _graph() -> dict[str, set[str]]:
    modules = {_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
                deps |= subs or ({node.module} & modules.keys())
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names} & modules.keys()
        graph[name] = deps - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while (w := stack.pop()) != v:
                component.add(w)
            if component:
                out.append(frozenset({v, *component}))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_in_the_backends() -> None:
    assert [sorted(c) for c in _cycles(_graph())] == []


def test_the_check_sees_a_cycle_through_a_type_hint() -> None:
    graph = _graph()
    graph[f"{PREFIX}.nvml.readers"].add(f"{PREFIX}.nvml.backend")  # what `if TYPE_CHECKING:` used to add
    assert any(f"{PREFIX}.nvml.backend" in c for c in _cycles(graph))
