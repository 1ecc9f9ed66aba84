"""runtime/run_summary.py: summary.json of a user's loop across attempts, and how the launcher finishes it."""

from __future__ import annotations

import json
from pathlib import Path

from hpctrain.contract.rundir import summary_path
from hpctrain.contract.summary import read_summary, write_summary
from hpctrain.runtime import run_summary
from hpctrain.runtime.run_summary import UserRunSummary, finish_summary


def summary(run: Path) -> dict:
    return json.loads(summary_path(run).read_text())


def test_a_new_attempt_keeps_lost_nodes_start_and_wall_time_and_counts_its_resume(tmp_path: Path) -> None:
    write_summary(
        tmp_path,
        {
            "status": "stopped",
            "restarts": 1,
            "wall_s": 10.0,
            "started_at": "2026-01-01T00:00:00+0000",
            "node_failures": [{"node": "n2", "action": "continue"}],
            "excluded_nodes": ["n2"],
            "failed_rank": 3,  # of the attempt before: not this one's
        },
    )
    attempt = UserRunSummary(tmp_path, {"job_id": "9", "world_size": 2}, restart_count=0)
    attempt.start()
    written = summary(tmp_path)
    assert (written["status"], written["restarts"], written["started_at"]) == ("running", 1, "2026-01-01T00:00:00+0000")
    assert written["node_failures"] == [{"node": "n2", "action": "continue"}] and "failed_rank" not in written
    assert written["wall_s"] >= 10.0
    attempt.resumed(6)
    assert (summary(tmp_path)["restarts"], summary(tmp_path)["global_step"]) == (2, 6)
    attempt.progress(7)  # written at most every PROGRESS_EVERY_S
    assert summary(tmp_path)["global_step"] == 6
    attempt.progress(8, force=True)
    assert summary(tmp_path)["global_step"] == 8


def test_the_launcher_finishes_what_the_loop_left_running(tmp_path: Path) -> None:
    attempt = UserRunSummary(tmp_path, {"job_id": "9"}, restart_count=0)
    attempt.start()
    attempt.progress(5)  # held in memory, not written yet
    finish_summary(tmp_path, "9", {"status": "stopped", "stop_reason": "timeout"})
    assert (summary(tmp_path)["status"], summary(tmp_path)["stop_reason"], summary(tmp_path)["global_step"]) == (
        "stopped",
        "timeout",
        5,
    )
    run_summary._active = None  # another process: only the file
    write_summary(tmp_path, {"status": "running", "job_id": "9"})
    finish_summary(tmp_path, "9", 42)
    assert summary(tmp_path)["status"] == "completed"


def test_what_another_writer_ended_or_another_job_wrote_is_left_alone(tmp_path: Path) -> None:
    run_summary._active = None
    write_summary(tmp_path, {"status": "failed", "job_id": "9", "hung_rank": 1})
    finish_summary(tmp_path, "9", None)
    assert read_summary(tmp_path).status == "failed"
    write_summary(tmp_path, {"status": "running", "job_id": "8"})
    finish_summary(tmp_path, "9", None)
    assert read_summary(tmp_path).status == "running"
    finish_summary(tmp_path / "missing", "9", None)  # never raises
