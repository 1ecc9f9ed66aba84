"""RUN/.hpctrain/starts.jsonl: when each start began and when its first step was done, read back untrusting."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpctrain.contract.starts import (
    BEGAN_VAR,
    MAX_LINES,
    Start,
    began_from,
    median_cost,
    process_began,
    read_starts,
    record_first_step,
    record_start,
    starts_path,
    step_reached,
)


def test_two_starts_read_back_with_their_costs(tmp_path: Path) -> None:
    record_start(tmp_path, began=1000.0, job_id="7", step_before=None)
    record_first_step(tmp_path, done=1030.5, global_step=1, job_id="7")
    record_start(tmp_path, began=2000.0, job_id="7", step_before=12)  # the requeue: the run had done 12 steps
    record_first_step(tmp_path, done=2045.0, global_step=11, job_id="7")  # resumed from step 10's checkpoint
    first, again = read_starts(tmp_path)
    assert first.first and not again.first
    assert first.startup_s == pytest.approx(30.5) and first.redone_steps is None
    assert again.startup_s == pytest.approx(45.0) and again.redone_steps == 2
    assert again.cost_s(None) == pytest.approx(45.0)
    assert again.cost_s(0.5) == pytest.approx(46.0)  # the two steps trained again count at the run's step time
    assert median_cost([first, again]) == pytest.approx(37.75)
    assert again.as_json(0.5)["cost_s"] == pytest.approx(46.0)


def test_a_start_that_never_trained_has_no_cost_and_its_successor_keeps_its_own(tmp_path: Path) -> None:
    record_start(tmp_path, began=1000.0, job_id="7", step_before=0)
    record_start(tmp_path, began=1100.0, job_id="8", step_before=0)  # the first failed before its first step
    record_first_step(tmp_path, done=1110.0, global_step=1, job_id="8")
    record_first_step(tmp_path, done=1120.0, global_step=2, job_id="8")  # a second line for one start: ignored
    lost, kept = read_starts(tmp_path)
    assert lost.cost_s() is None and kept.cost_s() == pytest.approx(10.0) and kept.first_step == 1
    assert median_cost([lost]) is None


def test_damaged_or_hostile_lines_are_dropped(tmp_path: Path) -> None:
    path = starts_path(tmp_path)
    path.parent.mkdir()
    path.write_bytes(
        b'{"kind": "start", "began": 1000}\n'
        b"garbage\n"
        b'{"kind": "first_step", "done": NaN, "global_step": 1}\n'
        b'{"kind": "first_step", "done": 1e300, "global_step": 1}\n'
        b'{"kind": "first_step", "done": 1010, "global_step": -3}\n'
        b'{"kind": "start", "began": "yesterday"}\n'
        b'{"kind": "first_step", "done": 1012, "global_step": 4, "job_id": "\\u001b[31m' + b"x" * 200 + b'"}\n'
        b'{"kind": "first_step", "done": 990, "global_step": 1}\n'
    )
    (only,) = read_starts(tmp_path)
    assert only.began == 1000 and only.done == 1012 and only.cost_s() == pytest.approx(12.0)
    # a first step before its start (a clock set back) has no cost rather than a negative one
    assert Start(1000.0, done=990.0, first_step=1).cost_s() is None


def test_only_regular_files_inside_the_run_are_read(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / ".hpctrain").mkdir(parents=True)
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text('{"kind": "start", "began": 1000}\n')
    starts_path(run).symlink_to(outside)
    assert read_starts(run) == []
    starts_path(run).unlink()
    os.mkfifo(starts_path(run))
    assert read_starts(run) == []
    assert read_starts(tmp_path / "missing") == []


def test_a_symlink_under_the_name_is_never_written_through(tmp_path: Path) -> None:
    (tmp_path / ".hpctrain").mkdir()
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    starts_path(tmp_path).symlink_to(victim)
    with pytest.raises(OSError):
        record_start(tmp_path, began=1.0, job_id=None, step_before=None)
    assert victim.read_text() == "mine\n"


def test_a_long_file_is_read_from_its_end_and_its_first_start_is_then_unknown(tmp_path: Path) -> None:
    for number in range(MAX_LINES):
        record_start(tmp_path, began=1000.0 + number, job_id=str(number), step_before=number)
        record_first_step(tmp_path, done=1000.5 + number, global_step=number + 1, job_id=str(number))
    starts = read_starts(tmp_path)
    assert len(starts) == MAX_LINES // 2 and starts[-1].job_id == str(MAX_LINES - 1)
    assert not any(start.first for start in starts)


def test_the_outer_programs_began_is_taken_only_when_plausible() -> None:
    assert began_from({BEGAN_VAR: "990.5"}, 1000.0) == 990.5
    for bad in ("", "soon", "nan", "-1", "2000"):  # later than this program's own first line: not this start's
        assert began_from({BEGAN_VAR: bad}, 1000.0) == 1000.0
    assert began_from({}, 1000.0) == 1000.0


def test_a_start_begins_when_its_process_started(tmp_path: Path) -> None:
    hz = os.sysconf("SC_CLK_TCK")
    (tmp_path / "self").mkdir()
    (tmp_path / "uptime").write_text("5000.50 100.00\n")
    fields = ["S"] + ["0"] * 18 + [str(int(4990.5 * hz))]  # started 10 s ago, by the boot clock
    (tmp_path / "self" / "stat").write_text(f"123 (python (x)) {' '.join(fields)} 0 0\n")
    assert process_began(1000.0, proc=tmp_path) == pytest.approx(990.0)
    (tmp_path / "uptime").write_text("9000 1\n")  # started more than MAX_BEFORE_S ago: not this start's
    assert process_began(1000.0, proc=tmp_path) == 1000.0
    (tmp_path / "self" / "stat").write_text("garbage")
    assert process_began(1000.0, proc=tmp_path) == 1000.0
    assert 0 <= 1000.0 - process_began(1000.0, proc=tmp_path / "missing") < 1


def test_the_step_a_start_finds_is_the_summarys_or_the_last_logged_one(tmp_path: Path) -> None:
    from hpctrain.contract.rundir import metrics_path
    from hpctrain.contract.summary import write_summary

    assert step_reached(tmp_path) is None
    write_summary(tmp_path, {"status": "running", "global_step": 8})
    assert step_reached(tmp_path) == 8
    lines = [{"kind": "train_step", "global_step": step, "time": 1.0} for step in (9, 10, 11)]
    metrics_path(tmp_path).write_text("".join(json.dumps(line) + "\n" for line in lines) + "torn {")
    assert step_reached(tmp_path) == 11  # a killed start logged steps its summary never said
    metrics_path(tmp_path).unlink()
    os.mkfifo(metrics_path(tmp_path))
    assert step_reached(tmp_path) == 8
