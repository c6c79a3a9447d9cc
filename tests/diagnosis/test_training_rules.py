"""The shipped training-log rules, and the loader that refuses a bad rules file."""

from __future__ import annotations

import itertools
import re
from importlib import resources
from typing import Any

import pytest
import yaml

from gpu_triage.diagnosis.core.actions import Action, Severity
from gpu_triage.diagnosis.core.data_files import DataError
from gpu_triage.diagnosis.training.input.log_lines import normalise
from gpu_triage.diagnosis.training.rules.load import load_rules, parse_rules, parse_rules_text
from gpu_triage.diagnosis.training.rules.model import FIELDS, REQUIRED_CLASSES, Example, playbook_id
from gpu_triage.diagnosis.training.scan.block_scan import LiteralFinder, engine_name, finder_for

RULES = load_rules()
SIGNATURES = [sig.regex for sig in RULES.signatures()]
EXAMPLES = [(rule.class_id, ex) for rule in RULES.rules for ex in rule.examples]
CONTEXT_EXAMPLES = [(str(ctx.kind), ex) for ctx in RULES.context for ex in ctx.examples]
PATTERNS = [s.scan for s in RULES.signatures()]
LITERALS = [lit for s in RULES.signatures() for lit in s.literals]
HYPERSCAN = engine_name() == "hyperscan"


def _text() -> str:
    return resources.files("gpu_triage.diagnosis").joinpath("data/training_rules.yaml").read_text(encoding="utf-8")


def _doc() -> dict[str, Any]:
    doc = yaml.safe_load(_text())
    assert isinstance(doc, dict)
    return doc


def _flagged(finder_name: str, line: str) -> bool:
    """Whether the block scan hands `line`, in the middle of other text, to the classifier."""
    data = f"healthy line one\n{line}\nhealthy line two\n".encode()
    finder = finder_for(PATTERNS, LITERALS, finder_name)
    start = data.index(line.encode())
    return start in finder(data, 0, len(data))


def test_every_class_has_exactly_one_rule() -> None:
    # Which classes there are is in tests/golden/diagnosis-classes.txt (tests/diagnosis/test_listing.py).
    ids = [r.class_id for r in RULES.rules]
    assert len(ids) == len(set(ids))


def test_each_class_links_its_own_playbook_and_has_steps() -> None:
    for rule in RULES.rules:
        assert rule.playbook == playbook_id(rule.class_id) == "nccl-" + rule.class_id.replace("_", "-")
        assert rule.title and len(rule.steps) >= 2
        assert isinstance(rule.action, Action) and isinstance(rule.severity, Severity)
        assert rule.severity is not Severity.UNKNOWN


def test_specificity_order_follows_the_reference() -> None:
    order = [r.class_id for r in RULES.rules]

    def before(a: str, b: str) -> bool:
        return order.index(a) < order.index(b)

    chain = [
        "gpu_hw_fault",
        "host_oom_killed",
        "cuda_oom",
        "cuda_illegal_address",
        "ib_async_event",
        "ib_completion_timeout",
        "shm_unavailable",
        "p2p_broken",
        "nvswitch_fabric_error",
        "duplicate_gpu",
        "ring_topology_error",
        "nccl_lib_mismatch",
        "socket_connect_error",
        "size_mismatch_truncated",
        "collective_mismatch",
        "job_failed_unclassified",
        "collective_timeout",
        "watchdog_hang",
        "remote_peer_closed",
        "nccl_generic_error",
    ]
    assert all(before(a, b) for a, b in itertools.pairwise(chain))
    symptoms = {r.class_id for r in RULES.rules if r.symptom}
    assert symptoms == {
        "collective_timeout",
        "watchdog_hang",
        "remote_peer_closed",
        "nccl_generic_error",
        "nccl_comm_aborted",
    }
    assert order.index("process_segfault") < order.index("ib_gdr_access_error")


@pytest.mark.parametrize(("class_id", "example"), EXAMPLES, ids=[f"{c}-{i}" for i, (c, _) in enumerate(EXAMPLES)])
def test_example_matches_its_own_rule_and_no_more_specific_one(class_id: str, example: Example) -> None:
    text = normalise(example.line).text
    own = RULES.rule(class_id)
    assert any(sig.search(text) for sig in own.signatures)
    for rule in RULES.rules[: own.specificity]:
        assert not any(sig.search(text) for sig in rule.signatures), f"{rule.class_id} steals it"
    match = RULES.match(text)
    assert match is not None and match.rule is own


ALL_EXAMPLES = EXAMPLES + CONTEXT_EXAMPLES


@pytest.mark.parametrize(("kind", "example"), ALL_EXAMPLES, ids=[f"{c}-{i}" for i, (c, _) in enumerate(ALL_EXAMPLES)])
def test_every_example_reaches_the_classifier_through_both_block_scans(kind: str, example: Example) -> None:
    """The scan forms and the literals are derived from the signatures: neither may lose a line."""
    assert _flagged("python", example.line)
    if HYPERSCAN:
        assert _flagged("hyperscan", example.line)


def test_every_signature_has_an_example() -> None:
    for rule in RULES.rules:
        texts = [normalise(ex.line).text for ex in rule.examples]
        for sig in rule.signatures:
            assert any(sig.search(t) for t in texts), f"{rule.class_id}: no example for {sig.pattern!r}"


@pytest.mark.parametrize("line", RULES.near_misses)
def test_near_misses_match_no_rule(line: str) -> None:
    """A near miss is no finding: no rule takes it, unless a performance condition (told beside the findings)."""
    match = RULES.match(normalise(line).text)
    assert match is None or match.rule.performance


