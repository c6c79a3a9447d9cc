"""A client of the kubelet's pod-resources API (v1): which container holds which device.

The kubelet serves `v1.PodResourcesLister` over gRPC on a Unix socket (by default
/var/lib/kubelet/pod-resources/kubelet.sock). Two calls are used: `List` (every pod on the node, its
containers and the devices each was given by a device plugin) and `GetAllocatableResources` (every device
the kubelet can hand out). Both requests are empty messages.

The answers are decoded here from the protobuf wire format, reading only the fields we need and skipping
every other, so no generated code and no protobuf runtime are involved: nothing to regenerate, no version of
generated code to match to a runtime, and a kubelet that adds fields (it has, release after release) changes
nothing. The field numbers, from the API's definition:

    ListPodResourcesResponse      1: repeated PodResources pod_resources
    PodResources                  1: string name   2: string namespace   3: repeated ContainerResources containers
    ContainerResources            1: string name   2: repeated ContainerDevices devices
    ContainerDevices              1: string resource_name   2: repeated string device_ids
    AllocatableResourcesResponse  1: repeated ContainerDevices devices

Devices handed out through dynamic resource allocation (ContainerResources field 5) are not read: their
device names are the DRA driver's, not GPU UUIDs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

SERVICE = "/v1.PodResourcesLister"
# A pod with a device takes about 130 bytes of List's answer, and a kubelet runs 110 pods by default (a few
# hundred where raised): 4 MiB is some 30,000 pods, far past any node, and its decoding is still bounded.
# (The kubelet's own client allows 16 MiB, which takes seconds to decode here.)
MAX_ANSWER_BYTES = 4 * 1024 * 1024
_CHECK_EVERY = 256  # pods decoded between looks at the clock


class WireError(ValueError):
    """An answer that is not the protobuf message it should be."""


class DeadlineError(Exception):
    """An answer that could not be decoded within the call's deadline."""


@dataclass(frozen=True, slots=True)
class Devices:
    """Devices of one resource (`nvidia.com/gpu`, `nvidia.com/mig-3g.40gb`...), as the device plugin names them."""

    resource: str
    ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    namespace: str
    pod: str
    container: str
    devices: tuple[Devices, ...]


# --- the protobuf wire format: varints, and length-delimited fields -------------------------------------

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("a varint runs past the end of the message")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 64:
            raise WireError("a varint is longer than 10 bytes")


def _fields(buf: bytes) -> Iterator[tuple[int, bytes | None]]:
    """(field number, its bytes) for each length-delimited field; other wire types come with None."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, pos = _varint(buf, pos)
            yield number, None
        elif wire == _LEN:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise WireError(f"field {number} claims {size} bytes; the message has {len(buf) - pos} left")
            yield number, buf[pos : pos + size]
            pos += size
        elif wire in (_I64, _I32):
            pos += 8 if wire == _I64 else 4
            if pos > len(buf):
                raise WireError(f"field {number} runs past the end of the message")
            yield number, None
        else:  # groups (3, 4) are proto2 only, 6 and 7 do not exist
            raise WireError(f"field {number} has wire type {wire}, which this API never sends")


def _text(data: bytes | None) -> str:
    if data is None:
        raise WireError("a string field is not length-delimited")
    return data.decode("utf-8", errors="replace")


def _devices(buf: bytes) -> Devices:
    resource, ids = "", []
    for number, data in _fields(buf):
        if number == 1:
            resource = _text(data)
        elif number == 2:
            ids.append(_text(data))
    return Devices(resource, tuple(ids))


def _messages(buf: bytes, number: int) -> Iterator[bytes]:
    """The embedded messages of field `number`."""
    for n, data in _fields(buf):
        if n == number:
            if data is None:
                raise WireError(f"field {number} is not an embedded message")
            yield data


def decode_list(buf: bytes, deadline: float = math.inf) -> list[ContainerDevices]:
    """ListPodResourcesResponse -> one entry per container that holds devices. DeadlineError once
    time.monotonic() passes `deadline`."""
    out = []
    for n, pod in enumerate(_messages(buf, 1)):
        if n % _CHECK_EVERY == 0 and time.monotonic() > deadline:
            raise DeadlineError(f"{n} pods of an answer of {len(buf) / 1e6:.1f} MB decoded by the deadline")
        name = namespace = ""
        containers: list[bytes] = []
        for number, data in _fields(pod):
            if number == 1:
                name = _text(data)
            elif number == 2:
                namespace = _text(data)
            elif number == 3 and data is not None:
                containers.append(data)
        for container in containers:
            cname = ""
            devices = []
            for number, data in _fields(container):
                if number == 1:
                    cname = _text(data)
                elif number == 2 and data is not None:
                    devices.append(_devices(data))
            if devices:
                out.append(ContainerDevices(namespace, name, cname, tuple(devices)))
    return out


def decode_allocatable(buf: bytes) -> list[Devices]:
    """AllocatableResourcesResponse -> the devices the kubelet can allocate, by resource."""
    return [_devices(data) for data in _messages(buf, 1)]


# --- the calls ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    containers: list[ContainerDevices]
    allocatable: list[Devices] | None  # None: the kubelet does not offer GetAllocatableResources


def _empty(_: object) -> bytes:
    return b""  # both requests are empty messages


def read(socket: str, deadline_seconds: float) -> Answer:
    """Both calls and the decoding of their answers, within `deadline_seconds` together. Raises grpc.RpcError
    (the socket is not there or does not answer in time: code() says which), WireError or DeadlineError."""
    import grpc  # only where the kubelet's API is read at all

    end = time.monotonic() + deadline_seconds
    options = [("grpc.max_receive_message_length", MAX_ANSWER_BYTES), ("grpc.enable_http_proxy", 0)]
    # A channel per read: the kubelet makes a new socket when it restarts, and a fresh channel connects to it
    # at once instead of after a reconnect back-off.
    with grpc.insecure_channel(f"unix://{socket}", options=options) as channel:
        # The answers are decoded after the call, not by grpc's response_deserializer: grpc would turn a
        # WireError there into a bare "Exception deserializing response!" and log its own traceback.
        listing: grpc.UnaryUnaryMultiCallable[None, bytes] = channel.unary_unary(
            f"{SERVICE}/List", request_serializer=_empty
        )
        containers = decode_list(listing(None, timeout=max(0.001, end - time.monotonic())), end)
        allocatable_call: grpc.UnaryUnaryMultiCallable[None, bytes] = channel.unary_unary(
            f"{SERVICE}/GetAllocatableResources", request_serializer=_empty
        )
        try:
            raw: bytes | None = allocatable_call(None, timeout=max(0.001, end - time.monotonic()))
        except grpc.RpcError as e:
            # Kubelets before 1.23 lack it (or have it behind a feature gate): List is what matters.
            if e.code() is not grpc.StatusCode.UNIMPLEMENTED:
                raise
            raw = None
    return Answer(containers, None if raw is None else decode_allocatable(raw))
