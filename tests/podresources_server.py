"""A kubelet pod-resources API (v1) for tests: a real gRPC server on a Unix socket, serving what a test says.

Its answers are encoded by the protobuf library itself, from message types declared here with the API's
names and field numbers, so the daemon's own decoder (exporter/workloads/podresources.py) is checked against
an encoder that is not its own. The test sets `pods` (namespace, name, containers with devices) and
`allocatable`, can make the server slow (`delay`), and can stop and start it like a kubelet restart.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto
_STRING, _INT64, _UINT64, _MESSAGE = F.TYPE_STRING, F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_MESSAGE
_REPEATED, _OPTIONAL = F.LABEL_REPEATED, F.LABEL_OPTIONAL

# (message, [(field, number, type, repeated, message type)]): the v1 API's messages as the kubelet has them,
# unread fields included, so that the decoder is shown to skip them.
_MESSAGES: list[tuple[str, list[tuple[str, int, int, bool, str]]]] = [
    ("NUMANode", [("ID", 1, _INT64, False, "")]),
    ("TopologyInfo", [("nodes", 1, _MESSAGE, True, "NUMANode")]),
    ("ContainerDevices", [
        ("resource_name", 1, _STRING, False, ""),
        ("device_ids", 2, _STRING, True, ""),
        ("topology", 3, _MESSAGE, False, "TopologyInfo"),
    ]),
    ("ContainerMemory", [
        ("memory_type", 1, _STRING, False, ""),
        ("size", 2, _UINT64, False, ""),
        ("topology", 3, _MESSAGE, False, "TopologyInfo"),
    ]),
    ("CDIDevice", [("name", 1, _STRING, False, "")]),
    ("ClaimResource", [
        ("cdi_devices", 1, _MESSAGE, True, "CDIDevice"),
        ("driver_name", 2, _STRING, False, ""),
        ("pool_name", 3, _STRING, False, ""),
        ("device_name", 4, _STRING, False, ""),
    ]),
    ("DynamicResource", [
        ("claim_name", 2, _STRING, False, ""),
        ("claim_namespace", 3, _STRING, False, ""),
        ("claim_resources", 4, _MESSAGE, True, "ClaimResource"),
    ]),
    ("ContainerResources", [
        ("name", 1, _STRING, False, ""),
        ("devices", 2, _MESSAGE, True, "ContainerDevices"),
        ("cpu_ids", 3, _INT64, True, ""),
        ("memory", 4, _MESSAGE, True, "ContainerMemory"),
        ("dynamic_resources", 5, _MESSAGE, True, "DynamicResource"),
    ]),
    ("PodResources", [
        ("name", 1, _STRING, False, ""),
        ("namespace", 2, _STRING, False, ""),
        ("containers", 3, _MESSAGE, True, "ContainerResources"),
        ("cpu_ids", 4, _INT64, True, ""),
        ("memory", 5, _MESSAGE, True, "ContainerMemory"),
    ]),
    ("ListPodResourcesRequest", []),
    ("ListPodResourcesResponse", [("pod_resources", 1, _MESSAGE, True, "PodResources")]),
    ("AllocatableResourcesRequest", []),
    ("AllocatableResourcesResponse", [
        ("devices", 1, _MESSAGE, True, "ContainerDevices"),
        ("cpu_ids", 2, _INT64, True, ""),
        ("memory", 3, _MESSAGE, True, "ContainerMemory"),
    ]),
]  # fmt: skip


def _message_classes() -> dict[str, Any]:
    proto = descriptor_pb2.FileDescriptorProto(name="test_podresources_v1.proto", package="v1", syntax="proto3")
    for name, fields in _MESSAGES:
        message = proto.message_type.add(name=name)
        for fname, number, ftype, repeated, type_name in fields:
            f = message.field.add(name=fname, number=number, type=ftype, label=_REPEATED if repeated else _OPTIONAL)
            if type_name:
                f.type_name = f".v1.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{name}")) for name, _ in _MESSAGES}


M = _message_classes()


@dataclass
class Container:
    name: str
    devices: dict[str, list[str]]  # resource -> device ids
    cpus: list[int] = field(default_factory=lambda: [2, 3])


@dataclass
class Pod:
    namespace: str
    name: str
    containers: list[Container]


def encode_list(pods: list[Pod]) -> bytes:
    """A ListPodResourcesResponse, with CPU, memory and topology fields set too, as a kubelet sends them."""
    answer = M["ListPodResourcesResponse"]()
    for pod in pods:
        p = answer.pod_resources.add(name=pod.name, namespace=pod.namespace)
        p.cpu_ids.extend([0, 1])
        for c in pod.containers:
            container = p.containers.add(name=c.name)
            container.cpu_ids.extend(c.cpus)
            container.memory.add(memory_type="memory", size=2**30).topology.nodes.add(ID=0)
            for resource, ids in c.devices.items():
                devices = container.devices.add(resource_name=resource)
                devices.device_ids.extend(ids)
                devices.topology.nodes.add(ID=1)
    data: bytes = answer.SerializeToString()
    return data


def encode_allocatable(devices: dict[str, list[str]]) -> bytes:
    answer = M["AllocatableResourcesResponse"]()
    answer.cpu_ids.extend(range(8))
    for resource, ids in devices.items():
        d = answer.devices.add(resource_name=resource)
        d.device_ids.extend(ids)
    data: bytes = answer.SerializeToString()
    return data


class PodResourcesServer:
    """`v1.PodResourcesLister` on `socket`, answering from `pods` and `allocatable` as they are at each call."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.pods: list[Pod] = []
        self.allocatable: dict[str, list[str]] = {}
        self.allocatable_implemented = True
        self.delay = 0.0  # seconds each answer waits (a slow kubelet)
        self.garbage: bytes | None = None  # answer List with these bytes instead (a kubelet we cannot read)
        self.calls: list[str] = []
        self._release = threading.Event()  # ends every delay at once, so that stopping never waits for one
        self._server: grpc.Server | None = None

    def _list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls.append("List")
        self._release.wait(self.delay)
        return encode_list(self.pods) if self.garbage is None else self.garbage

    def _allocatable(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls.append("GetAllocatableResources")
        if not self.allocatable_implemented:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method GetAllocatableResources")
        self._release.wait(self.delay)
        return encode_allocatable(self.allocatable)

    def start(self) -> None:
        def raw(fn: Any) -> grpc.RpcMethodHandler[bytes, bytes]:
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=lambda b: b, response_serializer=lambda b: b
            )

        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister", {"List": raw(self._list), "GetAllocatableResources": raw(self._allocatable)}
        )
        self._release.clear()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def stop(self) -> None:
        """Stop serving and remove the socket, as a kubelet that goes away does."""
        self._release.set()
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()


@contextlib.contextmanager
def pod_resources_server() -> Iterator[PodResourcesServer]:
    """A started server on a socket in a short temporary directory (a Unix socket path has ~100 bytes)."""
    home = Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))
    server = PodResourcesServer(home / "kubelet.sock")
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)
