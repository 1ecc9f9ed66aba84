"""What ``hpctrain submit`` says of a queued run's start and finish, and how report/watch check it afterwards."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from hpctrain.cli.submit_printer import submitted_lines
from hpctrain.contract.estimates import read_estimates
from hpctrain.contract.slurm_answers import JOB_TIMES_FORMAT
from hpctrain.contract.summary import Summary
from hpctrain.jobspec.load import load_job
from hpctrain.launch.submission import SubmittedRun
from hpctrain.launch.submit import Submission, forecast_of
from hpctrain.planning.forecast import compare, forecast
from tests.fake_slurm import FakeSlurm

pytestmark = pytest.mark.usefixtures("isolated")

NOW = datetime(2026, 11, 29, 0, 13, 14).timestamp()
ASK = f"squeue -h -t all -o {JOB_TIMES_FORMAT} -j 77"


def iso(at: float) -> str:
    return datetime.fromtimestamp(at).astimezone().strftime("%Y-%m-%dT%H:%M:%S%z")


def write_spec(folder: Path, time: str = "01:00:00") -> Path:
    spec = folder / "spec.yaml"
    spec.write_text(
        f"name: planned\ncluster: slurm\noutput_dir: {folder / 'runs'}\nresources:\n  nodes: 1\n"
        f"  tasks_per_node: 2\n  time: '{time}'\ntrainer:\n  arch: resnet18\n  epochs: 2\n  batch_size: 32\n"
        f"data:\n  root: {folder / 'data'}\n"
    )
    (folder / "data").mkdir(exist_ok=True)
    return spec


def earlier_run(spec: Path, step_s: float) -> None:
    """A finished run of ``spec`` that logged ``step_s`` per step, 6,400 samples an epoch (100 steps of 64)."""
    job = load_job(spec)
    run_dir = spec.parent / "runs" / "planned" / "20261128-000001"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(json.dumps(job.spec.model_dump(mode="json")))
    summary = {"status": "completed", "num_nodes": 1, "steps_per_epoch": 100, "global_batch_size": 64}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    records = [{"kind": "train_step", "global_step": i, "step_s": step_s, "time": i * step_s} for i in range(1, 11)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def pending_at(seconds: float | None) -> tuple[int, str]:
    start = "N/A" if seconds is None else datetime.fromtimestamp(NOW + seconds).strftime("%Y-%m-%dT%H:%M:%S")
    return 0, f"PENDING|{start}|N/A|1:00:00|1:00:00|0:00\n"


def test_a_queued_run_gets_slurms_start_and_the_finish_after_its_steps(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    earlier_run(spec, step_s=2.0)
    fake = FakeSlurm(answers={ASK: pending_at(600)})
    made = forecast(load_job(spec), "77", fake.client(), clock=lambda: NOW)
    # 2 epochs x 100 steps x 2 s = 400 s, one chunk of an hour, 120 s start-up
    assert (made.steps, made.step_s, made.chunks) == (200, 2.0, 1)
    assert made.start_at == NOW + 600 and made.finish_at == NOW + 600 + 120 + 400
    assert "Slurm's own estimate" in made.basis and not fake.asked("sbatch")
    lines = "\n".join(made.lines())
    assert iso(NOW + 600) in lines and "in 10 min" in lines and "200 steps at 2 s" in lines


def test_an_unplanned_queued_job_asks_test_only_and_says_so(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    earlier_run(spec, step_s=2.0)
    fake = FakeSlurm(answers={ASK: pending_at(None)})
    made = forecast(load_job(spec), "77", fake.client(), clock=lambda: NOW)
    assert len(fake.asked("sbatch")) == 1 and "--test-only" in fake.asked("sbatch")[0]
    assert made.start_at == NOW and "test-only" in made.basis  # the fake answers "now"


def test_a_run_longer_than_its_limit_is_chunks(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, time="00:10:00")
    earlier_run(spec, step_s=6.0)  # 1,200 s of training, 600 - 120 - 120 s a chunk
    fake = FakeSlurm(answers={ASK: (0, "RUNNING|2026-11-29T00:13:14|N/A|10:00|10:00|0:00\n")})
    made = forecast(load_job(spec), "77", fake.client(), clock=lambda: NOW)
    assert made.chunks == 4 and made.start_at == NOW and "queued as long" in made.basis


def test_without_an_earlier_run_the_finish_is_unknown_and_said(tmp_path: Path) -> None:
    fake = FakeSlurm(answers={ASK: pending_at(60)})
    made = forecast(load_job(write_spec(tmp_path)), "77", fake.client(), clock=lambda: NOW)
    assert made.finish_at is None and made.start_at == NOW + 60
    assert "no step time" in made.basis and "steps not known" in made.basis
    assert "expected finish: unknown" in "\n".join(made.lines())


def test_a_resume_plans_only_the_steps_left(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    earlier_run(spec, step_s=2.0)
    fake = FakeSlurm(answers={ASK: pending_at(0)})
    made = forecast(load_job(spec), "77", fake.client(), by="resume", steps_done=150, clock=lambda: NOW)
    assert made.steps == 50 and made.record()["by"] == "resume"


def submitted(tmp_path: Path, backend: str = "slurm") -> SubmittedRun:
    run_dir = tmp_path / "runs" / "planned" / "20261129-001314"
    run_dir.mkdir(parents=True)
    return SubmittedRun(run_dir=run_dir, job_id="77", backend=backend, jobs=[], trial_dirs=[])  # type: ignore[arg-type]


def test_submit_records_the_estimate_and_prints_it(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    earlier_run(spec, step_s=2.0)
    one = submitted(tmp_path)
    made = forecast_of(load_job(spec), one, FakeSlurm(answers={ASK: pending_at(600)}).client())
    assert made is not None
    [kept] = read_estimates(one.run_dir)
    assert (
        kept["finish_at"] == made.finish_at
        and kept["expected_start"] == iso(made.start_at or 0)
        and kept["by"] == "submit"
    )
    shown = Submission(one.run_dir, "77", "slurm", forecast=made)
    lines = submitted_lines(shown)
    assert any(line.startswith("  expected start:") for line in lines)
    assert shown.as_json()["estimate"]["steps"] == 200


def test_an_estimate_never_fails_a_submit(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    one = submitted(tmp_path)
    broken = FakeSlurm(answers={ASK: (1, "slurm_load_jobs error: Socket timed out\n"), "sbatch": (1, "down\n")})
    made = forecast_of(load_job(spec), one, broken.client())
    assert made is not None and made.start_at is None and "not known" in made.basis
    assert forecast_of(load_job(spec), submitted(tmp_path / "l", "local"), broken.client()) is None


def outcome(entries: list[dict[str, Any]], **summary: Any) -> Any:
    return compare(entries, Summary(**summary))


def test_compare_sets_the_first_estimate_against_the_real_end() -> None:
    entries = [{"made_at": NOW, "start_at": NOW + 60, "finish_at": NOW + 1100}, {"made_at": NOW + 5}]
    found = outcome(entries, status="completed", started_at=iso(NOW + 100), updated_at=iso(NOW + 1000))
    assert found.actual_start == NOW + 100 and found.actual_finish == NOW + 1000
    assert found.error == pytest.approx(0.1) and "10% late" in found.line()
    running = outcome(entries, status="running", started_at=iso(NOW + 100), updated_at=iso(NOW + 500))
    assert running.actual_finish is None and running.error is None and "real -" in running.line()
    assert compare([], Summary()) is None and compare([{"made_at": "x"}], Summary()) is None


def test_submit_printer_shows_nothing_without_an_estimate(tmp_path: Path) -> None:
    lines = submitted_lines(Submission(tmp_path, "77", "slurm"))
    assert not any("expected" in line for line in lines)
