"""Metric families of the XID path: XID and SXID counters, and the state of the event sources.

`nvidia_gpu_xid_errors_total` is a true counter: it comes from the journal's totals, which outlive
restarts and retention, so it never goes down. A GPU's first XID creates its series at 1; rules
catch that with the companion `nvidia_gpu_xid_last_seen_timestamp_seconds` (or `unless ... offset`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpu_triage.exporter.sources.driver_events import DriverEventStats
from gpu_triage.exporter.sources.journal import JournalStats, Total
from gpu_triage.exporter.sources.pipeline import PipelineStats
from gpu_triage.exporter.sources.records import KmsgStats


def xid_families(totals: Iterable[Total]) -> list[Metric]:
    xids = CounterMetricFamily(
        "nvidia_gpu_xid_errors",
        "XID errors reported for the GPU (kernel log and driver events, each fault counted once), by code.",
        labels=["gpu", "uuid", "xid"],
    )
    xid_seen = GaugeMetricFamily(
        "nvidia_gpu_xid_last_seen_timestamp_seconds",
        "Unix time of the GPU's latest XID of this code, in seconds.",
        labels=["gpu", "uuid", "xid"],
        unit="seconds",
    )
    sxids = CounterMetricFamily(
        "nvidia_nvswitch_sxid_errors",
        "SXID errors reported by an NVSwitch in the kernel log, by code.",
        labels=["pci_bus_id", "sxid"],
    )
    sxid_seen = GaugeMetricFamily(
        "nvidia_nvswitch_sxid_last_seen_timestamp_seconds",
        "Unix time of the NVSwitch's latest SXID of this code, in seconds.",
        labels=["pci_bus_id", "sxid"],
        unit="seconds",
    )
    for t in totals:
        if t.kind == "xid":
            # A GPU the driver does not list has no index: its bus id tells it apart from other such GPUs.
            gpu = str(t.gpu_index) if t.gpu_index is not None else (t.pci_bus_id or "")
            labels = [gpu, t.uuid, str(t.code)]
            xids.add_metric(labels, float(t.count))
            xid_seen.add_metric(labels, t.last_seen)
        else:
            labels = [t.pci_bus_id or "", str(t.code)]
            sxids.add_metric(labels, float(t.count))
            sxid_seen.add_metric(labels, t.last_seen)
    return [xids, xid_seen, sxids, sxid_seen]


def source_families(
    kmsg: KmsgStats | None, driver: DriverEventStats | None, driver_name: str, pipeline: PipelineStats
) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "gpu_triage_event_source_up",
        "1 if the XID source is being read (kernel log, driver events), 0 if it is failing; absent if turned off.",
        labels=["source"],
    )
    if kmsg is not None:
        up.add_metric(["kmsg"], 1.0 if kmsg.up else 0.0)
    if driver is not None:
        up.add_metric([driver_name], 1.0 if driver.up else 0.0)
    yield up
    records = CounterMetricFamily("gpu_triage_kmsg_records", "Kernel-log records read (lines, when following a file).")
    records.add_metric([], float(pipeline.kmsg_lines))
    yield records
    if kmsg is not None:
        overruns = CounterMetricFamily(
            "gpu_triage_kmsg_overruns",
            "Times the kernel overwrote kernel-log records before the daemon read them (EPIPE).",
        )
        overruns.add_metric([], float(kmsg.overruns))
        yield overruns
    skipped = CounterMetricFamily(
        "gpu_triage_kmsg_skipped_lines",
        "Kernel-log lines that named an XID but could not be used, by reason.",
        labels=["reason"],
    )
    stats = pipeline.parse
    for reason, count in (
        ("overlong", stats.overlong),
        ("malformed", stats.malformed + (kmsg.malformed if kmsg else 0)),
        ("not_kernel", stats.not_kernel),
    ):
        skipped.add_metric([reason], float(count))
    yield skipped
    merged = CounterMetricFamily(
        "gpu_triage_xid_merged_reports",
        "XID reports folded into an event that the other kind of source had already reported.",
    )
    merged.add_metric([], float(pipeline.merged))
    yield merged
    failed = CounterMetricFamily(
        "gpu_triage_event_batches_failed",
        "Batches of kernel-log lines or driver events that could not be processed and were skipped (see the log).",
    )
    failed.add_metric([], float(pipeline.failed_batches))
    yield failed


def journal_families(stats: JournalStats) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "gpu_triage_journal_up",
        "1 if the event journal takes writes, 0 while it refuses them (a full disk): XIDs then wait unread.",
    )
    up.add_metric([], 1.0 if stats.up else 0.0)
    yield up
    errors = CounterMetricFamily(
        "gpu_triage_journal_write_errors", "Event-journal writes that failed and were tried again."
    )
    errors.add_metric([], float(stats.write_errors))
    yield errors
    aside = CounterMetricFamily(
        "gpu_triage_journal_moved_aside",
        "Unusable event-journal files (corrupt or empty) moved aside at start; XID history before is in them.",
    )
    aside.add_metric([], float(stats.moved_aside))
    yield aside
