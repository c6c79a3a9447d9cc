"""The shipped XID catalog documents, parsed, for tests that change them and build a catalog of their own."""

from __future__ import annotations

from typing import Any

from gpu_triage.diagnosis.core.data_files import Problems, parse_yaml, read_data
from gpu_triage.diagnosis.xid.catalog import XidCatalog
from gpu_triage.diagnosis.xid.catalog_data import DATA_FILES, build_catalog


def documents() -> dict[str, Any]:
    """A fresh copy of each data file's document, by file name."""
    out = {}
    for name in DATA_FILES:
        problems = Problems()
        out[name] = parse_yaml(read_data(name), name, problems)
        assert problems == []
    return out


def build(docs: dict[str, Any]) -> XidCatalog:
    return build_catalog(*(docs[name] for name in DATA_FILES))
