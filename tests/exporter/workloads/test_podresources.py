"""The pod-resources wire decoder against protobuf's own encoder (tests/podresources_server.py), and against
bytes that are not the message they should be."""

from __future__ import annotations

import contextlib
import time

import pytest

from gpu_triage.exporter.workloads.podresources import (
    ContainerDevices,
    DeadlineError,
    Devices,
    WireError,
    decode_allocatable,
    decode_list,
)
from tests.podresources_server import Container, Pod, encode_allocatable, encode_list


def test_list_decodes_what_protobuf_encodes_and_skips_what_it_does_not_need() -> None:
    pods = [
        Pod("ml", "trainer-0", [
            Container("main", {"nvidia.com/gpu": ["GPU-a", "GPU-b"], "example.com/nic": ["mlx5_0"]}, cpus=[4, 5, 300]),
            Container("sidecar", {}),  # holds no device: not listed
        ]),
        Pod("ml", "Ünïcode-ß", [Container("c", {"nvidia.com/gpu": ["GPU-c::3"]})]),
        Pod("default", "no-devices", []),
    ]  # fmt: skip
    assert decode_list(encode_list(pods)) == [
        ContainerDevices(
            "ml",
            "trainer-0",
            "main",
            (Devices("nvidia.com/gpu", ("GPU-a", "GPU-b")), Devices("example.com/nic", ("mlx5_0",))),
        ),
        ContainerDevices("ml", "Ünïcode-ß", "c", (Devices("nvidia.com/gpu", ("GPU-c::3",)),)),
    ]


def test_allocatable_decodes() -> None:
    data = encode_allocatable({"nvidia.com/gpu": ["GPU-a", "GPU-b"], "nvidia.com/mig-3g.40gb": ["MIG-x"]})
    assert decode_allocatable(data) == [
        Devices("nvidia.com/gpu", ("GPU-a", "GPU-b")),
        Devices("nvidia.com/mig-3g.40gb", ("MIG-x",)),
    ]


def test_empty_answers() -> None:
    assert decode_list(b"") == []
    assert decode_allocatable(b"") == []


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\x0a\x05abc", "claims 5 bytes"),  # a length past the end
        (b"\x0a", "past the end"),  # a key with no length
        (b"\x08" + b"\xff" * 11, "longer than 10 bytes"),  # a varint that never ends
        (b"\x0b", "wire type 3"),  # a group start: never in proto3
        (b"\x08\x01", "not an embedded message"),  # pod_resources as a number
        (b"\x0d\x01\x02", "past the end"),  # a fixed32 cut short
    ],
)
def test_bad_bytes_are_a_clear_error(data: bytes, problem: str) -> None:
    with pytest.raises(WireError, match=problem):
        decode_list(data)


def test_every_truncation_of_a_real_answer_is_an_error_or_a_prefix_never_a_crash() -> None:
    data = encode_list([Pod("ml", "trainer-0", [Container("main", {"nvidia.com/gpu": ["GPU-a", "GPU-b"]})])])
    for cut in range(len(data)):
        with contextlib.suppress(WireError):
            decode_list(data[:cut])


def test_decoding_stops_at_the_deadline() -> None:
    pods = [Pod("ns", f"p{i}", [Container("main", {"nvidia.com/gpu": [f"GPU-{i}"]})]) for i in range(1000)]
    raw = encode_list(pods)
    assert len(decode_list(raw, deadline=time.monotonic() + 60)) == 1000
    with pytest.raises(DeadlineError, match=r"^0 pods of an answer of 0\.1 MB decoded by the deadline$"):
        decode_list(raw, deadline=time.monotonic() - 1)
