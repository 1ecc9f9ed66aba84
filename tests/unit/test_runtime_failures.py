"""Naming the task that failed first: srun's report parsed, and what rank 0 writes into summary.json."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from hpctrain.contract.rundir import summary_path
from hpctrain.contract.srun_report import TaskFailure, first_task_failure, parse_task_list
from hpctrain.errors import ClusterError
from hpctrain.runtime.failures import (
    FailureWatch,
    NewLines,
    PollingWatch,
    StepLog,
    first_failure,
    looks_like_peer_failure,
    record_failure,
)
from tests.process_helpers import wait_until

# What srun wrote when rank 3 of a 2 x 2 job was killed with SIGKILL (Slurm 22.05, measured).
KILLED_RANK_3 = """\
srun: error: n2: task 3: Killed
srun: launch/slurm: _step_signal: Terminating StepId=99.0
slurmstepd-n1: error: *** STEP 99.0 ON n1 CANCELLED AT 2026-11-22T10:12:38 ***
srun: error: n2: task 2: Exited with exit code 1
submitit WARNING (2026-11-22 10:12:41,102) - Bypassing signal SIGCONT
hpctrain: rank 0 on node n1 failed: RuntimeError: Connection closed by peer [10.213.7.11]:26512
"""
GLOO_PEER_ERROR = RuntimeError(
    "[third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer [10.213.7.11]:26512"
)


@pytest.mark.parametrize(
    ("text", "ranks"),
    [("3", [3]), ("0-1", [0, 1]), ("0,2-3", [0, 2, 3]), ("5,1", [1, 5]), ("x", []), ("2-x", [])],
)
def test_parse_task_list(text: str, ranks: list[int]) -> None:
    assert parse_task_list(text) == ranks


def test_first_task_failure_is_srun_first_report() -> None:
    assert first_task_failure(KILLED_RANK_3) == TaskFailure(3, "n2", "Killed")


def test_a_line_naming_several_tasks_gives_the_lowest() -> None:
    assert first_task_failure("srun: error: n1: tasks 0-1: Exited with exit code 2\n") == TaskFailure(
        0, "n1", "Exited with exit code 2"
    )


def test_no_failure_without_srun_task_lines() -> None:
    assert first_task_failure("srun: Job step aborted: Waiting up to 7 seconds\nhpctrain: rank 0 failed\n") is None


def test_peer_failures_are_told_from_own_mistakes() -> None:
    assert looks_like_peer_failure(GLOO_PEER_ERROR)
    assert looks_like_peer_failure(RuntimeError("NCCL communicator was aborted on rank 0"))
    assert not looks_like_peer_failure(ValueError("bad learning rate"))
    assert not looks_like_peer_failure(ClusterError("Connection reset by peer"))  # our own, explained error


def test_step_log_reads_only_what_this_attempt_wrote(tmp_path: Path) -> None:
    log = tmp_path / "99_0_log.err"
    log.write_text("srun: error: n1: task 0: Killed\n")  # an earlier attempt of a requeued job
    step_log = StepLog(log)
    assert step_log.wait_for_failure(0.0) is None
    with log.open("a") as handle:
        handle.write(KILLED_RANK_3)
    assert step_log.wait_for_failure(0.0) == TaskFailure(3, "n2", "Killed")


def test_rank0_names_the_dead_peer(tmp_path: Path) -> None:
    log = tmp_path / "99_0_log.err"
    log.write_text("")
    step_log = StepLog(log)
    log.write_text(KILLED_RANK_3)
    assert first_failure(GLOO_PEER_ERROR, 0, "n1", step_log, wait_s=0.0) == TaskFailure(3, "n2", "Killed")


def test_rank0_names_itself_when_no_task_died_before(tmp_path: Path) -> None:
    step_log = StepLog(tmp_path / "missing.err")
    error = ValueError("bad learning rate")
    assert first_failure(error, 0, "n1", step_log) == TaskFailure(0, "n1", "ValueError: bad learning rate")
    assert first_failure(GLOO_PEER_ERROR, 0, "n1", None).rank == 0


def test_record_failure_keeps_the_summary_and_names_the_task(tmp_path: Path) -> None:
    summary_path(tmp_path).write_text(
        json.dumps({"status": "failed", "global_step": 3, "failed_rank": 0, "error": "RuntimeError: x"})
    )
    record_failure(tmp_path, TaskFailure(3, "n2", "Killed"), GLOO_PEER_ERROR)
    summary = json.loads(summary_path(tmp_path).read_text())
    assert summary == {
        "status": "failed",
        "global_step": 3,
        "failed_rank": 3,
        "failed_node": "n2",
        "failed_reason": "Killed",
        "error": "RuntimeError: x",
    }


def test_record_failure_without_a_summary_writes_one(tmp_path: Path) -> None:
    record_failure(tmp_path, TaskFailure(1, "n1", "Segmentation fault"), GLOO_PEER_ERROR)
    summary = json.loads(summary_path(tmp_path).read_text())
    assert (summary["status"], summary["failed_rank"], summary["failed_node"]) == ("failed", 1, "n1")
    assert summary["error"].startswith("RuntimeError: [third_party/gloo")


def test_a_line_still_being_written_is_read_when_complete(tmp_path: Path) -> None:
    log = tmp_path / "99_0_log.err"
    log.write_text("")
    step_log = StepLog(log)
    log.write_text("srun: error: n2: task 3: Kil")
    assert step_log.poll() is None
    log.write_text("srun: error: n2: task 3: Killed\n")
    assert step_log.poll() == TaskFailure(3, "n2", "Killed")


def test_the_watch_records_a_dead_peer_while_the_main_thread_is_stuck(tmp_path: Path) -> None:
    log = tmp_path / "99_0_log.err"
    log.write_text("")
    summary_path(tmp_path).write_text(json.dumps({"status": "running", "global_step": 3}))
    watch = FailureWatch(tmp_path, StepLog(log), poll_s=0.01).start()
    with log.open("a") as handle:
        handle.write(KILLED_RANK_3)
    deadline = time.monotonic() + 10
    while watch.recorded is None and time.monotonic() < deadline:
        time.sleep(0.01)
    summary = json.loads(summary_path(tmp_path).read_text())
    assert (summary["status"], summary["failed_rank"], summary["failed_node"]) == ("failed", 3, "n2")
    assert summary["error"] == "task 3 on n2: Killed" and summary["global_step"] == 3


def test_new_lines_reads_complete_lines_at_most_limit_bytes_at_a_time(tmp_path: Path) -> None:
    log = tmp_path / "99_0_log.err"
    log.write_text("an earlier attempt\n")
    new = NewLines(log, limit=8)
    with log.open("a") as handle:
        handle.write("one\ntwo\nthree\nfou")
    assert [new.read(), new.read(), new.read()] == ["one\ntwo\n", "three\n", ""]
    log.unlink()
    assert new.read() == "", "a log that cannot be read has nothing new"


def test_a_line_longer_than_the_limit_is_passed_over_and_the_next_lines_read(tmp_path: Path) -> None:
    log = tmp_path / "99_0_log.err"
    log.write_text("")
    new = NewLines(log, limit=40)
    with log.open("a") as handle:
        handle.write("a progress bar\r" * 8)  # 120 bytes of one line that has not ended
        handle.flush()
        assert [new.read() for _ in range(4)] == [""] * 4  # 40 bytes a look, however long the line grows
        handle.write("done\nsrun: error: n2: task 3: Killed\n")
    found = "".join(new.read() for _ in range(4))
    assert found == "srun: error: n2: task 3: Killed\n"


def test_a_step_log_reads_a_bounded_piece_per_look(tmp_path: Path) -> None:
    log = tmp_path / "99_0_log.err"
    log.write_text("")
    step = StepLog(log)
    with log.open("a") as handle:
        handle.write("x" * (3 << 20))  # 3 MiB without an end of line, then srun's report
        handle.write("\nsrun: error: n2: task 3: Killed\n")
    looks = [step.poll() for _ in range(6)]
    assert looks[0] is None and looks[-1] == TaskFailure(rank=3, node="n2", reason="Killed"), looks


class Looks(PollingWatch):
    """Looks until it has looked ``until`` times (0: for ever)."""

    def __init__(self, until: int) -> None:
        super().__init__("hpctrain-test-watch", poll_s=0.01)
        self.until, self.looked = until, 0

    def look(self) -> bool:
        self.looked += 1
        return self.looked == self.until


def watching() -> bool:
    return any(thread.name == "hpctrain-test-watch" for thread in threading.enumerate())


def test_a_watch_ends_when_its_look_is_done_or_when_stopped() -> None:
    done = Looks(until=3).start()
    wait_until(lambda: not watching())
    assert done.looked == 3, "no look after the one that found what it watched for"
    stopped = Looks(until=0).start()
    wait_until(lambda: stopped.looked >= 2)
    stopped.stop()
    wait_until(lambda: not watching())
