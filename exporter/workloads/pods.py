"""Which Kubernetes pod holds which GPU: the kubelet's pod-resources API, read in the background.

`--kubernetes.pod-resources-socket` says where the kubelet's socket is:

    auto (default)  /var/lib/kubelet/pod-resources/kubelet.sock when it is there; when it is not (a node that
                    is not a Kubernetes node, a pod without the socket mounted) nothing is mapped and nothing
                    is reported as failing
    a path          that socket: missing, slow or broken, it is reported as failing
    off             never read

The API is read at start and then every `--collector.slow-interval`, on a thread of its own with a deadline
(`--collector.timeout`), so a kubelet that is slow or gone never holds up a poll, a scrape or the verdict:
the last answer stays in use and the failure is reported (`gpu_triage_workload_source_up{source="kubelet"}`
and /api/v1/gpus).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_triage.diagnosis.core.findings import Workload
from gpu_triage.exporter.worker import Worker
from gpu_triage.exporter.workloads.placement import Assignment, DeviceIndex
from gpu_triage.exporter.workloads.podresources import MAX_ANSWER_BYTES, Answer, DeadlineError, WireError, read

log = logging.getLogger(__name__)
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
SOURCE = "kubelet"
_UNMATCHED_SHOWN = 8  # device ids listed per resource in the status: enough to recognise the naming
# Pods named on one GPU at most. Time-slicing and MPS share a GPU among a few dozen pods (MPS serves 48
# clients at most); past this the answer is no node's, and /metrics and every render must stay small.
MAX_PODS_PER_GPU = 128


class State:
    STARTING = "starting"  # not read yet
    OK = "ok"
    ABSENT = "absent"  # auto, and no socket: not a Kubernetes node
    FAILING = "failing"


@dataclass(frozen=True, slots=True)
class PodMap:
    """What the last good answer says, placed on this node's GPUs."""

    assignments: dict[str, tuple[Assignment, ...]] = field(default_factory=dict)  # by GPU uuid
    # Devices of nvidia.com/ resources that are none of this node's GPUs (another device plugin's naming).
    unmatched: dict[str, list[str]] = field(default_factory=dict)
    not_shown: int = 0  # assignments past MAX_PODS_PER_GPU


def assign(answer: Answer, index: DeviceIndex) -> PodMap:
    """Each container's devices, placed on the GPUs and MIG devices they are."""
    found: dict[str, dict[Assignment, None]] = {}  # ordered sets: a pod holding two replicas of a GPU is one
    unmatched: dict[str, list[str]] = {}
    not_shown = 0
    for container in answer.containers:
        for devices in container.devices:
            for device_id in devices.ids:
                place = index.place(device_id)
                if place is None:
                    _note(unmatched, devices.resource, device_id)
                    continue
                workload = Workload(
                    "pod",
                    container.pod,
                    namespace=container.namespace,
                    container=container.container,
                    mig_uuid=place.mig.uuid if place.mig else "",
                    gpu_instance=place.mig.gpu_instance if place.mig else None,
                )
                on_gpu = found.setdefault(place.gpu_uuid, {})
                assignment = Assignment(workload, place.mig)
                if len(on_gpu) >= MAX_PODS_PER_GPU and assignment not in on_gpu:
                    not_shown += 1
                    continue
                on_gpu[assignment] = None
    for devices in answer.allocatable or ():
        for device_id in devices.ids:
            if index.place(device_id) is None:
                _note(unmatched, devices.resource, device_id)
    return PodMap({uuid: tuple(a) for uuid, a in found.items()}, unmatched, not_shown)


def _note(unmatched: dict[str, list[str]], resource: str, device_id: str) -> None:
    if not resource.startswith("nvidia.com/"):
        return  # another vendor's devices (NICs, FPGAs): not GPUs, nothing to map
    ids = unmatched.setdefault(resource, [])
    if device_id not in ids and len(ids) < _UNMATCHED_SHOWN:
        ids.append(device_id)


class PodSource:
    """The pod-resources API, read now and then on its own thread; `answer` is the last good read."""

    def __init__(
        self,
        setting: str,
        interval: float,
        deadline: float,
        on_change: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.auto = setting == "auto"
        self.socket = DEFAULT_SOCKET if self.auto else setting
        self.interval = interval
        self.deadline = deadline
        self._on_change = on_change
        self._clock = clock
        self.answer: Answer | None = None
        self.state = State.STARTING
        self.error: str | None = None
        self.last_success: float | None = None
        self.duration_seconds: float | None = None
        self._worker = Worker("pod-resources", self._turn)

    @property
    def up(self) -> bool | None:
        """True or False while the socket is in use; None while there is nothing to report (not read yet, or
        auto found no socket)."""
        return {State.OK: True, State.FAILING: False}.get(self.state)

    @property
    def running(self) -> bool:
        return self._worker.alive

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop(self.deadline + 5.0)  # a read in flight ends at its deadline

    def _turn(self) -> None:
        if self.read_once():
            self._on_change()
        self._worker.stopping.wait(self.interval)

    def read_once(self) -> bool:
        """Read the API once; whether what the daemon shows changes (the answer, or the state)."""
        before = (self.answer, self.state, self.error)
        if self.auto and not Path(self.socket).exists():
            self._set(State.ABSENT, f"no socket at {self.socket}: not a Kubernetes node, or the socket is not mounted")
            self.answer = None
            return (self.answer, self.state, self.error) != before
        t0 = time.monotonic()
        try:
            answer = read(self.socket, self.deadline)
        except WireError as e:
            self._set(State.FAILING, f"the kubelet's answer is not what the API says: {e}")
        except DeadlineError as e:
            self._set(State.FAILING, f"the kubelet's answer could not be read within {self.deadline:g}s ({e})")
        except Exception as e:  # grpc.RpcError and whatever grpc raises: reported, never allowed to stop the loop
            self._set(State.FAILING, _rpc_problem(e, self.socket, self.deadline))
        else:
            if answer != self.answer:  # the same pods as last time stay the same object: nothing is placed again
                self.answer = answer
            self.last_success = self._clock()
            self._set(State.OK, None)
        self.duration_seconds = time.monotonic() - t0
        return (self.answer, self.state, self.error) != before

    def _set(self, state: str, error: str | None) -> None:
        if state != self.state:
            level = logging.WARNING if state == State.FAILING else logging.INFO
            log.log(level, "pod-resources API", extra={"state": state, "socket": self.socket, "error": error})
        self.state, self.error = state, error

    def status(self) -> dict[str, Any]:
        return {
            "source": "the kubelet's pod-resources API",
            "socket": self.socket,
            "setting": "auto" if self.auto else "path",
            "state": self.state,
            "error": self.error,
            "last_success": self.last_success,
            "read_seconds": self.duration_seconds,
            "containers_with_devices": len(self.answer.containers) if self.answer else 0,
        }


def _rpc_problem(e: Exception, socket: str, deadline: float) -> str:
    """One line: what went wrong with the call, in words an operator acts on."""
    code = getattr(e, "code", None)
    name = getattr(code(), "name", "") if callable(code) else ""
    details = getattr(e, "details", None)
    text = (details() if callable(details) else None) or str(e)
    if name == "DEADLINE_EXCEEDED":
        return f"the kubelet did not answer within {deadline:g}s (socket {socket})"
    if name == "UNAVAILABLE":
        return f"cannot reach the kubelet at {socket}: {text}"
    if name == "RESOURCE_EXHAUSTED":
        return f"the kubelet's answer is over {MAX_ANSWER_BYTES // 2**20} MiB, more than any node's pods take: {text}"
    return f"{name or type(e).__name__}: {text}"
