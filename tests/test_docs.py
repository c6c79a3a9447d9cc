"""The files a maintainer looks for first stay true: LICENSE, CHANGELOG.md, CONTRIBUTING.md and
docs/architecture.md. Every repository path those guides name in backticks exists (a `<placeholder>`
matches at least one file, `file.py::test_name` names a test that is there), and every relative link
in them and in the README resolves, so a guide cannot go stale without the suite saying so."""

from __future__ import annotations

import re
import tomllib

import pytest

from gpu_triage import __version__
from tests.conftest import REPO

GUIDES = ("CONTRIBUTING.md", "docs/architecture.md")
# The words of a code span that are paths in the repository: with a folder or a file suffix, no $, {}, quotes
# or brackets (a template, a call), not a URL path, a flag or the virtual environment.
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_SPAN = re.compile(r"`([^`]+)`")
_SUFFIXES = (".py", ".md", ".yml", ".yaml", ".json", ".c", ".h", ".txt", ".prom", ".toml", ".log", ".csv")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def named_paths(text: str) -> list[str]:
    out = []
    for word in (w for span in _SPAN.findall(_FENCE.sub("", text)) for w in span.split()):
        path = word.split("::", 1)[0]
        if path.startswith(("/", "-", ".venv/", "http")) or any(c in path for c in "${}\"'()"):
            continue
        if "/" in path or path.endswith(_SUFFIXES):
            out.append(word)
    return out


def _exists(token: str) -> bool:
    path, _, test = token.partition("::")
    pattern = re.sub(r"<[^>]+>", "*", path)
    found = sorted(REPO.glob(pattern.rstrip("/"))) if "*" in pattern else [REPO / path]
    found = [p for p in found if p.exists() and (p.is_dir() or not path.endswith("/"))]
    if not found:
        return False
    return not test or re.search(rf"^def {re.escape(test)}\(", found[0].read_text(), re.M) is not None


@pytest.mark.parametrize("guide", GUIDES)
def test_every_path_a_guide_names_exists(guide: str) -> None:
    named = named_paths((REPO / guide).read_text())
    assert len(named) >= 30, named  # the guides name their files: a pattern that finds none is broken
    assert [t for t in named if not _exists(t)] == []


def test_a_path_that_is_gone_is_caught() -> None:
    assert named_paths("see `exporter/backends/readings.py` and `make test`, `--update-golden`") == [
        "exporter/backends/readings.py"
    ]
    assert _exists("diagnosis/playbooks/xid-<code>.md") and _exists("tests/golden/")
    assert not _exists("exporter/backends/gone.py") and not _exists("diagnosis/playbooks/<id>.yaml")
    assert not _exists("tests/test_docs.py::test_that_does_not_exist")


@pytest.mark.parametrize("doc", ["README.md", "CHANGELOG.md", *GUIDES])
def test_relative_links_resolve(doc: str) -> None:
    base = (REPO / doc).parent
    targets = [t.split("#", 1)[0] for t in _LINK.findall((REPO / doc).read_text()) if "://" not in t]
    assert [t for t in targets if t and not (base / t).exists()] == []


def test_the_readme_points_at_the_guides() -> None:
    readme = (REPO / "README.md").read_text()
    for name in ("docs/architecture.md", "CONTRIBUTING.md", "CHANGELOG.md", "LICENSE"):
        assert f"]({name})" in readme, name


def test_the_license_is_the_one_pyproject_declares() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]
    assert declared == "Apache-2.0"
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_the_changelog_keeps_unreleased_on_top_and_names_this_version() -> None:
    versions = re.findall(r"^## \[([^\]]+)\]", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert versions[0] == "Unreleased"
    assert __version__ in versions
