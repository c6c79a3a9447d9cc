"""What an XID code means, as `gpu-triage xid` and GET /api/v1/xid/{code} tell it: the catalog's entry and
its playbook. A module of its own so that the one-shot command imports the catalog and nothing else."""

from __future__ import annotations

from gpu_triage.diagnosis.xid_data import load_catalog
from gpu_triage.exporter.http.api_models import XidExplanation

__all__ = ["unknown_xid", "xid_json"]


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
