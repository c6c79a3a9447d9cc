"""The shipped alerting files, parsed once for the tests of this package."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO

ALERTS = REPO / "alerts"
RULES = ALERTS / "gpu-triage.rules.yml"
ALERTMANAGER = ALERTS / "alertmanager.yml"
RULE_TESTS = sorted((ALERTS / "tests").glob("*.yml"))
PLAYBOOKS = REPO / "diagnosis" / "playbooks"
XID_PATTERN = re.compile(r'xid=~"([0-9|]+)"')


@dataclass(frozen=True)
class Rule:
    group: str
    body: dict[str, Any]

    @property
    def alert(self) -> str:
        return str(self.body["alert"])

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.body.get("labels") or {})

    @property
    def annotations(self) -> dict[str, str]:
        return dict(self.body.get("annotations") or {})


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def alert_rules(text: str | None = None) -> list[Rule]:
    doc = yaml.safe_load(text if text is not None else RULES.read_text(encoding="utf-8"))
    return [Rule(g["name"], r) for g in doc["groups"] for r in g["rules"] if "alert" in r]


def alert_names() -> list[str]:
    return sorted({r.alert for r in alert_rules()})
