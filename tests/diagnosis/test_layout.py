"""diagnosis/ laid out by pipeline: its sub-packages import one way, in the order `LAYERS` declares, with no
import cycle anywhere, no module over `MAX_LINES` lines and no folder of more than `MAX_MODULES` modules; it
never reaches into exporter/ and never reads process state. Read from the source with `ast`, so every
import counts: those inside functions and those only for typing (`if TYPE_CHECKING:`) too."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGE = "gpu_triage.diagnosis"
ROOT = REPO / "diagnosis"
MAX_LINES = 300
MAX_MODULES = 12

# Lowest first: a module imports from its own layer and the layers before it, never from one after it.
# A module's layer is the longest of these its package starts with (`training` holds training/*.py,
# the pipeline that runs the stages of the training.* layers before it).
LAYERS = (
    "core",  # the shared vocabulary: actions, findings, PCI ids, log stamps, line scanning, data files
    "xid",  # the node's verdict: kernel-log events, the XID catalog, incidents, health
    "performance",  # why a job is slow: telemetry windows and their rules
    "training.input",  # training logs: wrapped text rejoined, a line split into message and printer
    "training.rules",  # the training-log rules, loaded and checked
    "training.scan",  # which lines deserve a look
    "training.place",  # who printed a line
    "training.findings",  # findings collapsed, settled, ordered root cause first, folded
    "training.hang",  # Flight Recorder dumps and NCCL RAS output
    "training",  # the pipeline that runs the stages, and its report
    "knowledge",  # every data file checked against the others, and cached
)


def module_name(path: Path, root: Path = ROOT, package: str = PACKAGE) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((package, *parts))


def modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    return {module_name(p, root, package): p for p in sorted(root.rglob("*.py"))}


def imports(path: Path) -> set[str]:
    """Every gpu_triage name `path` imports, wherever in the file the import is (typing-only ones too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            assert node.level == 0, f"{path}: relative import of {node.module}"
            found.add(node.module)
            # `from gpu_triage.diagnosis.xid import health` imports the module gpu_triage.diagnosis.xid.health
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("gpu_triage.")}


def graph(found: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the diagnosis modules it imports (names that are a module's attribute dropped)."""
    return {name: (imports(path) & found.keys()) - {name} for name, path in found.items()}


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


def layer(name: str, layers: tuple[str, ...] = LAYERS, package: str = PACKAGE) -> int | None:
    """The index in `layers` of the module's layer; None for the package itself or a module of none."""
    inner = name.removeprefix(f"{package}.")
    best: int | None = None
    for i, prefix in enumerate(layers):
        inside = inner == prefix or inner.startswith(f"{prefix}.")
        if inside and (best is None or len(prefix) > len(layers[best])):
            best = i
    return best


def against_order(edges: dict[str, set[str]], layers: tuple[str, ...] = LAYERS) -> list[str]:
    """Each import of a module from a later layer than its own, as `importer -> imported`."""
    wrong: list[str] = []
    for name, deps in sorted(edges.items()):
        mine = layer(name, layers)
        for dep in sorted(deps):
            theirs = layer(dep, layers)
            if mine is not None and theirs is not None and theirs > mine:
                wrong.append(f"{name} ({layers[mine]}) -> {dep} ({layers[theirs]})")
    return wrong


def too_long(found: dict[str, Path], limit: int = MAX_LINES) -> dict[str, int]:
    counts = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in found.items()}
    return {name: n for name, n in counts.items() if n > limit}


def crowded(root: Path = ROOT, limit: int = MAX_MODULES) -> dict[str, int]:
    """Folders of more than `limit` modules (a package's __init__.py is not one)."""
    folders = {p.parent for p in root.rglob("*.py")}
    counts = {
        str(f.relative_to(root.parent)): len([p for p in f.glob("*.py") if p.stem != "__init__"]) for f in folders
    }
    return {folder: n for folder, n in counts.items() if n > limit}


# -- the checkers catch what they are for -----------------------------------------------------------------


def test_the_checker_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_the_checkers_find_a_typing_only_cycle_an_upward_import_and_a_long_module(tmp_path: Path) -> None:
    pkg = tmp_path / "diagnosis"
    (pkg / "low").mkdir(parents=True)
    (pkg / "high").mkdir()
    (pkg / "low" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpu_triage.diagnosis.high.b import B\n"
    )
    (pkg / "high" / "b.py").write_text("from gpu_triage.diagnosis.low import a\n" + "x = 1\n" * (MAX_LINES + 1))
    for i in range(MAX_MODULES + 1):
        (pkg / "high" / f"m{i}.py").write_text("")
    found = modules(pkg)
    edges = graph(found)
    assert cycles(edges) == [[f"{PACKAGE}.high.b", f"{PACKAGE}.low.a", f"{PACKAGE}.high.b"]]
    assert against_order(edges, ("low", "high")) == [f"{PACKAGE}.low.a (low) -> {PACKAGE}.high.b (high)"]
    assert too_long(found) == {f"{PACKAGE}.high.b": MAX_LINES + 2}
    assert crowded(pkg) == {"diagnosis/high": MAX_MODULES + 2}


def test_a_module_belongs_to_its_longest_layer() -> None:
    assert layer(f"{PACKAGE}.training.diagnose") == LAYERS.index("training")
    assert layer(f"{PACKAGE}.training.rules.load") == LAYERS.index("training.rules")
    assert layer(f"{PACKAGE}.trainingx.y") is None


# -- diagnosis/ as it is ------------------------------------------------------------------------------------


def test_every_module_has_a_layer() -> None:
    found = modules()
    assert len(found) > 40  # the walk saw the sub-packages
    assert [name for name in found if name != PACKAGE and layer(name) is None] == []


def test_no_import_cycle_inside_diagnosis() -> None:
    found = cycles(graph(modules()))
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_imports_follow_the_declared_order() -> None:
    assert against_order(graph(modules())) == []


def test_no_module_is_over_the_line_limit() -> None:
    assert too_long(modules()) == {}


def test_no_folder_is_a_long_flat_list() -> None:
    assert crowded() == {}


def test_diagnosis_never_imports_the_exporter() -> None:
    leaks = {name: sorted(i for i in imports(p) if not i.startswith(PACKAGE)) for name, p in modules().items()}
    assert {name: deps for name, deps in leaks.items() if deps} == {}


def test_diagnosis_reads_no_process_state() -> None:
    """Configuration (the scan engine, say) comes in as arguments: diagnosis/ never reads the
    environment or the command line, so the same input always gives the same report."""
    readers: dict[str, list[str]] = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                readers.setdefault(name, []).extend(n for n in names if n in ("os", "sys"))
            elif isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb", "argv"):
                readers.setdefault(name, []).append(node.attr)
    assert {name: found for name, found in readers.items() if found} == {}
