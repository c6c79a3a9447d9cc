"""The vocabulary of verdicts: what an operator should do, how bad it is, and how a GPU stands.

Every finding, XID catalog entry and training-log rule names one `Action` and one `Severity`.
The order of `Action` members is the order of precedence when several findings compete for one
GPU's recommended action: the most disruptive action that is still needed wins, because doing it
also covers the lighter ones (a reboot resets every GPU; an RMA ticket comes before any reboot).
"""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    """What to do now. Mapping to NVIDIA's resolution buckets and to peer tools: `ACTION_MAPPINGS`."""

    CONTACT_SUPPORT = "CONTACT_SUPPORT"  # drain the node, open an RMA / support case
    REBOOT_NODE = "REBOOT_NODE"
    DRAIN_AND_RESET = "DRAIN_AND_RESET"  # stop new work, let jobs finish, then reset the GPU
    RESET_GPU = "RESET_GPU"
    RESTART_FABRIC_MANAGER = "RESTART_FABRIC_MANAGER"
    CHECK_MECHANICALS = "CHECK_MECHANICALS"  # seating, power cables, risers
    CHECK_COOLING = "CHECK_COOLING"
    CHECK_LINKS = "CHECK_LINKS"  # NVLink / InfiniBand / PCIe links, cables, transceivers
    RUN_DIAGNOSTICS = "RUN_DIAGNOSTICS"  # DCGM diag level 3/4, field diagnostics
    UPDATE_SOFTWARE = "UPDATE_SOFTWARE"  # driver, firmware, NCCL, CUDA
    FIX_CONFIG = "FIX_CONFIG"  # job or node configuration: env vars, /dev/shm, ulimits, ports
    CHECK_APP = "CHECK_APP"  # a bug in the application; debug it before rerunning
    RESTART_APP = "RESTART_APP"
    IGNORE = "IGNORE"

    @property
    def rank(self) -> int:
        """Lower is more urgent; used to pick one action among many."""
        return _ORDER[self]

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]


_ORDER = {action: i for i, action in enumerate(Action)}

_DESCRIPTIONS = {
    Action.CONTACT_SUPPORT: "Drain the node and open a support / RMA case; the GPU needs the vendor.",
    Action.REBOOT_NODE: "Drain the node and reboot it; a GPU reset is not enough.",
    Action.DRAIN_AND_RESET: "Stop scheduling work on the GPU, let running jobs finish, then reset it.",
    Action.RESET_GPU: "Stop the GPU's processes and reset the GPU (nvidia-smi -r), or reboot.",
    Action.RESTART_FABRIC_MANAGER: "Restart nvidia-fabricmanager, then reset the GPUs it serves.",
    Action.CHECK_MECHANICALS: "Check GPU seating, power cables and risers.",
    Action.CHECK_COOLING: "Check airflow, fans, inlet temperature and the cooling loop.",
    Action.CHECK_LINKS: "Check NVLink / InfiniBand / PCIe links, cables and transceivers.",
    Action.RUN_DIAGNOSTICS: "Run DCGM diagnostics (dcgmi diag -r 3) on the drained GPU.",
    Action.UPDATE_SOFTWARE: "Update the driver, firmware or library to a consistent, supported version.",
    Action.FIX_CONFIG: "Fix the job or node configuration named in the finding.",
    Action.CHECK_APP: "Debug the application; the GPU is most likely fine.",
    Action.RESTART_APP: "Restart the application; no action on the GPU is needed.",
    Action.IGNORE: "No action needed.",
}


class Severity(StrEnum):
    CRITICAL = "critical"  # needs a human now (pages)
    WARNING = "warning"  # needs attention soon (ticket)
    INFO = "info"  # context for troubleshooting
    UNKNOWN = "unknown"  # we do not know this signal (an XID code missing from the catalog)

    @property
    def rank(self) -> int:
        return _SEVERITY_ORDER[self]


_SEVERITY_ORDER = {Severity.CRITICAL: 0, Severity.UNKNOWN: 1, Severity.WARNING: 2, Severity.INFO: 3}


class Health(StrEnum):
    """A GPU's verdict, as `nvidia_gpu_health{status}` and in `/api/v1/diagnosis`."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"  # works, but something needs attention
    UNHEALTHY = "unhealthy"  # do not run work on it until the action is done
    UNKNOWN = "unknown"  # we cannot tell: the GPU does not answer, or nothing is known yet


class GpuStatus(StrEnum):
    """Whether the driver still reaches a GPU, as the poller last found it; `status` in the HTTP API."""

    UP = "up"
    LOST = "lost"  # the driver says the GPU is gone
    HUNG = "hung"  # a call to it did not come back before the deadline


def most_urgent(actions: list[Action]) -> Action:
    """The one action that covers all of `actions` (IGNORE when there is none)."""
    return min(actions, key=lambda a: a.rank, default=Action.IGNORE)
