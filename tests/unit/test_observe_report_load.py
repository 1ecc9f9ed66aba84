"""hpctrain.observe.report.load and .table: reading damaged metrics, attempts, stragglers, the scaling numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from report_helpers import make_study, simulate_run, write_heartbeats

from hpctrain.contract.rundir import metrics_path, run_info_path, summary_path
from hpctrain.errors import RunDirError
from hpctrain.observe.report.load import load_targets, parse_metrics, split_attempts
from hpctrain.observe.report.table import scaling_table


def _step(global_step: int, time: float, **extra: float) -> dict:
    return {"kind": "train_step", "epoch": 0, "step": global_step, "global_step": global_step, "time": time, **extra}


def test_half_written_last_line_is_skipped_silently() -> None:
    text = json.dumps(_step(1, 10.0)) + "\n" + json.dumps(_step(2, 11.0))[:25]
    records, notes = parse_metrics(text)
    assert [r["global_step"] for r in records] == [1]
    assert notes == []


def test_garbage_lines_and_non_finite_numbers_are_dropped_and_noted() -> None:
    lines = [
        json.dumps(_step(1, 10.0, loss=1.0)),
        "not json at all",
        "[1, 2, 3]",
        json.dumps({"kind": "mystery", "time": 3.0}),
        json.dumps({"kind": "train_step", "global_step": 4}),  # no time
        '{"kind": "train_step", "epoch": 0, "step": 2, "global_step": 2, "time": 12.0, "loss": NaN, "lr": Infinity}',
        json.dumps({"kind": "train_step", "global_step": "three", "time": 13.0}),  # which step?
        json.dumps(_step(3, 13.0, step_s="slow", top1=[1])),  # numbers that are not numbers
    ]
    records, notes = parse_metrics("\n".join(lines) + "\n")
    assert [r["global_step"] for r in records] == [1, 2, 3]
    assert records[1]["loss"] is None and records[1]["lr"] is None
    assert records[2]["step_s"] is None and records[2]["top1"] is None
    assert any("skipped 5 unreadable lines" in note for note in notes)
    assert any("4 non-finite values" in note for note in notes)
    assert len(split_attempts(records, expected_restarts=1)) == 1  # tolerates the holes


def test_a_replayed_step_starts_a_new_attempt() -> None:
    records = [_step(1, 1.0), _step(2, 2.0), _step(3, 3.0), _step(2, 100.0), _step(3, 101.0)]
    assert split_attempts(records) == [3]


def test_restarts_without_a_replay_take_the_largest_unexplained_gap() -> None:
    records = [_step(1, 1.0, step_s=1.0), _step(2, 2.0, step_s=1.0), _step(3, 500.0, step_s=1.0), _step(4, 501.0)]
    assert split_attempts(records) == []
    assert split_attempts(records, expected_restarts=1) == [2]


def test_a_requeued_run_keeps_the_last_record_per_step_and_marks_the_restart(tmp_path: Path) -> None:
    simulate_run(tmp_path / "run", restart_at=(1, 10), downtime_s=600.0)
    (run,) = load_targets([tmp_path / "run"])
    steps = [r["global_step"] for r in run.train]
    assert steps == sorted(set(steps)) and steps[-1] == 60
    assert run.restarts == 1
    (end, start) = run.downtimes[0]
    assert start - end == pytest.approx(600.0 + 5 * 0.32)  # the downtime, then the first (slow) window
    replayed = [r for r in run.train if r["epoch"] == 1]
    assert {r["attempt"] for r in replayed} == {1}


def test_stragglers_are_named_from_heartbeats(tmp_path: Path) -> None:
    simulate_run(tmp_path / "run")
    write_heartbeats(tmp_path / "run", [0.30, 0.31, 0.52, 0.29])
    (run,) = load_targets([tmp_path / "run"])
    assert len(run.stragglers) == 1 and run.stragglers[0].startswith("rank 2 on n2")


def test_efficiency_is_computed_from_the_runs_own_throughput(tmp_path: Path) -> None:
    built = make_study(tmp_path / "study", {1: 1.0, 2: 0.9, 4: 0.7}, desired_acc=60.0)
    runs = load_targets([tmp_path / "study"])
    rows = scaling_table(runs)
    assert [r.label for r in rows] == ["nodes-1", "nodes-2", "nodes-4"]
    base = built[1]["ips"] / built[1]["devices"]
    for row, nodes in zip(rows, (1, 2, 4), strict=True):
        assert row.devices == built[nodes]["devices"] and row.device_kind == "GPU"
        assert row.images_per_s == pytest.approx(built[nodes]["ips"])  # the slow first windows left out
        assert row.efficiency == pytest.approx(built[nodes]["ips"] / built[nodes]["devices"] / base)
        assert row.global_batch == built[nodes]["global_batch"]
        # 4 windows per epoch: the first at half speed (2x step_s), three at full speed
        assert row.epoch_s == pytest.approx(built[nodes]["step_s"] * (5 * 2 + 15))
        assert row.best_top1 == pytest.approx(built[nodes]["best"])
        assert row.time_to_target_s is not None and row.time_to_target_s > 0
    assert [round(r.efficiency, 3) for r in rows] == [1.0, 0.9, 0.7]


def test_time_to_target_leaves_out_the_time_between_attempts(tmp_path: Path) -> None:
    simulate_run(tmp_path / "a", desired_acc=60.0)
    simulate_run(tmp_path / "b", desired_acc=60.0, restart_at=(0, 10), downtime_s=3600.0)
    a, b = scaling_table(load_targets([tmp_path / "a", tmp_path / "b"]))
    assert a.time_to_target_s is not None and b.time_to_target_s is not None
    assert b.time_to_target_s - a.time_to_target_s < 60  # the replayed steps, not the hour of downtime
    assert b.restarts == 1


def test_cpu_runs_count_processes(tmp_path: Path) -> None:
    simulate_run(tmp_path / "cpu", nodes=2, gpus_per_node=0, device="cpu")
    (row,) = scaling_table(load_targets([tmp_path / "cpu"]))
    assert row.device_kind == "process" and row.devices == 2


def test_a_sweep_reports_every_trial(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    for index in range(2):
        simulate_run(sweep / f"trial-{index:03d}")
    run_info_path(sweep).write_text(json.dumps({"job_id": "7", "trials": 2}))
    runs = load_targets([sweep])
    assert [run.label.rsplit("/", 1)[1] for run in runs] == ["trial-000", "trial-001"]


def test_a_study_point_without_its_directory_is_noted(tmp_path: Path) -> None:
    make_study(tmp_path / "study", {1: 1.0, 2: 0.9})
    import shutil

    shutil.rmtree(tmp_path / "study" / "nodes-2")
    runs = load_targets([tmp_path / "study"])
    assert runs[1].notes and "does not exist" in runs[1].notes[0]
    rows = scaling_table(runs)
    assert rows[1].images_per_s is None and rows[0].efficiency == 1.0


@pytest.mark.parametrize("kind", ["missing", "file", "empty"])
def test_arguments_that_are_not_runs_raise(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "x"
    if kind == "file":
        target.write_text("hello")
    elif kind == "empty":
        target.mkdir()
    with pytest.raises(RunDirError) as info:
        load_targets([target])
    assert info.value.hint


def test_non_finite_throughput_does_not_reach_the_table(tmp_path: Path) -> None:
    simulate_run(tmp_path / "run")
    path = metrics_path(tmp_path / "run")
    lines = path.read_text().splitlines()
    bad = json.loads(lines[1])
    lines[1] = json.dumps({**bad, "images_per_s": math.inf})
    path.write_text("\n".join(lines) + "\n")
    (row,) = scaling_table(load_targets([tmp_path / "run"]))
    assert row.images_per_s is not None and math.isfinite(row.images_per_s)


def test_a_study_point_that_is_a_sweep_gives_a_row_per_trial(tmp_path: Path) -> None:
    make_study(tmp_path / "study", {1: 1.0})
    point = tmp_path / "study" / "nodes-1"
    for index in range(2):
        simulate_run(point / f"trial-{index:03d}")
    runs = load_targets([tmp_path / "study"])
    assert [run.label for run in runs] == ["nodes-1/trial-000", "nodes-1/trial-001"]
    assert all(run.point and run.point["label"] == "nodes-1" for run in runs)


def test_a_run_with_only_a_summary_reports_the_summary_numbers(tmp_path: Path) -> None:
    summary_path(tmp_path).write_text(
        json.dumps({"status": "running", "train_images_per_s": 123.0, "world_size": 2, "best_val_top1": float("nan")})
    )
    (run,) = load_targets([tmp_path])
    assert not run.has_metrics and "no metrics.jsonl" in run.notes[0]
    (row,) = scaling_table([run])
    assert row.images_per_s == 123.0 and row.source == "summary.json train_images_per_s"
    assert row.best_top1 is None and row.devices == 2 and row.device_kind == "process"


def test_a_job_id_names_its_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpctrain.contract import job_registry

    simulate_run(tmp_path / "run")
    monkeypatch.setattr(job_registry, "entries", lambda: [{"job_id": "4711", "run_dir": str(tmp_path / "run")}])
    (run,) = load_targets([Path("4711")])
    assert run.path == tmp_path / "run" and run.has_metrics
    with pytest.raises(RunDirError, match="not submitted by hpctrain"):
        load_targets([Path("4712")])


def test_a_run_without_metrics_says_whether_it_ended_and_what_would_add_curves(tmp_path: Path) -> None:
    from hpctrain.contract.rundir import summary_path
    from hpctrain.observe.report.load import load_run

    summary_path(tmp_path).write_text(json.dumps({"status": "completed", "script": "/x/train.py"}))
    assert load_run(tmp_path, "plain").notes == [
        "no metrics.jsonl: the run ended without logging a training step; a script adds curves with "
        "hpctrain.task.log(step, loss=...) (docs/your-own-loop.md)"
    ]
    summary_path(tmp_path).write_text(json.dumps({"status": "running"}))
    assert load_run(tmp_path, "trainer").notes == ["no metrics.jsonl yet: the run has not logged a training step"]


def test_a_run_shows_the_estimate_submit_gave_against_its_real_finish(tmp_path: Path) -> None:
    from hpctrain.contract.estimates import record_estimate
    from hpctrain.planning.forecast import _parse

    run_dir = tmp_path / "run"
    simulate_run(run_dir)
    summary = json.loads(summary_path(run_dir).read_text())
    started, finished = _parse(summary["started_at"]), _parse(summary["updated_at"])
    assert started is not None and finished is not None
    record_estimate(run_dir, {"made_at": started - 100, "start_at": started, "finish_at": finished + 50})
    [run] = load_targets([run_dir])
    assert run.predicted.startswith("start: predicted") and "late over the" in run.predicted
    [plain] = load_targets([_copy_without_estimates(run_dir, tmp_path / "plain")])
    assert plain.predicted == ""


def _copy_without_estimates(run_dir: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(run_dir, to, ignore=shutil.ignore_patterns("estimates.json"))
    return to
