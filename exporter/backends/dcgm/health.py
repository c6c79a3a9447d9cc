"""DCGM's health watches: PCIe, memory, InfoROM, thermal, power, NVLink and driver, per GPU.

`dcgmHealthCheck` reports what went wrong *since the last check*, for the whole group at once: a
condition that lasts (a pending row remap, a corrupt InfoROM) is reported on every check, an event
(a burst of PCIe replays, an XID) on one check only. So the check runs once for all GPUs, at most
once a second however many reads ask, and an incident is held for `HOLD_SECONDS` after DCGM last
reported it: long enough to reach the verdict, the alerts and the person they page.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gpu_triage.exporter.backends.dcgm import fields
from gpu_triage.exporter.backends.dcgm.session import HEALTH_SYSTEMS, Session
from gpu_triage.exporter.backends.readings import HealthIncident

HOLD_SECONDS = 900.0
CHECK_EVERY_SECONDS = 1.0
_FAIL = 20  # DCGM_HEALTH_RESULT_FAIL; WARN is 10


class HealthBook:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._checked: tuple[Session | None, float] = (None, float("-inf"))
        # (GPU UUID, system, DCGM error code) -> (the incident, when DCGM last reported it)
        self._held: dict[tuple[str, str, int | None], tuple[HealthIncident, float]] = {}

    def incidents(self, session: Session, uuid: str) -> tuple[HealthIncident, ...]:
        """The GPU's open incidents. A DCGMError from the check goes to the caller."""
        with self._lock:
            now = self._clock()
            last_session, last = self._checked
            if last_session is not session or now - last >= CHECK_EVERY_SECONDS:
                self._check(session, now)
                self._checked = (session, now)
            for key in [k for k, (_, seen) in self._held.items() if now - seen > HOLD_SECONDS]:
                del self._held[key]
            return tuple(i for (gpu, _, _), (i, _) in sorted(self._held.items(), key=str) if gpu == uuid)

    def _check(self, session: Session, now: float) -> None:
        response = session.b.agent.dcgmHealthCheck(session.handle, session.gpu_group)
        uuid_of = {gpu_id: uuid for uuid, gpu_id in session.gpu_ids.items()}
        parent_of = {
            (group, entity): gpu_id
            for gpu_id, migs in session.migs.items()
            for m in migs
            for group, entity in (
                (fields.FE_GPU_I, m.gpu_instance_entity),
                (fields.FE_GPU_CI, m.compute_instance_entity),
            )
        }
        for i in range(min(int(response.incidentCount), len(response.incidents))):
            raw = response.incidents[i]
            system = HEALTH_SYSTEMS.get(int(raw.system))
            where = (int(raw.entityInfo.entityGroupId), int(raw.entityInfo.entityId))
            gpu_id = where[1] if where[0] == fields.FE_GPU else parent_of.get(where)
            if system is None or gpu_id not in uuid_of:
                continue  # a system gpu-triage does not watch (XIDs come from the kernel log), or no GPU
            message = raw.error.msg
            text = (message.decode(errors="replace") if isinstance(message, bytes) else str(message)).strip()
            code = int(raw.error.code) or None
            incident = HealthIncident(system, int(raw.health) >= _FAIL, text or f"DCGM {system} health watch", code)
            self._held[(uuid_of[gpu_id], system, code)] = (incident, now)
