"""The program each task runs, built for submitit to pickle (launch/task_programs.py): each trial's own
resolved spec, as plain data."""

from __future__ import annotations

from pathlib import Path

from hpctrain.jobspec.load import load_job
from hpctrain.launch.task_programs import task_launchers

REPO = Path(__file__).resolve().parents[2]


def test_every_trial_runs_its_own_spec_even_a_sweep_of_one(tmp_path: Path) -> None:
    spec = tmp_path / "one.yaml"
    spec.write_text(
        f"name: one\noutput_dir: {tmp_path / 'runs'}\ndata: {{root: {tmp_path / 'data'}}}\n"
        "sweep: {trainer.lr: [0.3]}\n"
    )
    job = load_job(spec)
    (launcher,) = task_launchers(job, [tmp_path / "trial-000"])
    assert launcher.spec_data["trainer"]["lr"] == 0.3
    assert launcher.run_dir == str(tmp_path / "trial-000")
    plain = load_job(REPO / "jobs" / "quickstart.yaml")
    (only,) = task_launchers(plain, [tmp_path / "run"])
    assert only.spec_data == plain.spec.model_dump(mode="json")
