"""The performance classes, each a judgement of one GPU's window sums (or a workload's GPUs side by side).

Each check answers the evidence figures when its class holds, None otherwise. They read only the sums of
performance/window.py and the thresholds of data/performance.yaml; what holds is decided here, what it
means and what to do lives in the data and the playbooks.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from gpu_triage.diagnosis.performance.data import ClassSpec
from gpu_triage.diagnosis.performance.window import IX, mean

Evidence = dict[str, float]
Check = Callable[[list[float], ClassSpec], Evidence | None]


def _share(total: list[float], name: str) -> float:
    seen = total[IX["seen"]]
    return total[IX[name]] / seen if seen > 0 else 0.0


def idle_allocated(total: list[float], spec: ClassSpec) -> Evidence | None:
    """Held all the window (a workload, a process or memory) with activity under the threshold nearly all of it."""
    act = mean(total, "act", "act_n")
    known = _share(total, "act_n")
    if act is None or known < 0.5:
        return None  # no activity figure for most of the window: cannot say it is idle
    held, idle = _share(total, "held"), total[IX["idle"]] / total[IX["act_n"]]
    if held >= 0.99 and idle >= spec.value("idle_share") and act < spec.value("idle_activity"):
        return {"activity": act, "idle_share": idle, "held_share": held}
    return None


def input_bound(total: list[float], spec: ClassSpec) -> Evidence | None:
    """Low activity while host-to-device copies fill the PCIe link, or work in short bursts with idle gaps."""
    act = mean(total, "act", "act_n")
    if act is None or act >= spec.value("activity_below"):
        return None
    rx, tx = mean(total, "rx", "pcie_n"), mean(total, "tx", "pcie_n")
    # Both ways near capacity on a GPU without NVLink is peer traffic: communication_bound says that.
    peers = total[IX["link_n"]] == 0 and tx is not None and tx >= spec.value("h2d_share")
    if rx is not None and tx is not None and rx >= spec.value("h2d_share") and not peers:
        return {"activity": act, "h2d_share": rx, "d2h_share": tx}
    low, high = spec.pair("burst_idle_share")
    idle = total[IX["idle"]] / total[IX["act_n"]] if total[IX["act_n"]] else 0.0
    if total[IX["bursts"]] >= spec.value("bursts") and low <= idle <= high:
        return {"activity": act, "idle_share": idle, "bursts": total[IX["bursts"]]}
    return None


def communication_bound(total: list[float], spec: ClassSpec) -> Evidence | None:
    """Low activity while NVLink (or, without NVLink, PCIe both ways) carries near its capacity."""
    act = mean(total, "act", "act_n")
    if act is None or act >= spec.value("activity_below"):
        return None
    link = mean(total, "link", "link_n")
    if link is not None and link >= spec.value("link_share"):
        return {"activity": act, "nvlink_share": link}
    rx, tx = mean(total, "rx", "pcie_n"), mean(total, "tx", "pcie_n")
    if link is None and rx is not None and tx is not None and min(rx, tx) >= spec.value("link_share"):
        return {"activity": act, "pcie_rx_share": rx, "pcie_tx_share": tx}
    return None


def throttled(total: list[float], spec: ClassSpec) -> Evidence | None:
    """A slowdown reason held the clocks down for a share of the busy window, or clocks low with no reason."""
    busy = _share(total, "busy")
    if busy < 0.5:
        return None  # an idle GPU runs low clocks by design, and a short busy spell proves nothing
    slowdown = _share(total, "slowdown")
    clock = mean(total, "clock", "clock_n")
    if slowdown >= spec.value("reason_share"):
        return {"slowdown_share": slowdown, "clock_ratio": clock if clock is not None else -1.0, "busy_share": busy}
    low = total[IX["low_clock"]] / total[IX["busy"]]
    if low >= spec.value("low_clock_share") and clock is not None:
        return {"unexplained_low_clock_share": low, "clock_ratio": clock, "busy_share": busy}
    return None


def memory_bound(total: list[float], spec: ClassSpec) -> Evidence | None:
    dram, occ = mean(total, "dram", "dram_n"), mean(total, "occ", "occ_n")
    if dram is None or occ is None:
        return None
    if dram >= spec.value("dram_above") and occ < spec.value("occupancy_below"):
        return {"dram_active": dram, "sm_occupancy": occ}
    return None


CHECKS: dict[str, Check] = {
    "gpu_idle_allocated": idle_allocated,
    "input_bound": input_bound,
    "communication_bound": communication_bound,
    "throttled": throttled,
    "memory_bound": memory_bound,
}


def stragglers(totals: dict[int, list[float]], spec: ClassSpec) -> dict[int, Evidence]:
    """The GPUs (by index) of one workload that lag the others: less active, slower clocks, hotter, or held down
    longer than the siblings' median. Two GPUs have no majority to lag: three at least."""
    if len(totals) < 3:
        return {}
    acts = {g: mean(t, "act", "act_n") for g, t in totals.items()}
    known = [a for a in acts.values() if a is not None]
    if len(known) < 3 or statistics.median(known) < spec.value("busy_activity"):
        return {}
    out: dict[int, Evidence] = {}
    for gpu, t in totals.items():
        others = [o for g, o in totals.items() if g != gpu]
        ev = _lag(t, others, spec)
        if ev:
            out[gpu] = ev
    return out if len(out) <= len(totals) // 2 else {}  # most of them "lagging" is the job's shape, not one GPU


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _lag(t: list[float], others: list[list[float]], spec: ClassSpec) -> Evidence | None:
    act, peer_act = mean(t, "act", "act_n"), _median([mean(o, "act", "act_n") for o in others])
    if act is not None and peer_act and act < peer_act * (1 - spec.value("activity_gap")):
        return {"activity": act, "siblings_activity": peer_act}
    clock, peer_clock = mean(t, "clock", "clock_n"), _median([mean(o, "clock", "clock_n") for o in others])
    if clock is not None and peer_clock and clock < peer_clock * (1 - spec.value("clock_gap")):
        return {"clock_ratio": clock, "siblings_clock_ratio": peer_clock}
    temp, peer_temp = mean(t, "temp", "temp_n"), _median([mean(o, "temp", "temp_n") for o in others])
    if temp is not None and peer_temp is not None and temp > peer_temp + spec.value("hotter_celsius"):
        return {"temperature_celsius": temp, "siblings_temperature_celsius": peer_temp}
    slow, peer_slow = _share(t, "slowdown"), _median([_share(o, "slowdown") for o in others])
    if peer_slow is not None and slow > peer_slow + spec.value("reason_share_gap"):
        return {"slowdown_share": slow, "siblings_slowdown_share": peer_slow}
    return None
