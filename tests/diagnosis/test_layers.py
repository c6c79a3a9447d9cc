"""diagnosis/ imports run one way (vocabulary, data files, catalog and rules, classifiers, verdict) and never
reach into exporter/: read from the source, every import counts, those inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGE = "gpu_triage.diagnosis"


def imports(path: Path) -> set[str]:
    """Every gpu_triage module `path` imports, wherever in the file the import is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            assert node.level == 0, f"{path.name}: relative import of {node.module}"
            found.add(node.module)
            # `from gpu_triage.diagnosis import training` imports the module gpu_triage.diagnosis.training
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("gpu_triage.")}


def graph() -> dict[str, set[str]]:
    modules = {f"{PACKAGE}.{p.stem}": p for p in sorted((REPO / "diagnosis").glob("*.py")) if p.stem != "__init__"}
    return {name: imports(path) for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each module that is on one (depth-first search, grey/black marking)."""
    found: list[list[str]] = []
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, set()) & edges.keys()):
            if state.get(nxt) == "open":
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def test_the_checker_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_import_cycle_inside_diagnosis() -> None:
    edges = graph()
    assert len(edges) > 10  # the walk saw the package
    found = cycles(edges)
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_diagnosis_never_imports_the_exporter() -> None:
    leaks = {name: sorted(i for i in deps if not i.startswith(PACKAGE)) for name, deps in graph().items()}
    assert {name: deps for name, deps in leaks.items() if deps} == {}


def test_diagnosis_reads_no_process_state() -> None:
    """Configuration (the scan engine, say) comes in as arguments: diagnosis/ never reads the
    environment or the command line, so the same input always gives the same report."""
    readers: dict[str, list[str]] = {}
    for path in sorted((REPO / "diagnosis").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                readers.setdefault(path.name, []).extend(n for n in names if n in ("os", "sys"))
            elif isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb", "argv"):
                readers.setdefault(path.name, []).append(node.attr)
    assert {name: found for name, found in readers.items() if found} == {}
