"""The XID catalog: what each XID code means, what to do about it, and how its context changes that.

An `XidCatalog` joins NVIDIA's facts with our policy and our action mappings (see diagnosis/xid/catalog_data.py,
which loads and checks the four data files); it answers what a code means on its own, decodes the
NVLink5 payload of Xid 144-150 and reads the action Xid 154 asks for. `ContextPolicy` says which codes
the classifier (diagnosis/xid/incidents.py) weighs by their neighbours and history, and how.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from gpu_triage.diagnosis.core.actions import Action, Severity, most_urgent
from gpu_triage.diagnosis.core.playbooks import action_playbook
from gpu_triage.diagnosis.xid.kernel_log import parse_recovery_change

# What the classifier may have to weigh beyond the code itself (the `context` tags of xid_policy.yaml).
CONTEXTS = frozenset({"history", "co_occurrence", "recovery_text", "decode", "platform"})


@dataclass(frozen=True, slots=True)
class XidVerdict:
    """What to say about an XID when nothing but a fixed verdict applies."""

    action: Action
    severity: Severity
    playbook: str


# A code missing from the catalog (a newer driver's, most likely): we cannot say how bad it is, so
# find out on the drained GPU rather than guess. The daemon and offline diagnosis both use this.
UNKNOWN_XID = XidVerdict(Action.RUN_DIAGNOSTICS, Severity.UNKNOWN, action_playbook(Action.RUN_DIAGNOSTICS))


@dataclass(frozen=True, slots=True)
class RowRemap:
    codes: frozenset[int]  # the row remapper's events ...
    raises: frozenset[int]  # ... beside these codes (the uncorrectable error) raise its action ...
    to: Action  # ... to at least this one


@dataclass(frozen=True, slots=True)
class Repeats:
    codes: frozenset[int]  # application faults that, coming back, point at the GPU
    incidents: int  # this many incidents ...
    window_seconds: float  # ... within this window
    same_spot: frozenset[int]  # or, for these, a second one on the same GPC/TPC
    to: Action


@dataclass(frozen=True, slots=True)
class ContextPolicy:
    """Which codes the classifier weighs by their neighbours and history, and how (xid_policy.yaml `classifier`)."""

    burst_gap_seconds: float  # XIDs on one GPU with shorter gaps are one incident
    sympathetic: frozenset[int]  # never the root cause while another XID is in the incident
    row_remap: RowRemap
    decoded: frozenset[int]  # the NVLink5 decode sheet decides their action
    recovery: int  # the XID that names the recovery action the driver wants
    repeats: Repeats


@dataclass(frozen=True, slots=True)
class XidEntry:
    code: int
    mnemonic: str
    nvidia_description: str  # NVIDIA's short label ("Unused" for retired codes)
    title: str  # ours
    causes: tuple[str, ...]
    immediate_bucket: str | None  # None where this catalog revision has no bucket (162-172)
    investigatory_bucket: str | None
    action: Action
    severity: Severity
    playbook: str
    deviation: str | None  # why `action` differs from `nvidia_action`
    context: frozenset[str]  # what the classifier must consider beyond the code (CONTEXTS)
    applies_to: tuple[str, ...] = ()
    nvidia_action: Action | None = None  # what NVIDIA's immediate bucket means in our vocabulary
    xid154_linkage: str | None = None  # the first driver that follows this code with an Xid 154

    @property
    def xid154_linked(self) -> bool:
        return bool(self.xid154_linkage)


@dataclass(frozen=True, slots=True)
class ActionMappings:
    buckets: Mapping[str, Action]
    unknown_bucket: Action
    recovery: Mapping[int, Action]  # nvmlDeviceGpuRecoveryAction_t value → Action
    recovery_names: Mapping[int, str]
    unknown_recovery: Action
    xid154_labels: Mapping[str, Action]
    gpud: Mapping[Action, str]
    nvsentinel: Mapping[Action, str]

    def bucket_action(self, bucket: str) -> Action:
        return self.buckets.get(bucket, self.unknown_bucket)

    def recovery_action(self, value: int) -> Action:
        return self.recovery.get(value, self.unknown_recovery)

    def recovery_named(self, value: int) -> tuple[str, Action]:
        """An NVML recovery action value → (its name, or the number where unnamed; our Action)."""
        return self.recovery_names.get(value, str(value)), self.recovery_action(value)


Bits = tuple[int, int]  # (mask, value) of an IntrInfo pattern: `x & mask == value`


@dataclass(frozen=True, slots=True)
class Nvlink5Rule:
    """One row of NVIDIA's Xid 144-150 decode sheet."""

    xid: int
    units: frozenset[str]  # normalised names; rows name the V1 and the V2 spelling
    patterns: tuple[Bits, ...]  # IntrInfo, V1 and V2 layouts
    error_status: frozenset[int]  # empty: any
    immediate: str
    action2_patterns: tuple[Bits, ...]  # IntrInfo that promotes the row to `action2`
    action2: str | None
    investigatory: str | None
    fatal: bool

    def bucket_for(self, intr_info: int | None, line_fatal: bool | None) -> str:
        if self.action2 is not None and (_matches(self.action2_patterns, intr_info) or (line_fatal and not self.fatal)):
            return self.action2
        return self.immediate


