"""Every rule's examples as logs show them: behind each launcher's prefix, and hard-wrapped by a terminal.

The examples in diagnosis/data/training_rules.yaml are written from the printers' format strings, one
per version shape; here each is also tried the way it reaches a user: behind the prefix a launcher or a
log pipeline puts before every line, and inside a log a ticket system cut at a fixed width.
"""

from __future__ import annotations

import pytest

from gpu_triage.diagnosis.training.diagnose import diagnose
from gpu_triage.diagnosis.training.input.log_lines import normalise
from gpu_triage.diagnosis.training.rules.load import load_rules
from gpu_triage.diagnosis.training.rules.model import Example, Rule
from tests.diagnosis.corpus_jobs import wrap

RULES = load_rules()
EXAMPLES = [(r, ex) for r in RULES.rules for ex in r.examples]

# What launchers and log pipelines put before a line (log_lines.normalise takes each kind off once).
PREFIXES = {
    "srun --label": "3: ",
    "pdsh": "gpu-node-09: ",
    "mpirun --tag-output": "[1,3]<stderr>:",
    "kubectl logs --prefix": "[pod/trainer-3/main] ",
    "containerd": "2024-05-01T12:00:00.123456789Z stderr F ",
    "journald": "May 01 12:00:00 gpu-node-09 python3[4242]: ",
}
# Lines NCCL prints at start-up, longer than any width tried: the wrap is seen on several cut lines.
FILLERS = (
    "gpu-node-09:4242:4242 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB [2]mlx5_4:1/IB "
    "[3]mlx5_5:1/IB [4]mlx5_6:1/IB [5]mlx5_9:1/IB [6]mlx5_10:1/IB [7]mlx5_11:1/IB [RO]; OOB eth0:10.0.0.9<0>",
    "gpu-node-09:4242:4290 [0] NCCL INFO ncclCommInitRank comm 0x55d4b0c0 rank 9 nranks 16 cudaDev 1 nvmlDev 1 "
    "busId 2a000 commId 0x8e1c5a2f0b7d4c61 - Init COMPLETE",
    "gpu-node-09:4242:4290 [0] NCCL INFO Init timings - ncclCommInitRank: rank 9 nranks 16 total 1.23 (kernels "
    "0.21, alloc 0.04, bootstrap 0.45, allgathers 0.02, topo 0.19, graphs 0.01, connections 0.31, rest 0.04)",
)


def _id(item: tuple[Rule, Example]) -> str:
    rule, ex = item
    return f"{rule.class_id}-{rule.examples.index(ex)}"


def _same_kind(prefix: str, line: str) -> bool:
    """Whether `line` already starts with a prefix of the kind `prefix` is (each kind is taken off once)."""
    return normalise(prefix + prefix + "x").text != "x" and normalise(line).text != normalise(prefix + line).text


@pytest.mark.parametrize("launcher", sorted(PREFIXES))
@pytest.mark.parametrize(("rule", "example"), EXAMPLES, ids=[_id(e) for e in EXAMPLES])
def test_an_example_behind_a_launcher_prefix_lands_on_its_rule(rule: Rule, example: Example, launcher: str) -> None:
    prefixed = PREFIXES[launcher] + example.line
    got = RULES.match(normalise(prefixed).text)
    if got is None or got.rule is not rule:
        assert _same_kind(PREFIXES[launcher], example.line), f"{prefixed!r} lands on {got and got.rule.class_id}"


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize(("rule", "example"), EXAMPLES, ids=[_id(e) for e in EXAMPLES])
def test_an_example_hard_wrapped_in_a_log_is_still_found(rule: Rule, example: Example, width: int) -> None:
    text = wrap("\n".join([FILLERS[0], FILLERS[1], "[default3]:" + example.line, FILLERS[2]]), width) + "\n"
    report = diagnose([("ticket.txt", [text.encode()])])
    found = {f.class_id for f in report.findings} | {f.class_id for f in report.performance}
    assert rule.class_id in found, (width, [f.class_id for f in report.findings])
