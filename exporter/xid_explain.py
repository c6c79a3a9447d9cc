"""What an XID code means, as `gpu-triage xid` and GET /api/v1/xid/{code} tell it: the catalog's entry and
its playbook. A module of its own so that the one-shot command imports the catalog and nothing else: the
answer is a TypedDict, which the route declares as its response model, rather than a pydantic model (whose
import alone would double the command's start-up)."""

from __future__ import annotations

from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only from Python 3.12

from gpu_triage.diagnosis.core.actions import Action, Severity
from gpu_triage.diagnosis.xid.catalog_data import load_catalog

__all__ = ["XidExplanation", "unknown_xid", "xid_json"]


class XidExplanation(TypedDict):
    """GET /api/v1/xid/{code}, `gpu-triage xid --json`: NVIDIA's catalog entry, our action, the playbook."""

    xid: int
    mnemonic: str
    nvidia_description: str
    title: str
    causes: list[str]
    severity: Severity
    action: Action
    action_description: str
    nvidia_immediate_bucket: str | None
    nvidia_investigatory_bucket: str | None
    deviation: str | None
    context: list[str]
    xid154_linked: bool
    applies_to: list[str]
    playbook: str
    runbook: str


def xid_json(code: int) -> XidExplanation | None:
    """What an XID code means and what to do about it, as the API answers; None for a code not in the catalog."""
    entry = load_catalog().get(code)
    if entry is None:
        return None
    return XidExplanation(
        xid=entry.code,
        mnemonic=entry.mnemonic,
        nvidia_description=entry.nvidia_description,
        title=entry.title,
        causes=list(entry.causes),
        severity=entry.severity,
        action=entry.action,
        action_description=entry.action.description,
        nvidia_immediate_bucket=entry.immediate_bucket,
        nvidia_investigatory_bucket=entry.investigatory_bucket,
        deviation=entry.deviation,
        context=sorted(entry.context),
        xid154_linked=entry.xid154_linked,
        applies_to=list(entry.applies_to),
        playbook=entry.playbook,
        runbook=f"/runbooks/{entry.playbook}",
    )


def unknown_xid(code: int) -> str:
    return f"Xid {code} is not in NVIDIA's catalog (this version knows {len(load_catalog())} codes)"
