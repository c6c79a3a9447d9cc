"""Rendering kubernetes/ with the real kubectl, and validating what it renders, offline.

`kubectl` on PATH renders every kustomization; GPU_TRIAGE_KUBECTLS (paths, ':'-separated) adds more, such
as Debian's kubectl 1.20, whose kustomize v2.0.3 .ci/run also renders with. Built-in kinds are validated
against the Kubernetes OpenAPI schemas that the kubernetes-validate package bundles (strict: an unknown
field is an error, as `kubectl apply` makes it since 1.27); ServiceMonitor and PrometheusRule against
prometheus-operator's CRD schemas in kubernetes/schemas/, made strict the same way.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from tests.conftest import REPO, require_tool

KUBERNETES = REPO / "kubernetes"
KUSTOMIZATIONS = ["base", *sorted(f"overlays/{p.name}" for p in (KUBERNETES / "overlays").iterdir() if p.is_dir())]
SCHEMAS = KUBERNETES / "schemas"
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SCHEMAS / "monitoring.coreos.com_servicemonitors.v1.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): SCHEMAS / "monitoring.coreos.com_prometheusrules.v1.yaml",
}
# The oldest and the newest Kubernetes whose schemas kubernetes-validate bundles.
KUBERNETES_VERSIONS = [kubernetes_validate.utils.all_versions()[0], kubernetes_validate.utils.latest_version()]

Obj = dict[str, Any]


def kubectls() -> list[str]:
    extra = [p for p in os.environ.get("GPU_TRIAGE_KUBECTLS", "").split(":") if p]
    return [require_tool("kubectl"), *extra]


@functools.cache
def _render(kubectl: str, kustomization: str) -> tuple[Obj, ...]:
    result = subprocess.run(
        [kubectl, "kustomize", str(KUBERNETES / kustomization)], check=False, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise AssertionError(f"{kubectl} kustomize {kustomization} failed:\n{result.stderr}")
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def render(kustomization: str, kubectl: str | None = None) -> list[Obj]:
    return list(_render(kubectl or kubectls()[0], kustomization))


def by_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[Obj], kind: str) -> Obj:
    (found,) = by_kind(objects, kind)
    return found


def pod_spec(objects: list[Obj]) -> Obj:
    spec: Obj = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def container(objects: list[Obj], name: str = "gpu-triage") -> Obj:
    (found,) = [c for c in pod_spec(objects)["containers"] if c["name"] == name]
    return found


def all_containers(objects: list[Obj]) -> Iterator[Obj]:
    spec = pod_spec(objects)
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def flag(args: list[str], name: str) -> str | None:
    """The value of --name=VALUE or --name VALUE in `args`."""
    for i, arg in enumerate(args):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
        if arg == f"--{name}" and i + 1 < len(args):
            return args[i + 1]
    return None


def strict(schema: Any) -> Any:
    """`schema` with additionalProperties: false on every object schema that lists its properties and does
    not say it keeps unknown fields: what the API server's strict field validation enforces."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        k: strict(v) if k in ("items", "additionalProperties", "anyOf", "allOf", "oneOf", "not") else v
        for k, v in schema.items()
    }
    if "properties" in schema:
        out["properties"] = {k: strict(v) for k, v in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in schema:
            out["additionalProperties"] = False
    return out


@functools.cache
def crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    schema = strict(yaml.safe_load(CRD_SCHEMAS[(api_version, kind)].read_text()))
    # OpenAPI 3.0 schema objects follow JSON Schema draft 4 (boolean exclusiveMinimum and so on).
    validator: jsonschema.protocols.Validator = jsonschema.Draft4Validator(schema)
    return validator


def validate(obj: Obj, version: str) -> None:
    """Raise (jsonschema.ValidationError or kubernetes_validate's errors) unless `obj` is valid."""
    key = (obj["apiVersion"], obj["kind"])
    if key in CRD_SCHEMAS:
        crd_validator(*key).validate(obj)
    else:
        kubernetes_validate.validate(obj, version, strict=True)
