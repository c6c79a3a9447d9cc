"""Every kustomization renders with every kubectl at hand, and every object it renders is valid, offline."""

from __future__ import annotations

import copy
import json
import socket
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.kubernetes.manifests import (
    CRD_SCHEMAS,
    KUBERNETES_VERSIONS,
    KUSTOMIZATIONS,
    Obj,
    kubectls,
    one,
    render,
    validate,
)


def _key(o: Obj) -> tuple[str, str, str]:
    return o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]


def test_there_are_overlays() -> None:
    assert {"base", "overlays/gpu-operator", "overlays/node-condition", "overlays/unprivileged"} <= set(KUSTOMIZATIONS)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_renders_the_same_with_every_kubectl(kustomization: str) -> None:
    renders = {k: sorted(render(kustomization, k), key=_key) for k in kubectls()}
    first = next(iter(renders.values()))
    assert first, f"{kustomization} renders nothing"
    for kubectl, objects in renders.items():
        assert objects == first, f"{kubectl} renders {kustomization} differently"
    assert len({_key(o) for o in first}) == len(first), "an object is rendered twice"


def test_the_top_folder_renders_the_base() -> None:
    """`kubectl kustomize kubernetes/`, as users try first, is the base, with every kubectl."""
    for kubectl in kubectls():
        assert sorted(render(".", kubectl), key=_key) == sorted(render("base", kubectl), key=_key), kubectl


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation must not fetch anything: every socket this process opens fails."""

    def refuse(*args: Any, **kwargs: Any) -> socket.socket:
        raise AssertionError("validation tried to open a network connection")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_object_is_valid(kustomization: str, version: str, no_network: None) -> None:
    objects = render(kustomization)
    problems = []
    for obj in objects:
        try:
            validate(obj, version)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as e:
            where = ".".join(str(p) for p in e.path)
            problems.append(f"{obj['kind']}/{obj['metadata']['name']}: {where}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            problems.append(f"{obj['kind']}/{obj['metadata']['name']}: no schema to check it with: {e.message}")
    assert not problems, "\n".join(problems)


def test_the_custom_resources_are_checked_by_the_crd_schemas() -> None:
    kinds = {(o["apiVersion"], o["kind"]) for o in render("base")}
    assert set(CRD_SCHEMAS) <= kinds


# The validation is not vacuous: a typo or a wrong type in what we ship would be caught.
@pytest.mark.parametrize(
    ("kind", "break_it"),
    [
        (
            "DaemonSet",
            lambda o: o["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"].update(paht="/"),
        ),
        (
            "DaemonSet",
            lambda o: o["spec"]["template"]["spec"]["containers"][0]["ports"][0].update(containerPort="9481"),
        ),
        ("Service", lambda o: o["spec"].update(publishNotReady=True)),
        ("ServiceMonitor", lambda o: o["spec"]["endpoints"][0].update(prot="metrics")),
        ("ServiceMonitor", lambda o: o["spec"]["endpoints"][0].update(interval=30)),
        ("PrometheusRule", lambda o: o["spec"]["groups"][0]["rules"][0].update(fro="1m")),
        ("PrometheusRule", lambda o: o["spec"]["groups"][0].pop("name")),
    ],
)
def test_a_broken_object_is_refused(kind: str, break_it: Any) -> None:
    obj = copy.deepcopy(one(render("base"), kind))
    break_it(obj)
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        validate(obj, KUBERNETES_VERSIONS[-1])


def test_rendered_objects_fit_kubectl_apply() -> None:
    # Client-side `kubectl apply` keeps the whole object in an annotation limited to 256 KiB.
    for obj in render("base"):
        assert len(json.dumps(obj)) < 256 * 1024, f"{obj['kind']}/{obj['metadata']['name']} is too big"
