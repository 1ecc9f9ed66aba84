"""How a script job's start is recorded (hpctrain/runtime/script_outcome.py): exit records, which failure is
named first, the summary the main task writes."""

from __future__ import annotations

import json
from pathlib import Path

from hpctrain.contract.rundir import script_exit_path
from hpctrain.contract.srun_report import TaskFailure
from hpctrain.contract.summary import read_summary, write_summary
from hpctrain.runtime.script_outcome import (
    FailureWatch,
    ScriptExit,
    ScriptSummary,
    StepReport,
    choose_first,
    failure_fields,
    read_exit,
    record_exit,
    recorded_exits,
)

OWN = ScriptExit(3, 3, "n2", 3, None, "exited with code 3", ["Traceback", "ValueError: bad batch"])
ECHO = ScriptExit(1, 1, "n1", 1, None, "exited with code 1", ["RuntimeError: Connection closed by peer"])


def test_a_record_round_trips_and_a_hostile_one_is_ignored(tmp_path: Path) -> None:
    record_exit(tmp_path, "42.0", OWN)
    assert read_exit(tmp_path, "42.0", 3) == OWN
    assert read_exit(tmp_path, "42.1", 3) is None, "another start's records are not this one's"
    path = script_exit_path(tmp_path, "42.0", 5)
    for hostile in ('{"task": "x"}', "[1, 2]", '{"task": 5, "node": "n1", "reason": "r", "stderr": 7}', "{" * 5000):
        path.write_text(hostile)
        assert read_exit(tmp_path, "42.0", 5) is None
    path.write_text(json.dumps({"task": 5, "node": "n", "reason": "r", "stderr": ["a" * 10_000] * 100}))
    bounded = read_exit(tmp_path, "42.0", 5)
    assert bounded is not None and len(bounded.stderr) == 40 and len(bounded.stderr[0]) == 400
    assert [e.task for e in recorded_exits(tmp_path, "42.0")] == [3, 5]


def test_srun_s_order_names_the_first_failure_but_not_a_peers_echo() -> None:
    reported = [TaskFailure(1, "n1", "Exited with exit code 1"), TaskFailure(3, "n2", "Exited with exit code 1")]
    assert choose_first(reported, {1: ECHO, 3: OWN}, None) == OWN, "rank 1 only echoed rank 3's death"
    assert choose_first(reported[:1], {1: ECHO}, None) == ECHO, "an echo is named when nothing else is"
    assert choose_first(reported, {}, None) == reported[0], "no record yet: srun's own words"
    assert choose_first([], {}, OWN) == OWN
    own = ScriptExit(0, 0, "n1", 2, None, "exited with code 2")
    assert choose_first(reported, {1: ECHO}, own) == reported[1], "reported before our own end, record or not"
    assert choose_first([], {}, None) is None


def test_failure_fields_for_the_summary() -> None:
    fields = failure_fields(OWN)
    assert fields == {
        "failed_rank": 3,
        "failed_node": "n2",
        "failed_reason": "the script exited with code 3",
        "failed_exit_code": 3,
        "failed_stderr": ["Traceback", "ValueError: bad batch"],
        "error": "the script of rank 3 on n2 exited with code 3",
    }
    per_node = failure_fields(ScriptExit(1, None, "n2", None, "SIGKILL", "killed by SIGKILL"))
    assert per_node["failed_signal"] == "SIGKILL" and "failed_rank" not in per_node
    assert per_node["error"] == "the script of node n2 (node task 1) killed by SIGKILL"
    assert failure_fields(TaskFailure(2, "n2", "Killed"))["failed_reason"] == "Killed"


def test_the_summary_keeps_what_a_healing_job_recorded_and_forgets_the_last_failure(tmp_path: Path) -> None:
    write_summary(
        tmp_path,
        {
            "status": "failed",
            "failed_rank": 3,
            "node_failures": [{"node": "n2"}],
            "excluded_nodes": ["n2"],
            "started_at": "2026-01-01T00:00:00+0000",
            "wall_s": 10.0,
        },
    )
    summary = ScriptSummary(tmp_path, {"restarts": 1}, enabled=True)
    summary.write("running")
    written = read_summary(tmp_path)
    assert written is not None
    assert (written.status, written.failed_rank, written.excluded_nodes) == ("running", None, ["n2"])
    assert written.started_at == "2026-01-01T00:00:00+0000" and written.restarts == 1
    assert written.wall_s is not None and written.wall_s >= 10.0
    summary.write("failed", failed_rank=2)
    summary.write("completed")
    after = read_summary(tmp_path)
    assert after is not None and (after.status, after.failed_rank) == ("failed", 2), "a failure is not overwritten"
    ScriptSummary(tmp_path / "other", {}, enabled=False).write("running")
    assert not (tmp_path / "other").exists(), "only the main task writes"


def test_the_watch_names_the_first_failure_from_srun_s_report(tmp_path: Path) -> None:
    log = tmp_path / "0_log.err"
    log.write_text("srun: error: n9: task 7: Killed\n")  # an earlier attempt's line
    report = StepReport(log)
    summary = ScriptSummary(tmp_path, {}, enabled=True)
    watch = FailureWatch(report, tmp_path, "42.0", summary)
    assert report.failures() == []
    record_exit(tmp_path, "42.0", ECHO)
    record_exit(tmp_path, "42.0", OWN)
    with open(log, "a") as handle:
        handle.write("srun: error: n1: task 1: Exited with exit code 1\nsrun: error: n2: task 3: Exit")
    assert [f.rank for f in report.failures()] == [1], "a line still being written is read next time"
    with open(log, "a") as handle:
        handle.write("ed with exit code 1\n")
    assert [f.rank for f in report.failures()] == [1, 3], "each read adds to what earlier reads found"
    assert watch.settle(None, wait_s=1.0) == OWN
    written = read_summary(tmp_path)
    assert written is not None and (written.status, written.failed_rank, written.failed_exit_code) == ("failed", 3, 3)
    assert watch.settle(ECHO, wait_s=0.0) == OWN, "settled once"


def test_the_final_summary_keeps_what_the_script_set_and_decides_only_the_outcome(tmp_path: Path) -> None:
    write_summary(tmp_path, {"status": "stopped", "total_steps": 10, "excluded_nodes": ["n2"], "failed_rank": 1})
    summary = ScriptSummary(tmp_path, {}, enabled=True)
    summary.write("running")  # before the script runs: an earlier attempt's own fields are not this one's
    started = read_summary(tmp_path)
    assert started is not None and (started.total_steps, started.failed_rank, started.excluded_nodes) == (
        None,
        None,
        ["n2"],
    )
    written_by_the_loop = {  # what task.set_summary and the loop's progress wrote meanwhile
        **started.fields(),
        "total_steps": 100,
        "global_step": 100,
        "weights_sha256": "ab" * 32,
        "my_val_accuracy": 0.91,
        "status": "completed",
        "failed_reason": "a stale claim",
    }
    write_summary(tmp_path, written_by_the_loop)
    summary.write("completed", exit_code=0)
    final = read_summary(tmp_path)
    assert final is not None and final.status == "completed" and final.fields()["exit_code"] == 0
    assert (final.total_steps, final.global_step, final.weights_sha256) == (100, 100, "ab" * 32)
    assert final.fields()["my_val_accuracy"] == 0.91 and final.excluded_nodes == ["n2"]
    assert final.failed_reason is None, "how the attempt ended is the wrapper's to say"
