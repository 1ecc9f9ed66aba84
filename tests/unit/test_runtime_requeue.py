"""Requeue decisions, array-aware job ids, and the exit protocol after a stop."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hpctrain.contract.cancel_marker import cancel_marker_paths, write_cancel_marker
from hpctrain.contract.slurm import requeue_command
from hpctrain.contract.slurm_answers import parse_job_record
from hpctrain.errors import ClusterError
from hpctrain.jobspec.models import Signals
from hpctrain.runtime.context import TaskEnv
from hpctrain.runtime.requeue import (
    completed_by,
    decide_after_stop,
    finish_after_stop,
    job_phase,
    keep_ended,
    rank_zero_action,
    requeue_job,
    show_job,
    slurm_stop_reason,
)
from hpctrain.runtime.stop import StopRequest
from hpctrain.runtime.task_env import derive_task_env

ENV = TaskEnv(
    global_rank=0,
    world_size=4,
    local_rank=0,
    local_world_size=2,
    node_rank=0,
    num_nodes=2,
    hostnames=("n1", "n2"),
    master_addr="n1",
    master_port=20001,
    job_id="1234",
    restart_count=0,
    source="slurm",
)
SLURM_BASE = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
SLURM_BASE |= {"SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1", "SLURM_TASKS_PER_NODE": "1"}
SLURM = derive_task_env({**SLURM_BASE, "SLURM_JOB_ID": "1234"})
ARRAY_TASK = derive_task_env(
    {**SLURM_BASE, "SLURM_JOB_ID": "1240", "SLURM_ARRAY_JOB_ID": "1234", "SLURM_ARRAY_TASK_ID": "6"}
)


class Exited(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


def fake_exit(code: int) -> None:
    raise Exited(code)


RUNNING = "JobId=1234 JobName=x JobState=RUNNING Reason=None Requeue=1 Restarts=0 PreemptTime=None SuspendTime=None"
PREEMPTING = RUNNING.replace("PreemptTime=None", "PreemptTime=2026-11-22T09:57:49")
CANCELLING = RUNNING.replace("JobState=RUNNING", "JobState=COMPLETING")
REQUEUED = CANCELLING.replace("Restarts=0", "Restarts=1")


class FakeRun:
    """Stands in for subprocess.run: answers ``scontrol show job`` with ``show``,
    ``scontrol --version`` with ``version``, and ``scontrol requeue`` from
    ``answers``: (returncode, output) pairs or exceptions."""

    def __init__(self, *answers: Any, show: str | BaseException = RUNNING, version: str = "slurm-wlm 22.05.8") -> None:
        self.answers = list(answers)
        self.show = show
        self.version = version
        self.calls: list[list[str]] = []

    def __call__(self, command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(command)
        if "--version" in command:
            return subprocess.CompletedProcess(command, 0, stdout=self.version + "\n", stderr="")
        if "show" in command:
            if isinstance(self.show, BaseException):
                raise self.show
            return subprocess.CompletedProcess(command, 0, stdout=self.show + "\n", stderr="")
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        code, output = answer
        return subprocess.CompletedProcess(command, code, stdout="", stderr=output)

    @property
    def requeues(self) -> list[list[str]]:
        return [c for c in self.calls if "requeue" in c]


# --- job ids -----------------------------------------------------------------


def test_plain_job_id() -> None:
    assert SLURM.slurm_job_id == "1234"
    assert requeue_command(SLURM.slurm_job_id) == ["scontrol", "requeue", "1234"]


def test_array_task_uses_array_and_task_id() -> None:
    # Each array task has its own SLURM_JOB_ID, but the last task's equals the
    # array's id, which names the whole array: always say ARRAY_TASK.
    assert requeue_command(ARRAY_TASK.slurm_job_id) == ["scontrol", "requeue", "1234_6"]
    last = {**SLURM_BASE, "SLURM_JOB_ID": "1234", "SLURM_ARRAY_JOB_ID": "1234", "SLURM_ARRAY_TASK_ID": "9"}
    assert derive_task_env(last).slurm_job_id == "1234_9"


def test_no_slurm_no_job_id() -> None:
    assert replace(ENV, source="single").slurm_job_id == ""
    with pytest.raises(ClusterError, match="not running in a Slurm job"):
        requeue_job("", run=FakeRun())


def test_job_ids_lists_every_alias() -> None:
    assert SLURM.job_aliases == ("1234",)
    assert ARRAY_TASK.job_aliases == ("1240", "1234", "1234_6")
    assert derive_task_env({}).job_aliases == ()


# --- looking at the job ----------------------------------------------------------


def test_parse_job_record() -> None:
    assert parse_job_record(PREEMPTING) == {
        "JobState": "RUNNING",
        "Restarts": "0",
        "PreemptTime": "2026-11-22T09:57:49",
        "Requeue": "1",
    }
    assert parse_job_record("garbage") == {}


@pytest.mark.parametrize(
    ("record", "restarts", "phase"),
    [
        (RUNNING, 0, "running"),
        (PREEMPTING, 0, "preempting"),
        (CANCELLING, 0, "ended"),  # scancel: COMPLETING, same restart count
        (REQUEUED, 0, "requeued"),  # COMPLETING too, but Restarts went up
        (REQUEUED.replace("COMPLETING", "PENDING"), 0, "requeued"),
        (RUNNING.replace("RUNNING", "TIMEOUT"), 0, "ended"),
        (RUNNING.replace("RUNNING", "CANCELLED"), 0, "ended"),
        (REQUEUED.replace("COMPLETING", "RUNNING"), 1, "running"),  # this is the restarted run
        ("", 0, "unknown"),
    ],
)
def test_job_phase(record: str, restarts: int, phase: str) -> None:
    assert job_phase(parse_job_record(record), restarts) == phase


def test_show_job_never_raises() -> None:
    assert show_job("1234", run=FakeRun(show=FileNotFoundError("scontrol"))) == {}
    assert show_job("1234", run=FakeRun(show=subprocess.TimeoutExpired(["scontrol"], 60))) == {}
    assert show_job("1234", run=FakeRun(show=PREEMPTING))["PreemptTime"] != "None"
    assert show_job("", run=FakeRun()) == {}


# --- requeue_job -----------------------------------------------------------------


def test_requeue_job_success() -> None:
    run = FakeRun((0, ""))
    requeue_job("1234", run=run)
    assert run.calls == [["scontrol", "requeue", "1234"]]


def test_requeue_job_failure_names_slurms_answer() -> None:
    run = FakeRun(*[(1, "slurm_requeue error: Requested operation is presently disabled")] * 3)
    with pytest.raises(ClusterError, match="presently disabled") as info:
        requeue_job("1234", run=run, retry_delay_s=0)
    assert len(run.requeues) == 3
    assert info.value.hint and "--requeue" in info.value.hint


def test_requeue_job_retry_finds_an_earlier_success() -> None:
    run = FakeRun(subprocess.TimeoutExpired(["scontrol"], 60), show=REQUEUED)
    requeue_job("1234", run=run, retry_delay_s=0)
    assert len(run.requeues) == 1


def test_requeue_job_never_revives_a_job_that_ended_meanwhile() -> None:
    run = FakeRun((1, "Socket timed out"), show=CANCELLING)
    with pytest.raises(ClusterError, match="meanwhile the job ended"):
        requeue_job("1234", run=run, retry_delay_s=0)
    assert len(run.requeues) == 1


def test_requeue_job_without_scontrol() -> None:
    with pytest.raises(ClusterError, match="scontrol") as info:
        requeue_job("1234", run=FakeRun(FileNotFoundError("scontrol")))
    assert info.value.hint and "requeue_on_timeout" in info.value.hint


# --- decisions -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "signals", "restarts", "source", "expected"),
    [
        ("timeout", {}, 0, "slurm", "requeue-self"),
        ("timeout", {"requeue_on_timeout": False}, 0, "slurm", "stop"),
        ("timeout", {"max_requeues": 3}, 2, "slurm", "requeue-self"),
        ("timeout", {"max_requeues": 3}, 3, "slurm", "stop"),
        ("timeout", {"max_requeues": 0}, 0, "slurm", "stop"),
        ("preempted", {}, 0, "slurm", "slurm-requeues"),
        ("preempted", {"requeue_on_preemption": False}, 0, "slurm", "stop"),
        ("preempted", {"max_requeues": 1}, 1, "slurm", "stop"),
        ("preempted", {"requeue_on_timeout": False}, 0, "slurm", "slurm-requeues"),
        ("cancelled", {}, 0, "slurm", "stop"),
        ("timeout", {}, 0, "slurm-torchrun", "requeue-self"),
        ("preempted", {}, 0, "slurm-torchrun", "slurm-requeues"),
        ("timeout", {"max_requeues": 1}, 1, "slurm-torchrun", "stop"),
        ("timeout", {}, 0, "submitit-local", "stop"),
        ("preempted", {}, 0, "torchrun", "stop"),
        ("timeout", {}, 0, "single", "stop"),
    ],
)
def test_decision_table(reason: Any, signals: dict[str, Any], restarts: int, source: Any, expected: str) -> None:
    env = replace(ENV, source=source)
    assert decide_after_stop(reason, env, Signals(**signals), restarts) == expected


def test_restarts_default_to_the_task_restart_count() -> None:
    signals = Signals(max_requeues=2)
    assert decide_after_stop("timeout", replace(ENV, restart_count=1), signals) == "requeue-self"
    assert decide_after_stop("timeout", replace(ENV, restart_count=2), signals) == "stop"


# --- what rank 0 does -----------------------------------------------------------


@pytest.mark.parametrize(
    ("decision", "phase", "cancel", "action"),
    [
        ("requeue-self", "running", False, "requeue"),
        ("requeue-self", "preempting", False, "requeue"),
        ("requeue-self", "unknown", False, "requeue"),
        ("requeue-self", "ended", False, "finish"),  # scancel or time limit got there first: never revive
        ("requeue-self", "requeued", False, "exit"),
        ("requeue-self", "running", True, "finish"),
        ("slurm-requeues", "preempting", False, "requeue"),  # sooner than GraceTime
        ("slurm-requeues", "running", False, "finish"),  # a bare SIGTERM by hand
        ("slurm-requeues", "unknown", False, "wait"),  # Slurm will requeue it
        ("slurm-requeues", "requeued", False, "exit"),  # GraceTime=0: Slurm already did
        ("slurm-requeues", "ended", False, "finish"),  # plain scancel
        ("slurm-requeues", "preempting", True, "finish"),
        ("stop", "running", False, "finish"),
    ],
)
def test_rank_zero_action(decision: Any, phase: Any, cancel: bool, action: str) -> None:
    assert rank_zero_action(decision, phase, cancel) == action
    assert rank_zero_action(decision, phase, cancel, (23, 11)) == action  # before 24.05: the same


@pytest.mark.parametrize(
    ("decision", "phase", "cancel", "action"),
    [
        ("slurm-requeues", "preempting", False, "exit"),  # Slurm requeues a job that ends in its grace time
        ("requeue-self", "preempting", False, "exit"),
        ("slurm-requeues", "preempting", True, "finish"),
        ("requeue-self", "running", False, "requeue"),
        ("slurm-requeues", "running", False, "finish"),
        ("slurm-requeues", "unknown", False, "wait"),
    ],
)
def test_rank_zero_action_from_slurm_24_05(decision: Any, phase: Any, cancel: bool, action: str) -> None:
    assert rank_zero_action(decision, phase, cancel, (24, 5)) == action
    assert rank_zero_action(decision, phase, cancel, (26, 5)) == action


# --- finish_after_stop -------------------------------------------------------------


def finish(reason: Any, env: TaskEnv = ENV, signals: Signals | None = None, **kwargs: Any) -> Any:
    kwargs.setdefault("stop", StopRequest())
    kwargs.setdefault("agree", lambda outcome: outcome)
    kwargs.setdefault("exit_process", fake_exit)
    return finish_after_stop(reason, env, signals or Signals(), **kwargs)


def test_stop_returns_so_the_launcher_returns_the_result() -> None:
    run = FakeRun()
    assert finish("cancelled", run=run) == "stop"
    assert finish("timeout", signals=Signals(requeue_on_timeout=False), run=run) == "stop"
    assert finish("preempted", signals=Signals(requeue_on_preemption=False), run=run) == "stop"
    assert run.calls == []


def test_timeout_rank_zero_requeues_then_exits_zero_without_returning() -> None:
    run = FakeRun((0, ""))
    with pytest.raises(Exited) as info:
        finish("timeout", run=run)
    assert info.value.code == 0
    assert run.requeues == [["scontrol", "requeue", "1234"]]
    assert run.calls[0] == ["scontrol", "--oneliner", "show", "job", "1234"]


def test_timeout_array_task_requeues_only_itself() -> None:
    run = FakeRun((0, ""))
    with pytest.raises(Exited):
        finish("timeout", env=replace(ENV, job_id="1234_6"), run=run)
    assert run.requeues == [["scontrol", "requeue", "1234_6"]]


def test_other_ranks_do_not_call_scontrol_and_exit_once_rank_zero_requeued() -> None:
    run = FakeRun()
    sent: list[int] = []
    with pytest.raises(Exited) as info:
        finish("timeout", env=replace(ENV, global_rank=3), run=run, agree=lambda o: sent.append(o) or 0)
    assert info.value.code == 0 and run.calls == [] and sent == [0]


def test_other_ranks_follow_rank_zero() -> None:
    other = replace(ENV, global_rank=1)
    assert finish("timeout", env=other, run=FakeRun(), agree=lambda o: 2) == "stop"
    with pytest.raises(ClusterError, match="rank 0"):
        finish("timeout", env=other, run=FakeRun(), agree=lambda o: 3)


def test_failed_requeue_fails_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hpctrain.runtime.requeue.REQUEUE_RETRY_DELAY_S", 0.0)
    run = FakeRun(*[(1, "Access/permission denied")] * 3)
    with pytest.raises(ClusterError, match="permission denied"):
        finish("timeout", run=run)


def test_timeout_after_scancel_finishes_instead_of_reviving_the_job() -> None:
    run = FakeRun(show=CANCELLING)
    assert finish("timeout", run=run) == "stop"
    assert run.requeues == []


def test_cancel_marker_wins_over_requeue(tmp_path: Path) -> None:
    write_cancel_marker(tmp_path, ["1234"])
    stop = StopRequest(cancel_markers=cancel_marker_paths(tmp_path), job_ids=["1234"])
    run = FakeRun()
    assert finish("timeout", stop=stop, run=run) == "stop"
    assert run.calls == []


def test_rank_zero_exits_even_if_the_outcome_cannot_be_shared() -> None:
    def broken(outcome: int) -> int:
        raise RuntimeError("process group is gone")

    with pytest.raises(Exited):
        finish("timeout", run=FakeRun((0, "")), agree=broken)


def test_preemption_is_requeued_at_once_by_rank_zero() -> None:
    run = FakeRun((0, ""), show=PREEMPTING)
    with pytest.raises(Exited) as info:
        finish("preempted", run=run)
    assert info.value.code == 0 and run.requeues == [["scontrol", "requeue", "1234"]]


@pytest.mark.parametrize("version", ["slurm 24.11.5", "slurm-wlm 26.05.5"])
def test_preemption_from_slurm_24_05_is_left_to_slurm(version: str) -> None:
    # A job that ends in its grace time is requeued by Slurm itself; our own requeue
    # would leave Slurm's preemption flag set and requeue the next run once more.
    run = FakeRun(show=PREEMPTING, version=version)
    with pytest.raises(Exited) as info:
        finish("preempted", run=run)
    assert info.value.code == 0 and run.requeues == []


def test_preemption_already_requeued_by_slurm_just_exits() -> None:
    run = FakeRun(show=REQUEUED)
    with pytest.raises(Exited):
        finish("preempted", run=run)
    assert run.requeues == []


def test_bare_sigterm_finishes() -> None:
    run = FakeRun(show=RUNNING)
    assert finish("preempted", run=run) == "stop"
    assert run.requeues == []


def test_preemption_waits_for_slurm_when_rank_zero_cannot_look() -> None:
    stop = StopRequest()
    stop.note_term()  # the preemption's SIGTERM that made the trainer stop
    later = threading.Timer(0.3, stop.note_term)  # Slurm ends the job when GraceTime is over
    start = time.monotonic()
    later.start()
    with pytest.raises(Exited) as info:
        finish("preempted", stop=stop, run=FakeRun(show=OSError("no scontrol")), poll_s=0.02)
    assert info.value.code == 0
    assert 0.25 <= time.monotonic() - start < 5


def test_preemption_waits_when_its_requeue_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hpctrain.runtime.requeue.REQUEUE_RETRY_DELAY_S", 0.0)
    stop = StopRequest()
    start = time.monotonic()
    with pytest.raises(Exited):
        finish("preempted", stop=stop, run=FakeRun(*[(1, "busy")] * 3, show=PREEMPTING), max_wait_s=0.2, poll_s=0.02)
    assert time.monotonic() - start < 10


def test_wait_is_bounded_when_asked() -> None:
    stop = StopRequest()
    stop.note_term()
    start = time.monotonic()
    with pytest.raises(Exited):
        finish("preempted", stop=stop, run=FakeRun(show=OSError("x")), max_wait_s=0.2, poll_s=0.02)
    assert time.monotonic() - start < 2


# --- the first seconds and the end of a start ----------------------------------


@pytest.mark.parametrize(
    ("show", "reason"),
    [
        (RUNNING, None),
        (PREEMPTING, "preempted"),  # preempted before the tasks could hear it: only steps get the signal
        (CANCELLING, "preempted"),  # Slurm is ending it already: finish_after_stop sees how
        (REQUEUED, "preempted"),
        (OSError("controller down"), None),  # no answer is never a reason to stop
    ],
)
def test_slurm_stop_reason_before_training(show: Any, reason: str | None) -> None:
    run = FakeRun(show=show)
    assert slurm_stop_reason(ENV, run=run) == reason
    assert run.calls == [["scontrol", "--oneliner", "show", "job", "1234"]]


def test_ended_tasks_take_the_jobs_requeue_flag_away_once_on_rank_zero(caplog: pytest.LogCaptureFixture) -> None:
    run = FakeRun((0, ""))
    keep_ended(ARRAY_TASK, run=run)
    assert run.calls == [["scontrol", "update", "JobId=1234_6", "Requeue=0"]]
    for env in (replace(ENV, global_rank=1), replace(ENV, source="submitit-local")):
        idle = FakeRun()
        keep_ended(env, run=idle)
        assert idle.calls == []
    keep_ended(ENV, run=FakeRun((1, "scontrol: error: Access/permission denied")))  # warns, never raises
    assert "could not keep Slurm from starting the ended job again" in caplog.text


@pytest.mark.parametrize(
    ("summary", "completed"),
    [
        ({"status": "completed", "job_id": "1234", "global_step": 18}, True),
        ({"status": "completed", "job_id": "1234_6", "global_step": 18}, True),  # an array task names itself
        ({"status": "completed", "job_id": "999"}, False),  # another job: 'hpctrain resume' of the run
        ({"status": "stopped", "job_id": "1234"}, False),
        ({"status": "completed"}, False),
        (None, False),
    ],
)
def test_a_run_completed_by_this_job(tmp_path: Path, summary: dict[str, Any] | None, completed: bool) -> None:
    if summary is not None:
        (tmp_path / "summary.json").write_text(json.dumps(summary))
    found = completed_by(tmp_path, ARRAY_TASK.job_aliases)
    assert (found is not None) == completed
    if completed:
        assert found.global_step == summary.get("global_step")
