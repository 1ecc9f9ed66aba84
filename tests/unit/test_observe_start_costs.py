"""Each start's cost as ``hpctrain report`` lists it and ``hpctrain status RUN`` shows the last one."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_helpers import simulate_run

from hpctrain.cli.main import main
from hpctrain.contract import rundir
from hpctrain.contract.rundir import create_run_dir, write_run_info
from hpctrain.contract.starts import Start, record_first_step, record_start
from hpctrain.observe.report.load import load_run
from hpctrain.observe.run_status import run_status
from hpctrain.observe.start_costs import MAX_SHOWN, last_start, start_lines, start_text


def test_a_start_in_words() -> None:
    first = Start(1000.0, "5", None, 1031.0, 1, first=True)
    assert start_text(first, 1).endswith(": first step (1) 31 s after it began: cost 31 s")
    assert "(first start, job 5)" in start_text(first, 1)
    again = Start(2000.0, "5", 12, 2045.0, 11)
    assert start_text(again, 2, 0.5).endswith("45 s after it began, 2 step(s) trained again (1 s): cost 46 s")
    assert "2 step(s) trained again (step time unknown): cost 45 s" in start_text(again, 2)
    assert "no first step recorded" in start_text(Start(3000.0, "6"), 3)
    hostile = start_text(Start(1000.0, "\x1b[31m|*x*|", None, 1001.0, 1), 1)
    assert "\x1b" not in hostile and "\\x1b" in hostile


def test_the_report_lists_each_start_with_its_cost(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    simulate_run(run_dir, restart_at=(1, 10))
    record_start(run_dir, began=1000.0, job_id="100", step_before=None)
    record_first_step(run_dir, done=1020.0, global_step=1, job_id="100")
    record_start(run_dir, began=5000.0, job_id="100", step_before=30)
    record_first_step(run_dir, done=5040.0, global_step=21, job_id="100")
    run = load_run(run_dir, "run")
    assert len(run.starts) == 2 and run.starts[0].endswith("cost 20 s")
    assert "start 2 (restart, job 100)" in run.starts[1] and "10 step(s) trained again" in run.starts[1]
    assert main(["report", str(run_dir)]) == 0
    text = (rundir.report_dir(run_dir) / "report.md").read_text()
    assert "start 2 (restart, job 100)" in text and "first step (21) 40 s after it began" in text


def test_a_run_with_many_starts_lists_the_newest(tmp_path: Path) -> None:
    for number in range(MAX_SHOWN + 3):
        record_start(tmp_path, began=1000.0 + 100 * number, job_id=str(number), step_before=number)
    lines = start_lines(tmp_path)
    assert len(lines) == MAX_SHOWN + 1 and lines[0] == "3 earlier start(s) not shown"


def test_status_shows_the_last_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    run_dir = create_run_dir(str(tmp_path / "runs"), "demo")
    write_run_info(run_dir, {"name": "demo", "job_id": "42", "job_ids": ["42"], "backend": "slurm"})
    assert run_status(run_dir, {"42": "RUNNING"})["last_start"] is None
    record_start(run_dir, began=1000.0, job_id="42", step_before=None)
    record_first_step(run_dir, done=1012.0, global_step=1, job_id="42")
    record_start(run_dir, began=2000.0, job_id="42", step_before=4)
    record_first_step(run_dir, done=2030.0, global_step=5, job_id="42")
    shown = run_status(run_dir, {"42": "RUNNING"})["last_start"]
    assert shown.startswith("start 2 (restart, job 42)") and shown.endswith("cost 30 s")
    assert last_start(run_dir) == shown
