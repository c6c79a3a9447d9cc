"""exporter/vgpu/ sits beside the backends: it uses the simulator, and nothing of the HTTP layer or the
daemon's settings (exporter/http/vgpu_app.py serves its fault API, depending on it, not the other way)."""

from __future__ import annotations

import ast

from tests.conftest import REPO

FORBIDDEN = ("gpu_triage.exporter.http", "gpu_triage.exporter.settings", "gpu_triage.exporter.daemon", "fastapi")


def _imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def test_the_virtual_gpu_package_imports_nothing_of_the_web_side() -> None:
    found = {
        f"{path.name}: {name}"
        for path in (REPO / "exporter/vgpu").glob("*.py")
        for name in _imports(path.read_text())
        if name.startswith(FORBIDDEN)
    }
    assert found == set()


def test_the_check_sees_such_an_import() -> None:
    assert any(n.startswith(FORBIDDEN) for n in _imports("from gpu_triage.exporter.http.sim_faults import x"))
