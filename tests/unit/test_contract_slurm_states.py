"""The one Slurm-state table: every state Slurm reports means one run state, and the merged state lookup.

Recorded answers come from golden/slurm/VERSION/ (see test_contract_slurm_answers.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from hpctrain.contract import slurm
from hpctrain.contract.slurm import Slurm, SlurmCommandError
from hpctrain.contract.slurm_answers import parse_config, parse_nodes, parse_sacct_states, parse_slurmd_port
from hpctrain.contract.slurm_states import (
    ACTIVE_STATES,
    SLURM_STATES,
    TERMINAL_STATES,
    ended_unsuccessfully,
    is_final,
    is_pending,
    is_running,
    may_have_processes,
    run_state,
    succeeded,
    was_cancelled,
)

GOLDEN = Path(__file__).parent / "golden" / "slurm"
VERSIONS = ["22.05", "24.11", "26.05"]

# Every job state of squeue(1)'s "JOB STATE CODES" (and sacct's), 23.02+'s PLANNED included.
EXPECTED = {
    "PENDING": "pending",
    "PLANNED": "pending",
    "REQUEUED": "pending",
    "REQUEUE_FED": "pending",
    "REQUEUE_HOLD": "pending",
    "SPECIAL_EXIT": "pending",
    "RESV_DEL_HOLD": "pending",
    "CONFIGURING": "running",
    "POWER_UP_NODE": "running",
    "RUNNING": "running",
    "RESIZING": "running",
    "SIGNALING": "running",
    "SUSPENDED": "running",
    "STOPPED": "running",
    "COMPLETING": "ending",
    "STAGE_OUT": "ending",
    "COMPLETED": "finished-ok",
    "FAILED": "finished-failed",
    "TIMEOUT": "finished-failed",
    "NODE_FAIL": "finished-failed",
    "OUT_OF_MEMORY": "finished-failed",
    "BOOT_FAIL": "finished-failed",
    "DEADLINE": "finished-failed",
    "CANCELLED": "cancelled",
    "PREEMPTED": "cancelled",  # ended by a preemption that did not requeue it (issue 30)
    "LAUNCH_FAILED": "unknown",
    "UPDATE_DB": "unknown",
    "REVOKED": "unknown",
    "UNKNOWN": "unknown",
}


def recorded(version: str, name: str) -> str:
    return (GOLDEN / version / name).read_text()


def answer(out: str = "", code: int = 0, err: str = "") -> Any:
    def runner(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, code, stdout=out, stderr=err)

    return runner


def test_the_table_names_every_slurm_state_once() -> None:
    assert SLURM_STATES == EXPECTED


@pytest.mark.parametrize(("state", "run"), sorted(EXPECTED.items()))
def test_every_state_answers_every_question_consistently(state: str, run: str) -> None:
    assert run_state(state) == run
    assert is_final(state) == (run in ("finished-ok", "finished-failed", "cancelled")) == (state in TERMINAL_STATES)
    assert is_pending(state) == (run == "pending")
    assert is_running(state) == (run == "running")
    assert may_have_processes(state) == (run in ("running", "ending")) == (state in ACTIVE_STATES)
    assert succeeded(state) == (state == "COMPLETED")
    assert was_cancelled(state) == (state in ("CANCELLED", "PREEMPTED"))
    assert ended_unsuccessfully(state) == (is_final(state) and state != "COMPLETED")


def test_the_final_and_active_sets_are_what_they_were() -> None:
    assert {
        "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
        "PREEMPTED",
    } == TERMINAL_STATES  # fmt: skip
    assert {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"} <= ACTIVE_STATES


@pytest.mark.parametrize(
    ("raw", "run"),
    [("CANCELLED by 1000", "cancelled"), ("FAILED+", "finished-failed"), (" RUNNING\n", "running"),
     ("", "unknown"), ("SOME_FUTURE_STATE", "unknown"), ("local, process gone", "unknown")],
)  # fmt: skip
def test_suffixes_and_states_the_table_does_not_know(raw: str, run: str) -> None:
    assert run_state(raw) == run
    assert not is_final("SOME_FUTURE_STATE")  # an unknown state keeps a wait waiting, never ends it early


@pytest.mark.parametrize("version", VERSIONS)
def test_recorded_states_of_each_release_are_in_the_table(version: str) -> None:
    states = parse_sacct_states(recorded(version, "sacct_states.txt"))
    assert states and all(state in SLURM_STATES for state in states.values())
    assert {run_state(state) for state in states.values()} <= {"finished-ok", "finished-failed", "cancelled", "pending"}
    for name in ("squeue_running.txt", "squeue_requeued.txt"):
        assert may_have_processes(recorded(version, name)) or is_pending(recorded(version, name))


@pytest.mark.parametrize("version", VERSIONS)
def test_merged_lookup_on_recorded_answers(version: str) -> None:
    sacct = recorded(version, "sacct_states.txt")
    job_id, state = next(iter(parse_sacct_states(sacct).items()))
    assert Slurm(answer(out=sacct)).job_state(job_id) == state
    running = recorded(version, "squeue_running.txt")
    assert Slurm(answer(out=running)).job_state("12", source="squeue") == "RUNNING"
    unknown = recorded(version, "scontrol_show_job_unknown.txt")
    with pytest.raises(SlurmCommandError) as raised:
        Slurm(answer(code=1, err=unknown)).job_state("12", source="squeue")
    assert raised.value.kind == "unknown-job"


def test_merged_lookup_falls_back_to_squeue_only_while_sacct_has_not_caught_up() -> None:
    asked: list[str] = []

    def fresh_job(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        asked.append(command[0])
        if command[0] == "squeue":
            return subprocess.CompletedProcess(command, 1, stdout="", stderr="slurm_load_jobs error: Invalid job id")
        return subprocess.CompletedProcess(command, 0, stdout="", stderr="")

    assert Slurm(fresh_job).job_state("12") == "UNKNOWN" and asked == ["sacct", "squeue"]  # squeue forgot it

    def no_squeue(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        if command[0] == "squeue":
            raise FileNotFoundError(command[0])
        return subprocess.CompletedProcess(command, 0, stdout="", stderr="")

    assert Slurm(no_squeue).job_state("12") == "UNKNOWN"  # accounting only: sacct's silence is the answer
    with pytest.raises(SlurmCommandError) as raised:
        Slurm(no_squeue).job_state("12", source="squeue")
    assert raised.value.kind == "missing"


@pytest.mark.parametrize("version", VERSIONS)
def test_config_and_node_parsers_on_recorded_answers(version: str) -> None:
    text = recorded(version, "scontrol_show_config.txt")
    config = parse_config(text)
    assert config["KillWait"].split()[0].isdigit() and "MaxArraySize" in config
    assert parse_slurmd_port(text) == 6818  # what the healing supervisor probes a node's slurmd on
    nodes = parse_nodes(recorded(version, "scontrol_show_node.txt"))
    assert nodes and all(node["NodeName"] for node in nodes)


def test_a_wrapped_helper_job_is_submitted_through_the_client(tmp_path: Path) -> None:
    options = [("qos", "q"), ("partition", None), ("exclusive", True), ("gres", "")]
    command = slurm.sbatch_wrap_command(
        job_name="probe", wrap="echo hi", output=tmp_path / "o", time_min=2, options=options
    )
    assert (
        command[:2] == ["sbatch", "--parsable"] and "--no-requeue" in command and command[-2:] == ["--wrap", "echo hi"]
    )
    assert "--qos=q" in command and "--exclusive" in command
    assert not any(arg.startswith(("--partition", "--gres")) for arg in command)
    assert Slurm(answer(out="4711;cluster\n")).submit_wrapped(command) == "4711"
    with pytest.raises(SlurmCommandError):
        Slurm(answer(out="--user=me\n")).submit_wrapped(command)  # not a job id: never used as one


def test_an_array_listed_by_its_tasks_is_still_running_while_squeue_lists_a_task() -> None:
    def array(squeue_out: str) -> Any:
        def runner(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
            out = "12_0|COMPLETED\n12_1|RUNNING\n" if command[0] == "sacct" else squeue_out
            return subprocess.CompletedProcess(command, 0, stdout=out, stderr="")

        return runner

    assert Slurm(array("RUNNING\nPENDING\n")).job_state("12") == "RUNNING"  # task 0's end is not the array's
    assert Slurm(array("")).job_state("12") == "COMPLETED"  # squeue has forgotten it: sacct's first line
    assert Slurm(array("")).job_state("12_1") == "RUNNING"  # a task is answered by its own line


@pytest.mark.parametrize(
    ("squeue", "state"),
    [
        ("", "PREEMPTED"),  # slurmctld no longer runs it: ended by the preemption (or its requeue flag was gone)
        ("COMPLETING\n", "COMPLETING"),  # being requeued: sacct's PREEMPTED is the record of the start that ended
        ("PENDING\n", "PENDING"),
    ],
)
def test_preempted_in_sacct_is_final_only_when_squeue_no_longer_runs_the_job(squeue: str, state: str) -> None:
    def runner(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        out = "12|PREEMPTED\n" if command[0] == "sacct" else squeue
        return subprocess.CompletedProcess(command, 0, stdout=out, stderr="")

    assert Slurm(runner).job_state("12") == state
    assert is_final(state) == (state == "PREEMPTED")
