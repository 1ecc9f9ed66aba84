"""Where a plan's restart cost comes from: the spec's earlier runs' recorded starts, else the 120 s assumed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.contract.starts import record_first_step, record_start
from hpctrain.planning.history import History
from hpctrain.planning.plan import plan
from hpctrain.planning.restart_cost import restart_cost
from tests.fake_slurm import FakeSlurm
from tests.unit.cli_helpers import in_process
from tests.unit.test_planning_plan import NOW, PARTITIONS, at, earlier_run, write_spec

pytestmark = pytest.mark.usefixtures("isolated")


def starts(run_dir: Path, *costs: float, step_before: int = 0) -> None:
    """One start line and its first step per cost (each later start resumed where the run was)."""
    for number, cost in enumerate(costs):
        record_start(run_dir, began=10_000.0 * (number + 1), job_id="5", step_before=step_before if number else None)
        record_first_step(run_dir, done=10_000.0 * (number + 1) + cost, global_step=step_before + 1, job_id="5")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    slurm = FakeSlurm(answers={"scontrol --oneliner show partition": (0, PARTITIONS)}).install(monkeypatch)
    slurm.test_only_answers = {1: at(10), 2: at(180, "n[1-2]")}
    return slurm


def test_restarts_win_over_first_starts_and_either_over_the_assumption() -> None:
    assert restart_cost(History()).basis == "assumed" and restart_cost(History()).seconds == 120
    firsts = History(first_start_costs=[30.0, 50.0, 40.0], started_runs=3)
    assert (restart_cost(firsts).seconds, restart_cost(firsts).basis) == (40.0, "first starts")
    both = History(restart_costs=[70.0, 90.0], first_start_costs=[30.0], started_runs=2)
    cost = restart_cost(both)
    assert (cost.seconds, cost.basis, cost.starts, cost.runs, cost.measured) == (80.0, "restarts", 2, 2, True)
    assert cost.source == "measured: median of 2 restarts of 2 earlier run(s)"
    assert restart_cost(both, 15.0).basis == "yours" and restart_cost(both, 15.0).seconds == 15.0


def test_the_plan_charges_each_chunk_the_measured_restart_and_says_so(tmp_path: Path, fake: FakeSlurm) -> None:
    spec = write_spec(tmp_path)
    run = earlier_run(spec, 1, 0.5)
    starts(run, 20.0, 60.0, 80.0)  # a first start, then two restarts: their median is 70 s
    made = plan(spec, nodes=(1,), clock=lambda: NOW)
    (one,) = made.shapes
    assert made.restart_s == 70.0 and made.restart is not None and made.restart.basis == "restarts"
    assert one.timeline is not None and one.timeline.finish_in_s == pytest.approx(600 + 70 + 100)
    assert any("70 s starting before it trains: measured: median of 2 restarts" in note for note in made.notes)
    data = made.as_json()
    assert data["restart_s"] == 70.0 and data["restart"]["basis"] == "restarts" and data["restart"]["starts"] == 2


def test_without_restarts_the_first_starts_are_used_and_redone_steps_count(tmp_path: Path, fake: FakeSlurm) -> None:
    spec = write_spec(tmp_path)
    starts(earlier_run(spec, 1, 0.5), 30.0)
    assert plan(spec, nodes=(1,), clock=lambda: NOW).restart.seconds == 30.0  # type: ignore[union-attr]
    # a restart that had to train 4 steps again (its run was at step 10, its checkpoint at 6): 4 x 0.5 s more
    again = earlier_run(spec, 2, 0.5)
    record_start(again, began=1000.0, job_id="6", step_before=10)
    record_first_step(again, done=1040.0, global_step=7, job_id="6")
    made = plan(spec, nodes=(1,), clock=lambda: NOW)
    assert made.restart is not None and (made.restart.basis, made.restart.seconds) == ("restarts", 42.0)


def test_no_recorded_start_is_said_to_be_assumed_and_restart_overrides(tmp_path: Path, fake: FakeSlurm) -> None:
    spec = write_spec(tmp_path)
    starts(earlier_run(spec, 1, 0.5), 30.0, 50.0)
    (tmp_path / "runs" / "planned" / "20261128-000001" / ".hpctrain" / "starts.jsonl").write_text("garbage\n")
    made = plan(spec, nodes=(1,), clock=lambda: NOW)
    assert made.restart is not None and made.restart.basis == "assumed" and made.restart_s == 120
    mine = plan(spec, nodes=(1,), restart_s=5.0, clock=lambda: NOW)
    assert mine.restart is not None and mine.restart.basis == "yours" and mine.restart_s == 5.0


def test_plan_json_carries_where_the_restart_cost_comes_from(
    tmp_path: Path, fake: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path)
    starts(earlier_run(spec, 1, 0.5), 30.0, 50.0)
    done = in_process(capsys, "plan", str(spec), "--nodes", "1", "--json")
    assert done.returncode == 0
    data = json.loads(done.stdout)
    assert data["restart_s"] == 50.0 and data["restart"]["measured"] and data["restart"]["starts"] == 1
    done = in_process(capsys, "plan", str(spec), "--nodes", "1")
    words = " ".join(done.stdout.split())
    assert done.returncode == 0 and "50 s starting before it trains: measured: median of 1 restart of 1" in words