def test_context_examples_match_their_context_only() -> None:
    for ctx in RULES.context:
        for ex in ctx.examples:
            text = normalise(ex.line).text
            found = RULES.match_context(text)
            assert found is not None and found.kind is ctx.kind
            assert RULES.match(text) is None


def test_ib_completion_status_chooses_the_class() -> None:
    base = "NET/IB : Got completion from peer 10.0.0.2<1234> with error {}, opcode 0, len 0, vendor err 129"
    classes = {
        status: RULES.match(base.format(status)).rule.class_id  # type: ignore[union-attr]
        for status in (4, 5, 10, 12, 13)
    }
    assert classes == {
        4: "ib_gdr_access_error",
        5: "ib_completion_timeout",
        10: "ib_gdr_access_error",
        12: "ib_completion_timeout",
        13: "ib_completion_timeout",
    }
    named = "NET/IB: Got completion from peer 10.0.0.2<1234> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) vendor_err=129 hca mlx5_3"
    match = RULES.match(named)
    assert match is not None
    assert match.fields == {
        "peer": "10.0.0.2<1234>",
        "ib_status_name": "IBV_WC_RETRY_EXC_ERR",
        "ib_status": "12",
        "opcode_name": "IBV_WC_SEND",
        "opcode": "0",
        "vendor_err": "129",
        "hca": "mlx5_3",
    }


def test_every_group_name_is_a_known_field() -> None:
    for sig in SIGNATURES:
        assert set(sig.groupindex) <= set(FIELDS)


def test_the_literal_finder_looks_for_few_distinct_words() -> None:
    finder = LiteralFinder(LITERALS)
    assert all(len(n) >= 4 for n in finder._needles)


def test_loader_reports_every_problem_at_once() -> None:
    doc = _doc()
    rules = doc["rules"]
    rules[0]["action"] = "REBOOT_PLEASE"
    rules[1]["severity"] = "fatal"
    rules[2]["signatures"].append("(unclosed")
    rules[3]["signatures"].append(r"Cuda failure.*")
    rules[4]["signatures"].append(r"driver (?P<driver>\d{1,4})")
    next(r for r in rules if r["class"] == "ib_gdr_access_error")["playbook"] = "ib-gdr"
    rules[6]["colour"] = "red"
    rules.append(dict(rules[7]))  # a duplicate class
    doc["near_misses"].append("node1:1:1 [0] NCCL WARN NET/IB : Got async event : port error")
    with pytest.raises(DataError) as info:
        parse_rules(doc)
    text = str(info.value)
    problems = info.value.problems
    assert len(problems) >= 9
    for needle in (
        "action 'REBOOT_PLEASE' is not one of",
        "severity 'fatal' is not one of",
        "bad regex",
        "unbounded repetition",
        "unknown field (group name) 'driver'",
        "playbook must be 'nccl-ib-gdr-access-error'",
        "unknown key 'colour'",
        "duplicate class",
        "near_misses: matches 'ib_async_event'",
    ):
        assert needle in text


def test_loader_rejects_an_example_stolen_by_a_more_specific_rule() -> None:
    doc = _doc()
    timeout = next(r for r in doc["rules"] if r["class"] == "collective_timeout")
    timeout["examples"].append("[rank3]: RuntimeError: CUDA error: uncorrectable ECC error encountered")
    with pytest.raises(DataError, match="lands on more specific 'gpu_hw_fault'"):
        parse_rules(doc)


@pytest.mark.parametrize(
    ("signature", "problem"),
    [
        (r"(?<![\w.-])mlx5_\d{1,2} port error", "look-ahead/look-behind is not allowed"),
        (r"port error(?=\s)", "look-ahead/look-behind is not allowed"),
        (r"(port) error \1", "back-references are not allowed"),
        (r"(?i)port error", "inline flags are not allowed"),
        (r"\d{1,4}: \w{1,9}", "no literal text of 4+ characters"),
        (r"(?:x\d{1,60}){1,60} error", "around a repeat"),
        (
            r"CalledProcessError: Command [^\n]{1,2000}?(?:--local_rank=(?P<local_rank>\d{1,5})[^\n]{0,2000}?)? "
            r"returned non-zero exit status (?P<exitcode>\d{1,3})",
            "wide repeats in a row",
        ),
        (r"caf\u00e9 error", "non-ASCII literal"),
    ],
)
def test_loader_rejects_what_a_block_scan_cannot_run_or_a_line_cannot_be_keyed_on(signature: str, problem: str) -> None:
    doc = _doc()
    doc["rules"][0]["signatures"].append(signature)
    with pytest.raises(DataError, match=re.escape(problem)):
        parse_rules(doc)


def test_loader_rejects_unknown_top_level_keys_and_bad_yaml() -> None:
    doc = _doc()
    doc["extra"] = 1
    with pytest.raises(DataError, match="unknown key 'extra'"):
        parse_rules(doc)
    with pytest.raises(DataError, match="not valid YAML"):
        parse_rules_text("rules: [unclosed")
    with pytest.raises(DataError, match="expected a mapping"):
        parse_rules([1, 2])


@pytest.mark.parametrize("class_id", REQUIRED_CLASSES)
def test_loader_rejects_rules_without_a_class_the_code_relies_on(class_id: str) -> None:
    doc = _doc()
    doc["rules"] = [r for r in doc["rules"] if r["class"] != class_id]
    # Examples of the removed class now land on other rules; only the missing class matters here.
    with pytest.raises(DataError, match=f"no rule for class {class_id!r}"):
        parse_rules(doc)


def test_shipped_text_parses_the_same_way() -> None:
    again = parse_rules_text(_text())
    assert [r.class_id for r in again.rules] == [r.class_id for r in RULES.rules]
    assert [s.scan for s in again.signatures()] == PATTERNS