@dataclass(frozen=True, slots=True)
class Nvlink5Decode:
    unit: str
    immediate_bucket: str
    investigatory_bucket: str | None
    action: Action
    fatal: bool
    rows: int  # decode-sheet rows the line matched; more than one means the line was ambiguous


def _matches(patterns: tuple[Bits, ...], value: int | None) -> bool:
    return value is not None and any(value & mask == bits for mask, bits in patterns)


def unit_key(name: str) -> str:
    return "_".join(name.upper().split())


def parse_hex(text: str | None) -> int | None:
    try:
        return int(text, 16) if text else None
    except ValueError:
        return None


class XidCatalog:
    """Every catalog code with NVIDIA's facts and our policy, the mappings, the NVLink5 decode, the context policy."""

    def __init__(
        self,
        entries: Mapping[int, XidEntry],
        mappings: ActionMappings,
        nvlink5: tuple[Nvlink5Rule, ...],
        context: ContextPolicy,
    ) -> None:
        self._entries = dict(sorted(entries.items()))
        self.mappings = mappings
        self.nvlink5_rules = nvlink5
        self.context = context

    def get(self, code: int) -> XidEntry | None:
        return self._entries.get(code)

    def __iter__(self) -> Iterator[XidEntry]:
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def recovery_action_from_text(self, text: str) -> Action | None:
        """The Action Xid 154's text asks for; None when the text is not a recovery-action change."""
        change = parse_recovery_change(text)
        if change is None:
            return None
        value, label = change
        if value not in self.mappings.recovery and label and label.strip() in self.mappings.xid154_labels:
            return self.mappings.xid154_labels[label.strip()]
        return self.mappings.recovery_action(value)

    def decode_nvlink5(self, code: int, details: Mapping[str, str]) -> Nvlink5Decode | None:
        """Xid 144-150 payload (`KernelEvent.details`) → the decode sheet's verdict; None for unknown units.

        Rows are narrowed by unit, then IntrInfo pattern, error status and the line's Fatal/Nonfatal word;
        a narrowing that would leave nothing is skipped, and the most urgent of the rows left wins.
        """
        unit = details.get("unit")
        if not unit:
            return None
        rows = [r for r in self.nvlink5_rules if r.xid == code and unit_key(unit) in r.units]
        if not rows:
            return None
        intr, status = parse_hex(details.get("intr_info")), parse_hex(details.get("error_status"))
        word = details.get("severity")
        line_fatal = None if word is None else word.lower() == "fatal"
        filters: list[Callable[[Nvlink5Rule], bool]] = [
            lambda r: _matches(r.patterns, intr) or _matches(r.action2_patterns, intr),
            lambda r: status is not None and (not r.error_status or status in r.error_status),
            lambda r: line_fatal is not None and (r.fatal == line_fatal or (line_fatal and r.action2 is not None)),
        ]
        for keep in filters:
            rows = [r for r in rows if keep(r)] or rows
        verdicts = [(self.mappings.bucket_action(r.bucket_for(intr, line_fatal)), r) for r in rows]
        action = most_urgent([a for a, _ in verdicts])
        chosen = next(r for a, r in verdicts if a == action)
        return Nvlink5Decode(
            unit=unit,
            immediate_bucket=chosen.bucket_for(intr, line_fatal),
            investigatory_bucket=chosen.investigatory,
            action=action,
            fatal=chosen.fatal or bool(line_fatal),
            rows=len(rows),
        )
