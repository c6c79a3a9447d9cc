"""The NVML backend's PCIe and NVLink readers: links, their error counters and the data they carry.

Throughput comes from NVML's cumulative counters, differenced between polls (counter_rates.py):
PCIe from NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES, exact bytes; NVLink from the per-link data counters
(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX, in KiB), so a GPU without GPM (A100, or GPM switched off)
still shows its NVLink traffic. NVLink errors are read as both generations name them: the data-link
counters 161-163, which nvml.h says Blackwell and later do not support, and the NVLink5 link counters
213-221 that replace them there; whichever the GPU answers is exported.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Protocol

import pynvml

from gpu_triage.exporter.backends.counter_rates import CounterRates
from gpu_triage.exporter.backends.nvml.field_values import FieldRequest
from gpu_triage.exporter.backends.nvml.kept import Kept
from gpu_triage.exporter.backends.nvml.plain import read_plain
from gpu_triage.exporter.backends.nvml.query import Query
from gpu_triage.exporter.backends.readings import LinkReading, NvLink, Pcie, Reading


class BusState(Protocol):
    """What the PCIe and NVLink readers keep in the backend between reads."""

    rates: CounterRates  # the byte counters' last values, for the rates between polls
    link_counts: dict[int, int]  # NVLink links per GPU, once NVML has said
    board_limits: dict[str, Kept[dict[str, Any]]]  # by reading: its plain.BOARD_LIMITS, kept a while (kept.py)


KIB = 1024  # nvml.h: the NVLink throughput fields count "in KiB"
# Only where the byte counters are missing (older drivers) or have not been read twice yet:
# nvmlDeviceGetPcieThroughput's "KB/s" over a 20 ms window, taken as decimal kilobytes. nvml.h does
# not say which; the same header writes "KiB" where it means 1024 bytes. To be settled on a GPU.
PCIE_KB = 1000
_PCIE_ERRORS = {
    "l0_to_recovery": pynvml.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER,
    "correctable": pynvml.NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS,
    "nak_received": pynvml.NVML_FI_DEV_PCIE_COUNT_NAKS_RECEIVED,
    "receiver": pynvml.NVML_FI_DEV_PCIE_COUNT_RECEIVER_ERROR,
    "bad_tlp": pynvml.NVML_FI_DEV_PCIE_COUNT_BAD_TLP,
    "nak_sent": pynvml.NVML_FI_DEV_PCIE_COUNT_NAKS_SENT,
    "bad_dllp": pynvml.NVML_FI_DEV_PCIE_COUNT_BAD_DLLP,
    "non_fatal": pynvml.NVML_FI_DEV_PCIE_COUNT_NON_FATAL_ERROR,
    "fatal": pynvml.NVML_FI_DEV_PCIE_COUNT_FATAL_ERROR,
    "unsupported_request": pynvml.NVML_FI_DEV_PCIE_COUNT_UNSUPPORTED_REQ,
    "lcrc": pynvml.NVML_FI_DEV_PCIE_COUNT_LCRC_ERROR,
}
# Per-link fields, scoped by link index, in the order read_nvlink takes them.
_LINK_FIELDS = (
    pynvml.NVML_FI_DEV_NVLINK_GET_STATE,
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS,
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
)


# The byte counters, then the error counters.
_PCIE = FieldRequest(
    [
        (pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0),
        (pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0),
        *((fid, 0) for fid in _PCIE_ERRORS.values()),
    ],
    ["pcie_tx_bytes", "pcie_rx_bytes", *(f"pcie_{kind}" for kind in _PCIE_ERRORS)],
)
_LINK_COUNT = FieldRequest([(pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, 0)], ["nvlink_link_count"])


def read_pcie(b: BusState, q: Query, h: Any, gpu: int) -> Reading:
    values = q.counts(h, _PCIE)
    tx_bytes, rx_bytes = values[0], values[1]
    tx, rx = b.rates.rate((gpu, "pcie_tx"), tx_bytes), b.rates.rate((gpu, "pcie_rx"), rx_bytes)
    if tx is None or rx is None:
        # Each call samples a 20 ms window, which is why PCIe is a collector of its own.
        tx_kb = q("pcie_tx", pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx_kb = q("pcie_rx", pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        tx = None if tx_kb is None else float(tx_kb * PCIE_KB)
        rx = None if rx_kb is None else float(rx_kb * PCIE_KB)
    errors = {kind: v for kind, v in zip(_PCIE_ERRORS, values[2:], strict=True) if v is not None}
    return Pcie(
        **read_plain(q, h, "Pcie", b.board_limits["Pcie"]),
        tx_bytes_per_second=tx,
        rx_bytes_per_second=rx,
        tx_bytes=tx_bytes,
        rx_bytes=rx_bytes,
        errors=errors,
    )


def read_nvlink(b: BusState, q: Query, h: Any, gpu: int) -> Reading:
    links = _link_count(b, q, h, gpu)
    if not links:
        return NvLink(())
    values = q.counts(h, _link_request(links))
    n = len(_LINK_FIELDS)
    # Each field's column, one value per link, in _LINK_FIELDS' order.
    state, replay, recovery, crc, events, failed, successful, effective, symbol, tx, rx = (
        values[i::n] for i in range(n)
    )
    moved = [None if v is None else v * KIB for v in tx + rx]  # every tx, then every rx
    rates = b.rates.rates((gpu, "nvlink"), moved)
    # NVML's link state as it is (0 inactive, 1 active, 2 sleep, 3 active, traffic disabled). The count is of
    # links the GPU has, cabled or not: an uncabled one is inactive for good.
    return NvLink(
        tuple(
            map(
                LinkReading,  # positionally, in its fields' order (checked at import below)
                range(links),
                state,
                replay,
                # Blackwell: every recovery, whatever its outcome
                [r if r is not None else e for r, e in zip(recovery, events, strict=True)],
                crc,
                failed,
                successful,
                effective,
                symbol,
                moved[:links],
                moved[links:],
                rates[:links],
                rates[links:],
            )
        )
    )


@functools.cache
def _link_request(links: int) -> FieldRequest:
    """The fields of `links` links, made once."""
    ids = [(field, link) for link in range(links) for field in _LINK_FIELDS]
    return FieldRequest(ids, [f"nvlink_{link}_{field}" for link in range(links) for field in _LINK_FIELDS])


_LINK_READING = (
    "link",
    "state",
    "replay_errors",
    "recovery_errors",
    "crc_errors",
    "recovery_failed",
    "recovery_successful",
    "effective_errors",
    "symbol_errors",
    "tx_bytes",
    "rx_bytes",
    "tx_bytes_per_second",
    "rx_bytes_per_second",
)
if tuple(f.name for f in dataclasses.fields(LinkReading)) != _LINK_READING:
    raise ImportError("LinkReading's fields are not in the order read_nvlink passes them")


def _link_count(b: BusState, q: Query, h: Any, gpu: int) -> int:
    if gpu not in b.link_counts:
        failed = len(q.failed)
        (count,) = q.counts(h, _LINK_COUNT)
        if len(q.failed) > failed:
            return 0  # a failed read, not an answer: ask again next poll
        b.link_counts[gpu] = int(count or 0)
    return b.link_counts[gpu]
