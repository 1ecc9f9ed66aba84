"""The hang watchdog: what counts as no progress, who reports, what summary.json says. Fake clocks, no sleeps."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from hpctrain.contract.heartbeat_files import Heartbeat
from hpctrain.contract.rundir import hang_claim_path, heartbeat_path, stack_dump_path, stacks_dir, write_json_atomic
from hpctrain.contract.srun_report import TaskFailure
from hpctrain.contract.summary import read_summary, write_summary
from hpctrain.jobspec.models import Distributed
from hpctrain.runtime import failures, hang
from hpctrain.runtime.hang import (
    HANG_EXIT_CODE,
    HangWatchdog,
    ProgressWatch,
    grace_s,
    hang_report,
    note_worker_stacks,
    record_hang,
)
from hpctrain.runtime.heartbeat import Recorder


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def armed(clock: Clock, phase: str = "allreduce", step: int = 5) -> Recorder:
    rec = Recorder(clock)
    rec.step(step)
    rec.set_phase(phase)
    return rec


# ---------------------------------------------------------------- what "no progress" means


def test_no_progress_for_the_limit_is_a_hang() -> None:
    clock = Clock()
    rec, watch = armed(clock), ProgressWatch(limit_s=60)
    assert not watch.hung(rec, 1000.0)
    assert not watch.hung(rec, 1059.0)
    assert watch.hung(rec, 1060.0)


def test_any_step_phase_change_or_beat_restarts_the_clock() -> None:
    clock = Clock()
    rec, watch = armed(clock), ProgressWatch(limit_s=60)
    watch.hung(rec, 1000.0)
    rec.set_phase("optimizer")
    assert not watch.hung(rec, 1050.0)
    assert not watch.hung(rec, 1100.0)  # 50 s since the phase change
    rec.beat()
    assert not watch.hung(rec, 1150.0)
    rec.step(6)
    assert not watch.hung(rec, 1200.0)
    assert watch.hung(rec, 1260.0)


def test_the_watchdog_waits_for_the_first_step() -> None:
    rec, watch = Recorder(Clock()), ProgressWatch(limit_s=60)
    rec.set_phase("forward_backward")  # e.g. the first step compiling for minutes
    watch.hung(rec, 1000.0)
    assert watch.stalled_s(rec, 5000.0) is None and not watch.hung(rec, 5000.0)


@pytest.mark.parametrize("paused", ["checkpoint", "done"])
def test_paused_phases_never_count(paused: str) -> None:
    clock = Clock()
    rec, watch = armed(clock, phase=paused), ProgressWatch(limit_s=60)
    watch.hung(rec, 1000.0)
    assert not watch.hung(rec, 9000.0)
    rec.set_phase("data")  # back to training: the clock starts now, not at the start of the pause
    assert not watch.hung(rec, 9000.0)
    assert not watch.hung(rec, 9059.0)
    assert watch.hung(rec, 9060.0)


def test_the_grace_period_grows_with_the_step_time_within_bounds() -> None:
    assert grace_s([]) == 5.0
    assert grace_s([1.0, 2.0, 3.0]) == 9.0
    assert grace_s([100.0]) == 60.0


# ---------------------------------------------------------------- who stopped first


def beat(rank: int, node: str, step: int, phase: str, since: float, job: str = "9") -> Heartbeat:
    return Heartbeat(rank=rank, node=node, job_id=job, step=step, phase=phase, phase_since=since, last_progress=since)


def test_the_report_names_the_rank_that_stopped_first(tmp_path: Path) -> None:
    beats = [
        beat(0, "n1", 12, "allreduce", 1000.2),
        beat(1, "n1", 12, "allreduce", 1000.3),
        beat(2, "n2", 12, "forward_backward", 1000.0),
        beat(3, "n2", 12, "allreduce", 1000.25),
        beat(4, "n3", 3, "data", 10.0, job="8"),  # an earlier job's file in the same run dir
    ]
    fields = hang_report(beats, "9", now=1060.0, run_dir=tmp_path)
    assert fields is not None
    assert (fields["hung_rank"], fields["hung_node"], fields["hung_phase"]) == (2, "n2", "forward_backward")
    assert fields["status"] == "failed" and fields["failed_rank"] == 2
    assert fields["failed_reason"] == (
        "hang: rank 2 on node n2 made no progress in phase forward_backward for 60 s (step 12)"
    )
    assert fields["stack_dumps"] == str(stacks_dir(tmp_path))


def test_a_rank_behind_by_a_step_is_the_culprit_whatever_its_phase_time(tmp_path: Path) -> None:
    beats = [beat(0, "n1", 8, "allreduce", 1000.0), beat(1, "n1", 7, "data", 1005.0)]
    assert hang_report(beats, "9", now=1100.0, run_dir=tmp_path)["hung_rank"] == 1  # type: ignore[index]


def test_in_a_hung_validation_the_rank_without_batches_is_named_not_the_first_to_enter(tmp_path: Path) -> None:
    """Every rank is in validation at the same step; rank 1 entered first but its batches went on (it waits
    in the final all-reduce), rank 2 entered later and never had a batch."""
    beats = [
        Heartbeat(rank=0, node="n1", job_id="9", step=2, phase="validation", phase_since=1000.3, last_progress=1003.0),
        Heartbeat(rank=1, node="n1", job_id="9", step=2, phase="validation", phase_since=1000.0, last_progress=1002.0),
        Heartbeat(rank=2, node="n2", job_id="9", step=2, phase="validation", phase_since=1000.5, last_progress=990.0),
        Heartbeat(rank=3, node="n2", job_id="9", step=2, phase="validation", phase_since=1000.4, last_progress=1002.5),
    ]
    fields = hang_report(beats, "9", now=1100.0, run_dir=tmp_path)
    assert fields is not None and fields["hung_rank"] == 2
    assert fields["failed_reason"] == "hang: rank 2 on node n2 made no progress in phase validation for 100 s (step 2)"


def test_no_heartbeats_no_report(tmp_path: Path) -> None:
    assert hang_report([], "9", now=1.0, run_dir=tmp_path) is None


def test_the_hang_is_merged_into_the_summary(tmp_path: Path) -> None:
    write_summary(tmp_path, {"status": "running", "global_step": 12, "job_id": "9"})
    record_hang(tmp_path, {"status": "failed", "hung_rank": 2, "hung_node": "n2", "hung_phase": "data"})
    summary = read_summary(tmp_path)
    assert summary is not None
    assert (summary.status, summary.global_step, summary.hung_rank, summary.hung_phase) == ("failed", 12, 2, "data")


def test_srun_reporting_the_exits_afterwards_keeps_the_hang_report(tmp_path: Path) -> None:
    record_hang(tmp_path, hang_report([beat(2, "n2", 1, "data", 0.0)], "9", now=30.0, run_dir=tmp_path) or {})
    failures.record_failure(tmp_path, TaskFailure(0, "n1", f"Exited with exit code {HANG_EXIT_CODE}"))
    summary = read_summary(tmp_path)
    assert summary is not None and summary.failed_rank == 2 and summary.failed_reason.startswith("hang: rank 2")


# ---------------------------------------------------------------- the watchdog end to end, in one process


class Ended(Exception):
    pass


def watchdog(run_dir: Path, rank: int, node: str, rec: Recorder, clock: Clock, calls: list) -> HangWatchdog:
    def flush(now: float) -> None:
        write_json_atomic(
            heartbeat_path(run_dir, rank), {"rank": rank, "node": node, "job_id": "9", **rec.snapshot(), "time": now}
        )

    def exit(code: int) -> None:
        calls.append(("exit", rank, code))
        raise Ended

    def sleep(seconds: float) -> None:
        calls.append(("sleep", rank, seconds))
        clock.now += seconds

    return HangWatchdog(
        run_dir,
        rank=rank,
        node=node,
        job_id="9",
        limit_s=20,
        recorder=rec,
        flush=flush,
        exit=exit,
        sleep=sleep,
        clock=clock,
        report_wait_s=3.0,
    )


def test_the_first_rank_to_fire_reports_the_culprit_and_every_rank_exits(tmp_path: Path) -> None:
    clock, calls = Clock(1000.0), []
    stuck = armed(clock, phase="forward_backward", step=4)  # rank 2 sleeps before the collective
    clock.now = 1000.5
    waiting = armed(clock, phase="allreduce", step=4)  # rank 0 waits in it
    dog2 = watchdog(tmp_path, 2, "n2", stuck, clock, calls)
    dog0 = watchdog(tmp_path, 0, "n1", waiting, clock, calls)
    dog0.flush(clock.now)  # rank 0's heartbeat thread wrote while it waited

    dog2(1001.0)
    dog0(1001.0)
    assert calls == []  # nothing yet: 20 s without progress are needed

    clock.now = 1021.0
    with pytest.raises(Ended):
        dog2(clock.now)
    assert hang_claim_path(tmp_path, "9").exists()
    summary = read_summary(tmp_path)
    assert summary is not None and (summary.hung_rank, summary.hung_node, summary.hung_phase) == (
        2,
        "n2",
        "forward_backward",
    )
    assert summary.status == "failed"
    stacks = stack_dump_path(tmp_path, 2).read_text()
    assert "no progress in phase forward_backward at step 4" in stacks
    assert "test_the_first_rank_to_fire_reports_the_culprit" in stacks  # faulthandler's dump of this thread
    assert ("sleep", 2, 5.0) in calls and calls[-1] == ("exit", 2, HANG_EXIT_CODE)

    with pytest.raises(Ended):  # rank 0 fires a moment later: it only dumps and leaves
        dog0(clock.now + 1.0)
    assert stack_dump_path(tmp_path, 0).is_file()
    assert calls[-1] == ("exit", 0, HANG_EXIT_CODE)
    assert read_summary(tmp_path).hung_rank == 2  # type: ignore[union-attr]
    assert not dog0(clock.now + 100)  # fires once


def test_a_rank_that_loses_the_claim_waits_boundedly_for_the_report(tmp_path: Path) -> None:
    clock, calls = Clock(), []
    rec = armed(clock)
    hang_claim_path(tmp_path, "9").parent.mkdir(parents=True)
    hang_claim_path(tmp_path, "9").touch()  # another rank claimed, then died before writing
    dog = watchdog(tmp_path, 1, "n1", rec, clock, calls)
    dog(clock.now)
    with pytest.raises(Ended):
        dog(clock.now + 20.0)
    waits = [c for c in calls if c[0] == "sleep"]
    assert 1 <= len(waits) <= 8 and calls[-1] == ("exit", 1, HANG_EXIT_CODE)


# ---------------------------------------------------------------- the spec keys


def test_hang_timeout_auto_is_most_of_the_collective_timeout() -> None:
    assert Distributed().hang_timeout == 240.0
    assert Distributed(timeout_s=60).hang_timeout == 48.0
    assert Distributed(hang_timeout_s=20).hang_timeout == 20.0


@pytest.mark.parametrize("off", [None, 0])
def test_hang_timeout_null_or_zero_turns_the_watchdog_off(off: int | None) -> None:
    assert Distributed(hang_timeout_s=off).hang_timeout is None


def test_hang_timeout_must_be_shorter_than_the_collective_timeout() -> None:
    with pytest.raises(ValidationError) as info:
        Distributed(timeout_s=60, hang_timeout_s=60)
    message = str(info.value)
    assert "distributed.hang_timeout_s (60)" in message and "distributed.timeout_s (60)" in message


@pytest.mark.parametrize("bad", [-1, "soon", 1.5, True])
def test_hang_timeout_rejects_other_values(bad: object) -> None:
    with pytest.raises(ValidationError, match="'auto', or null/0"):
        Distributed(hang_timeout_s=bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------- a rank frozen as a whole process


def written(rank: int, node: str, step: int, phase: str, at: float, interval_s: float | None = 10.0) -> Heartbeat:
    return Heartbeat(
        rank=rank, node=node, job_id="9", step=step, phase=phase, phase_since=at, last_progress=at,
        time=at, interval_s=interval_s,
    )  # fmt: skip


def test_a_frozen_rank_is_named_with_its_last_recorded_phase_and_how_long_it_was_silent(tmp_path: Path) -> None:
    # rank 2 was SIGSTOPped at 1000 in forward_backward of step 5; the others wait in the
    # all-reduce of step 5 and their heartbeat threads go on writing
    beats = [
        written(0, "n1", 5, "allreduce", 1001.0).model_copy(update={"time": 1042.0}),
        written(1, "n1", 5, "allreduce", 1001.0).model_copy(update={"time": 1042.5}),
        written(2, "n2", 5, "forward_backward", 999.0),
        written(3, "n2", 5, "allreduce", 1001.2).model_copy(update={"time": 1041.0}),
    ]
    fields = hang_report(beats, "9", now=1043.0, run_dir=tmp_path)
    assert fields is not None
    assert (fields["hung_rank"], fields["hung_node"], fields["hung_phase"], fields["hung_step"]) == (
        2,
        "n2",
        "forward_backward",
        5,
    )
    assert fields["hung_frozen_s"] == 44.0
    assert "silent for 44 s" in fields["failed_reason"]
    assert "last recorded: phase forward_backward at step 5" in fields["failed_reason"]


def test_a_frozen_rank_is_blamed_before_a_waiting_rank_with_a_lower_step(tmp_path: Path) -> None:
    beats = [
        written(0, "n1", 4, "data", 1040.0),  # behind, but its thread is alive
        written(1, "n2", 5, "optimizer", 1000.0),  # silent for 42 s with a 10 s interval
    ]
    assert hang_report(beats, "9", now=1042.0, run_dir=tmp_path)["hung_rank"] == 1  # type: ignore[index]


def test_silence_within_two_intervals_or_without_a_recorded_interval_is_not_frozen(tmp_path: Path) -> None:
    quiet = [written(0, "n1", 8, "allreduce", 1030.0), written(1, "n1", 7, "data", 1020.0)]  # 25 s: allowed
    fields = hang_report(quiet, "9", now=1045.0, run_dir=tmp_path)
    assert fields is not None and fields["hung_rank"] == 1 and fields["hung_frozen_s"] is None
    old_files = [written(0, "n1", 8, "allreduce", 900.0, None), written(1, "n1", 7, "data", 1040.0, None)]
    fields = hang_report(old_files, "9", now=1045.0, run_dir=tmp_path)
    assert fields is not None and fields["hung_rank"] == 1 and fields["hung_frozen_s"] is None


def test_the_summary_agrees_with_the_frozen_ranks_own_file(tmp_path: Path) -> None:
    """The smoke-job case: a rank stopped soon after its first checkpoint, before its next interval write."""
    from hpctrain.contract.heartbeat_files import read_heartbeats
    from hpctrain.runtime.heartbeat import Monitor

    clock = Clock(1000.0)
    recs = {rank: Recorder(clock) for rank in range(2)}
    mons = {
        rank: Monitor(
            tmp_path,
            {"rank": rank, "node": f"n{rank + 1}", "pid": 1, "job_id": "9"},
            interval_s=10.0,
            recorder=rec,
            clock=clock,
        )  # fmt: skip
        for rank, rec in recs.items()
    }

    def poll() -> None:
        for mon in mons.values():
            mon.tick(clock.now)

    poll()  # both write "setup, step 0"
    for step in range(1, 5):
        for rec in recs.values():
            rec.set_phase("forward_backward")
            rec.step(step, epoch=0)
        clock.now += 0.5
        poll()
    for rec in recs.values():
        rec.set_phase("checkpoint")
    clock.now += 0.5
    poll()
    for rec in recs.values():
        rec.set_phase("forward_backward")
        rec.step(5, epoch=1)
    clock.now += 1.0
    poll()  # rank 1 is stopped right after this poll: its thread never runs again
    del mons[1]
    recs[0].set_phase("allreduce")
    for _ in range(43):
        clock.now += 1.0
        poll()
    fields = hang_report(read_heartbeats(tmp_path), "9", now=clock.now, run_dir=tmp_path)
    own = read_heartbeats(tmp_path)[1]
    assert fields is not None and fields["hung_rank"] == 1
    assert (fields["hung_phase"], fields["hung_step"]) == (own.phase, own.step) == ("forward_backward", 5)
    assert fields["hung_frozen_s"] is not None and fields["hung_frozen_s"] >= 43


def test_the_stack_dump_says_where_the_data_loader_workers_wrote_theirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, calls = Clock(1000.0), []
    rank = armed(clock, phase="validation", step=2)  # waiting for the first batch of a stuck val worker
    monkeypatch.setattr(hang, "ask_workers_for_stacks", lambda: [4242, 4243])
    dog = watchdog(tmp_path, 1, "n1", rank, clock, calls)
    dog(1001.0)
    with pytest.raises(Ended):
        dog(1021.0)
    stacks = stack_dump_path(tmp_path, 1).read_text()
    assert "no progress in phase validation at step 2" in stacks
    assert "data-loader workers (pids 4242, 4243) wrote their stacks to this task's stderr log" in stacks


def test_the_rank_s_dump_names_its_workers_asked_and_those_that_could_not_answer(tmp_path: Path) -> None:
    dump = stack_dump_path(tmp_path, 0)
    dump.parent.mkdir(parents=True)
    dump.write_text("hpctrain: rank 0 ...\n")
    note_worker_stacks(dump, [201], ["202 (comm python, state S (sleeping), waiting in futex_wait_queue)"])
    text = dump.read_text()
    assert "workers (pids 201) wrote their stacks to this task's stderr log" in text
    assert (
        "could not answer (no handler yet): 202 (comm python, state S (sleeping), waiting in futex_wait_queue)" in text
    )
    note_worker_stacks(dump, [], [])
    assert dump.read_text() == text  # nothing to say: nothing written
