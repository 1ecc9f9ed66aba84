"""hpctrain.contract.slurm: the one runner's failure classes, and the parsers on recorded output."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from hpctrain.contract import slurm
from hpctrain.contract.slurm import (
    SlurmCommandError,
    classify_failure,
    parse_kill_wait_s,
    run_slurm,
    show_job_command,
)
from hpctrain.errors import ClusterError
from hpctrain.launch.sbatch_script import signal_parameter

# The shape of ``scontrol show config`` (Slurm 22.05), trimmed.
CONFIG = """\
Configuration data as of 2026-11-22T10:00:00
InactiveLimit           = 0 sec
KillOnBadExit           = 0
KillWait                = 5 sec
LaunchParameters        = (null)
"""


def answer(code: int = 0, out: str = "", err: str = "", raises: BaseException | None = None) -> Any:
    def runner(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        assert kwargs["timeout"] > 0 and kwargs["check"] is False
        if raises is not None:
            raise raises
        return subprocess.CompletedProcess(command, code, stdout=out, stderr=err)

    return runner


def test_stdout_on_success() -> None:
    assert run_slurm(["squeue"], runner=answer(out="RUNNING\n")) == "RUNNING\n"


@pytest.mark.parametrize(
    ("runner", "kind", "needle"),
    [
        (answer(raises=FileNotFoundError("sacct")), "missing", "not on this machine"),
        (answer(raises=subprocess.TimeoutExpired(["sacct"], 30)), "timeout", "did not answer"),
        (
            answer(1, err="sacct: error: slurm_persist_conn_open_without_init: failed to open persistent "
                   "connection to host:ctl:6819: Connection refused"),
            "unreachable",
            "could not reach the Slurm controller",
        ),
        (
            answer(1, err="squeue: error: Unable to contact slurm controller (connect failure)"),
            "unreachable",
            "could not reach",
        ),
        (
            answer(1, err="scancel: error: Kill job error on job id 99: Invalid job id specified"),
            "unknown-job",
            "does not know",
        ),
        (answer(1, err="scontrol: error: Requested operation is presently disabled"), "refused", "presently disabled"),
        (answer(2), "refused", "no output"),
    ],
)  # fmt: skip
def test_failures_become_cluster_errors_with_a_kind(runner: Any, kind: str, needle: str) -> None:
    with pytest.raises(SlurmCommandError) as info:
        run_slurm(["sacct", "-j", "99"], runner=runner)
    assert isinstance(info.value, ClusterError)
    assert info.value.kind == kind
    assert needle in info.value.message
    assert info.value.hint or kind == "refused"


def test_classify_failure_is_pure() -> None:
    error = classify_failure(["scancel", "7"], 1, "Invalid job id specified")
    assert (error.kind, error.exit_code) == ("unknown-job", 3)
    assert "MinJobAge" in (error.hint or "")


def test_kill_wait_from_scontrol_show_config() -> None:
    assert parse_kill_wait_s(CONFIG) == 5.0
    assert parse_kill_wait_s("garbage") is None


def test_signal_parameter_and_commands() -> None:
    assert signal_parameter("USR1", 300) == "USR1@300"
    assert show_job_command("12_3") == ["scontrol", "--oneliner", "show", "job", "12_3"]


def test_max_array_size_from_scontrol_show_config() -> None:
    from hpctrain.contract.slurm import DEFAULT_MAX_ARRAY_SIZE, max_array_size, parse_max_array_size

    assert parse_max_array_size("KillWait                = 30 sec\nMaxArraySize            = 40001\n") == 40001
    assert parse_max_array_size("KillWait = 30 sec\n") is None

    def answers(command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 0, "MaxArraySize = 77\n", "")

    def unreachable(command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 1, "", "Unable to contact slurm controller")

    assert max_array_size(runner=answers) == 77
    assert max_array_size(runner=unreachable) == DEFAULT_MAX_ARRAY_SIZE


def test_job_state_asks_squeue_only_while_sacct_has_not_caught_up() -> None:
    from hpctrain.contract.slurm import job_state

    asked: list[str] = []

    def fresh_job(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        asked.append(command[0])
        return subprocess.CompletedProcess(command, 0, stdout="" if command[0] == "sacct" else "PENDING\n", stderr="")

    assert job_state("12_3", runner=answer(out="12_3|CANCELLED by 0\n")) == "CANCELLED"
    assert job_state("12", runner=fresh_job) == "PENDING" and asked == ["sacct", "squeue"]
    assert job_state("12", runner=answer(out="")) == "UNKNOWN"  # neither lists it
    assert job_state("12", source="squeue", runner=answer(out="RUNNING\n")) == "RUNNING"
    assert job_state("12", source="squeue", runner=answer(out="")) == "UNKNOWN"
    with pytest.raises(SlurmCommandError) as raised:
        job_state("12", source="squeue", runner=answer(code=1, err="Invalid job id specified"))
    assert raised.value.kind == "unknown-job"


@pytest.mark.parametrize("good", ["48121", "48121_3", "48121+1", " 48121 "])
def test_a_job_id_names_one_job(good: str) -> None:
    assert slurm.checked_job_id(good) == good.strip()


@pytest.mark.parametrize("bad", ["--user=root", "-1", "1,2", "1 2", "", "12_[1-3]", "abc", "1" * 30, None])
def test_anything_else_is_refused_before_a_command_runs(bad: object) -> None:
    calls: list[list[str]] = []

    def runner(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    with pytest.raises(slurm.SlurmCommandError, match="is not a Slurm job id"):
        slurm.checked_job_id(bad)
    for ask in (slurm.show_job, slurm.job_state, slurm.processes_may_run):
        with pytest.raises(slurm.SlurmCommandError):
            ask(bad, runner=runner)  # type: ignore[operator]
    assert slurm.job_states([str(bad)], runner=runner) == {} and calls == []


def test_a_requeued_job_is_released_only_after_the_second_of_its_requeue(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm 22.05 fails a job released within the second of its requeue ("Job credential revoked")."""
    events: list[object] = []
    monkeypatch.setattr(slurm, "run_slurm", lambda command, **kwargs: events.append(command) or "")
    slurm.release_job("42", sleep=events.append)
    assert events == [slurm.RELEASE_AFTER_REQUEUE_S, ["scontrol", "update", "JobId=42", "StartTime=now"]]
    assert slurm.RELEASE_AFTER_REQUEUE_S >= 1.0  # Slurm's credential times are whole seconds
