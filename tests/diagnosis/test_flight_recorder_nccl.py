"""What only ProcessGroupNCCL's recorder writes: entry states, send/recv entries, a pg_config by group name.

No GPU here, so these dumps are the recorded Gloo ones rewritten the way FlightRecorderDetail.hpp
fills them in for NCCL: `state` from the CUDA events ("completed" once the end event fired, "started"
once the start event did), `profiling_name` "nccl:<op>" and "nccl:send 0->1" / "nccl:recv 1<-0"
(group ranks) with `is_p2p` and `p2p_seq_id`, `pg_config` keyed by group name with its ranks as text.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

from gpu_triage.diagnosis.training.diagnose import diagnose
from gpu_triage.diagnosis.training.hang.fr_unpickle import loads

FR = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder"


def _nccl(scenario: str) -> dict[int, dict[str, Any]]:
    dumps = {}
    for f in sorted((FR / scenario / "pickle").iterdir()):
        raw = loads(f.read_bytes())
        raw["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}}
        raw["comm_lib_version"] = "2.21.5"
        for e in raw["entries"]:
            e["profiling_name"] = e["profiling_name"].replace("gloo:", "nccl:")
            e["state"] = "completed"
        dumps[int(f.name.rsplit("_", 1)[1])] = raw
    return dumps


def _entry(like: dict[str, Any], **changes: Any) -> dict[str, Any]:
    e = copy.deepcopy(like)
    e.update(changes)
    return e


def _run(dumps: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    inputs = [(f"nccl_trace_rank_{r}", [pickle.dumps(d, protocol=2)]) for r, d in sorted(dumps.items())]
    return diagnose(inputs).to_json()["findings"]


def test_a_rank_stuck_in_a_collective_its_peers_completed() -> None:
    dumps = _nccl("never_joined")  # ranks 0, 1, 3 reached all_reduce #5; rank 2 stopped after #4
    last = dumps[0]["entries"][-1]
    dumps[2]["entries"].append(_entry(last, record_id=last["record_id"], state="started"))
    for r in (0, 1, 3):
        dumps[r]["entries"].append(
            _entry(last, record_id=last["record_id"] + 1, collective_seq_id=6, op_id=6, state="started")
        )
    root = _run(dumps)[0]
    assert root["class"] == "collective_stuck" and root["details"]["ranks"] == [2]
    assert root["details"]["seq"] == 5


def test_states_make_a_healthy_snapshot_healthy() -> None:
    assert _run(_nccl("healthy")) == []


def test_a_recv_with_no_send_names_the_rank_that_never_sent() -> None:
    dumps = _nccl("never_joined")
    # Rank 2 waits in a recv from rank 0 (recorded by NCCL) instead of entering #5; rank 0 never sent.
    last = dumps[2]["entries"][-1]
    dumps[2]["entries"].append(
        _entry(
            last,
            record_id=last["record_id"] + 1,
            profiling_name="nccl:recv 2<-0",
            is_p2p=True,
            p2p_seq_id=1,
            op_id=5,
            state="scheduled",
        )
    )
    for r in (0, 1, 3):
        dumps[r]["entries"][-1]["state"] = "started"
    root = _run(dumps)[0]
    assert root["class"] == "p2p_unmatched"
    assert root["rank"] == 0 and root["details"]["waiting"] == [2]


def test_membership_from_a_named_pg_config_finds_a_rank_with_no_entries_in_a_sub_group() -> None:
    dumps = _nccl("never_joined")
    sub = {"name": "7", "desc": "tp", "ranks": "[1, 2]"}
    for r in dumps:
        dumps[r]["pg_config"]["7"] = sub
    last = dumps[0]["entries"][-1]
    dumps[2]["entries"].append(copy.deepcopy(last))  # every rank completed the default group's #5 ...
    # ... then rank 1 entered sub-group 7's first collective, and rank 2, blocked, has no entry of group 7 at all.
    dumps[1]["entries"].append(
        _entry(last, record_id=last["record_id"] + 1, process_group=("7", "tp"), pg_id=1, collective_seq_id=1)
    )
    dumps[1]["entries"][-1]["state"] = "started"
    found = _run(dumps)
    assert [(f["class"], f["details"]["process_group"], f["details"]["seq"]) for f in found] == [
        ("collective_never_joined", "7", 1)
    ]
    assert found[0]["details"]["ranks"] == [2] and found[0]["details"]["waiting"] == [1]


def test_a_ring_buffer_that_dropped_the_collective_says_so() -> None:
    dumps = _nccl("never_joined")
    # The ranks that went on kept only their newest entries: #5's record survives on none of them ...
    for r in (0, 1, 3):
        dumps[r]["entries"] = [
            _entry(e, collective_seq_id=e["collective_seq_id"] + 100, record_id=e["record_id"] + 100)
            for e in dumps[r]["entries"]
        ]
    root = _run(dumps)[0]
    # ... so rank 2 is still the one behind, but the op it never joined is not guessed.
    assert root["class"] == "collective_never_joined" and root["rank"] == 2
    assert root["details"]["op"] is None and root["details"]["dropped"] is True


def test_a_dump_not_collected_from_a_job_that_ran_on_is_no_hang() -> None:
    dumps = _nccl("healthy")
    del dumps[2]  # its file was not collected; the others completed their last collective, which needed it
    assert _run(dumps) == []
    still = _nccl("rank_killed")  # the others never completed #5: rank 2 is missing
    root = _run({r: _started_last(d) for r, d in still.items()})[0]
    assert root["class"] == "rank_missing" and root["rank"] == 2


def _started_last(raw: dict[str, Any]) -> dict[str, Any]:
    raw["entries"][-1]["state"] = "started"
    return raw
