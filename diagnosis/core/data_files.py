"""Reading and checking the diagnosis data files (diagnosis/data/*.yaml, diagnosis/playbooks/*.md).

Every loader reports problems the same way: it collects them in a `Problems` list, going on past the
first, and raises one `DataError` naming every problem, each prefixed with where it is. A bad file then
stops the daemon at start-up with the whole list, instead of one fix per restart.
"""

from __future__ import annotations

import functools
import pickle
import re
from collections.abc import Hashable, Iterable, Mapping
from importlib import resources
from typing import Any, Protocol

from gpu_triage.diagnosis.core.actions import Action, Severity

# What a playbook id (and a playbook's file name) looks like.
PLAYBOOK_ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
# The severities a data file may state; UNKNOWN is for signals we cannot judge, never written down.
SEVERITIES = {s.value: s for s in (Severity.CRITICAL, Severity.WARNING, Severity.INFO)}


class DataError(ValueError):
    """A data file is invalid or the files disagree; `problems` lists every one found."""

    def __init__(self, what: str, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(f"{what}: {len(self.problems)} problem(s):\n  " + "\n  ".join(self.problems))


class Problems(list[str]):
    """Collects every problem instead of stopping at the first; each names where it is.

    `origin`, when given, is the file every problem is in; it goes before the `where` of each.
    """

    def __init__(self, origin: str = "") -> None:
        super().__init__()
        self.origin = origin

    def fail(self, where: str, message: str) -> None:
        self.append(": ".join([*(part for part in (self.origin, where) if part), message]))

    def raise_if_any(self, what: str) -> None:
        if self:
            raise DataError(what, self)

    def keys(self, where: str, node: object, required: set[str], optional: set[str] | None = None) -> dict[Any, Any]:
        """`node` when it is a mapping (else {}); reports unknown and missing keys."""
        if not isinstance(node, dict):
            self.fail(where, f"expected a mapping, got {type(node).__name__}")
            return {}
        for key in sorted(set(node) - required - (optional or set()), key=str):
            self.fail(where, f"unknown key {key!r}")
        for key in sorted(required - set(node)):
            self.fail(where, f"missing key {key!r}")
        return node

    def complete(self, where: str, node: object, required: set[str], optional: set[str] | None = None) -> bool:
        """Whether `node` is a mapping holding every required key; reports what is wrong with it."""
        return required <= set(self.keys(where, node, required, optional))

    def strings(self, where: str, node: object, *, allow_empty: bool = False) -> list[str]:
        if not isinstance(node, list) or not all(isinstance(s, str) and s for s in node):
            self.fail(where, "expected a list of non-empty strings")
            return []
        if not node and not allow_empty:
            self.fail(where, "must not be empty")
        return list(node)

    def action(self, where: str, value: object) -> Action | None:
        if isinstance(value, str) and value in Action.__members__:
            return Action[value]
        self.fail(where, f"action {value!r} is not one of {', '.join(Action)}")
        return None

    def severity(self, where: str, value: object) -> Severity | None:
        found = SEVERITIES.get(value) if isinstance(value, str) else None
        if found is None:
            self.fail(where, f"severity {value!r} is not one of {', '.join(SEVERITIES)}")
        return found

    def playbook(self, where: str, value: object) -> str:
        if not isinstance(value, str) or not PLAYBOOK_ID.fullmatch(value):
            self.fail(where, f"playbook id {value!r} is not lower-case words joined by dashes")
            return ""
        return value


@functools.cache
def _strict_loader() -> Any:
    """A YAML loader that records duplicate mapping keys, which plain loading silently resolves to the last
    one. On libyaml's parser where PyYAML was built with it (its wheels are): several times faster than
    the pure-Python one, which stays the fallback; both build the same documents. Made on first use, so
    that a process whose knowledge comes from the cache (diagnosis/knowledge/cache.py) never imports yaml."""
    import yaml

    base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class StrictLoader(base):  # type: ignore[misc]
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.duplicates: list[str] = []

        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Hashable, Any]:
            seen: set[tuple[str, str]] = set()
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    key = (key_node.tag, key_node.value)
                    if key in seen:
                        self.duplicates.append(f"line {key_node.start_mark.line + 1}: duplicate key {key[1]!r}")
                    seen.add(key)
            mapping: dict[Hashable, Any] = super().construct_mapping(node, deep)
            return mapping

    return StrictLoader


def parse_yaml(text: str, name: str, problems: Problems) -> Any:
    """A data file's YAML document (None when it is not YAML); its problems, duplicate keys too, go to `problems`."""
    import yaml

    loader = _strict_loader()(text)
    try:
        document = loader.get_single_data()
    except yaml.YAMLError as exc:
        problems.fail(name, f"not valid YAML: {exc}")
        return None
    finally:
        loader.dispose()
    for duplicate in loader.duplicates:
        problems.fail(name, duplicate)
    return document


def read_data(name: str) -> str:
    """The text of the shipped data file diagnosis/data/`name`."""
    return resources.files("gpu_triage.diagnosis").joinpath("data", name).read_text(encoding="utf-8")


class BlobStore(Protocol):
    """Bytes by key, kept between processes by the caller (exporter/cache_store.py): what is rebuilt only
    once per data version (diagnosis/knowledge/cache.py). `get` answers None for anything it cannot vouch for."""

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, data: bytes) -> None: ...


# Validated knowledge handed in whole (diagnosis/knowledge/cache.py adopts a snapshot it checked against the
# data files' digest): the loaders return it instead of parsing and checking the files again.
_ADOPTED: dict[str, Any] = {}


def adopted(name: str) -> Any | None:
    """What `knowledge.restore` handed in for loader `name` (None: parse the files). A part is unpickled
    when a loader first asks for it: `gpu-triage xid` reads the catalog, never the rules."""
    value = _ADOPTED.get(name)
    if isinstance(value, bytes):
        try:
            value = pickle.loads(value)
        except Exception:
            value = None  # the files are parsed instead
        _ADOPTED[name] = value
    return value


def adopt(parts: Mapping[str, Any]) -> None:
    """Hand in validated objects by loader name (`checked`: the files were checked against each other)."""
    _ADOPTED.update(parts)
