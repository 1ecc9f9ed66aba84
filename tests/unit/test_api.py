"""The Python API (``import hpctrain``): the same library as the verbs, no torch, errors as exceptions.

One test runs a real local job on a tiny generated dataset (one CPU task, two
steps); the others replace Slurm with fakes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import hpctrain
from hpctrain.cli.main import main
from hpctrain.contract.rundir import cancel_marker_path, write_run_info, write_summary
from hpctrain.dataset.generate import make_dataset
from hpctrain.errors import HpctrainError, RunDirError, SpecError, UsageError
from tests.fake_slurm import FakeSlurm

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 600  # a hang guard for the local run, not a timing assertion


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No developer's own profiles, registry or home; run ids fixed, so two renders name one directory."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HPCTRAIN_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr("hpctrain.contract.rundir.new_run_id", lambda now=None: "20260101-000000")


def test_import_hpctrain_and_the_api_names_import_no_torch() -> None:
    code = (
        "import sys, hpctrain\n"
        "before = sorted(m for m in sys.modules if m.startswith('hpctrain'))\n"
        "names = [hpctrain.load_job, hpctrain.submit, hpctrain.status, hpctrain.cancel, hpctrain.resume, "
        "hpctrain.report, hpctrain.RunStatus, hpctrain.HpctrainError]\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision', 'submitit')]\n"
        "print(before, heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['hpctrain'] []"  # 'import hpctrain' alone loads nothing else


def test_every_exported_name_resolves_and_an_unknown_one_is_an_attribute_error() -> None:
    assert set(hpctrain.__all__) == {"__version__", *hpctrain._LAZY}
    assert all(getattr(hpctrain, name) is not None for name in hpctrain.__all__)
    with pytest.raises(AttributeError, match="no attribute 'sumbit'"):
        hpctrain.sumbit  # noqa: B018


@pytest.mark.parametrize("spec", ["jobs/resnet50_4x4.yaml", "jobs/sweep_lr.yaml", "jobs/scaling_hal.yaml"])
def test_a_dry_run_returns_what_submit_dry_run_prints(
    spec: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["submit", str(REPO / spec), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    planned = hpctrain.submit(hpctrain.load_job(REPO / spec), dry_run=True)
    assert planned.plan == printed and planned.job_id is None and planned.backend == "slurm"
    if spec == "jobs/scaling_hal.yaml":  # a study: each point has its own script, in the plan
        assert planned.script is None and "# --- point 5/5: nodes-16" in printed
    else:
        assert printed.startswith(planned.script) and "\n#SBATCH --nodes=" in planned.script
        assert f"--output={planned.run_dir}/submitit/" in planned.script
    assert not (tmp_path / "home" / "hpctrain-runs").exists()  # a dry run writes nothing


def test_load_job_reports_every_problem_and_refuses_a_bare_string(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        hpctrain.load_job(REPO / "jobs/quickstart.yaml", ["trainer.epochs=0", "resources.nodes=0"])
    assert len(caught.value.problems) == 2
    with pytest.raises(UsageError, match="list of 'key=value'"):
        hpctrain.load_job(REPO / "jobs/quickstart.yaml", "trainer.epochs=2")
    with pytest.raises(HpctrainError):  # never SystemExit
        hpctrain.submit(tmp_path / "missing.yaml", dry_run=True)


def test_status_and_cancel_of_a_missing_run_are_run_dir_errors(tmp_path: Path) -> None:
    for call in (hpctrain.status, hpctrain.cancel, hpctrain.resume):
        with pytest.raises(RunDirError, match="not an hpctrain run directory"):
            call(tmp_path)


def slurm_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str) -> tuple[Path, FakeSlurm]:
    """A Slurm run whose job Slurm (a fake, in-process) says is in ``state``."""
    run_dir = tmp_path / "runs" / "demo" / "1"
    run_dir.mkdir(parents=True)
    write_run_info(run_dir, {"name": "demo", "job_id": "4242", "backend": "slurm", "cluster": "hal"})
    write_summary(run_dir, {"status": "completed" if state == "COMPLETED" else "running", "global_step": 9})
    return run_dir, FakeSlurm({"4242": state}).install(monkeypatch)


def test_cancel_of_a_finished_run_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, fake = slurm_run(tmp_path, monkeypatch, "COMPLETED")
    with pytest.raises(UsageError, match="already ended .*job 4242 ended COMPLETED.*nothing to cancel") as caught:
        hpctrain.cancel(run_dir)
    assert "hpctrain.status(" in (caught.value.hint or "")
    assert not cancel_marker_path(run_dir).exists() and not fake.asked("scancel")


def test_status_is_what_status_json_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, _ = slurm_run(tmp_path, monkeypatch, "RUNNING")
    status = hpctrain.status(run_dir)
    assert main(["status", str(run_dir), "--json"]) == 0
    assert status.as_dict() == json.loads(capsys.readouterr().out)
    assert (status.status, status.slurm_state, status.global_step, status.finished) == ("running", "RUNNING", 9, False)
    with pytest.raises(AttributeError):  # frozen
        status.status = "completed"  # type: ignore[misc]


def test_resume_refuses_while_the_job_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir, _ = slurm_run(tmp_path, monkeypatch, "RUNNING")
    with pytest.raises(UsageError, match="job 4242 of this run is still RUNNING"):
        hpctrain.resume(run_dir)


def test_a_local_submit_with_wait_completes_and_then_cannot_be_cancelled(tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_dataset(data, classes=2, per_class=4, val_per_class=2, image_size=32)
    spec = {
        "name": "api",
        "cluster": "local",
        "output_dir": str(tmp_path / "runs"),
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:30:00"},
        "trainer": {"arch": "resnet18", "strategy": "single", "batch_size": 4, "epochs": 1, "max_steps_per_epoch": 2},
        "data": {"root": str(data), "image_size": 32, "val_resize": 36, "workers": 0},
    }
    path = tmp_path / "api.yaml"
    path.write_text(yaml.safe_dump(spec))
    submitted = hpctrain.submit(hpctrain.load_job(path), local=True, wait=True)
    assert submitted.backend == "local" and submitted.state == "completed" and submitted.job_id
    assert submitted.run_dir.parent == tmp_path / "runs" / "api"
    status = hpctrain.status(submitted.run_dir)
    assert status.status == "completed" and status.epochs_completed == 1 and status.finished
    with pytest.raises(UsageError, match="already ended .*its summary is final"):
        hpctrain.cancel(submitted.run_dir)
    assert not cancel_marker_path(submitted.run_dir).exists()
    written = hpctrain.report(submitted.run_dir, out=tmp_path / "report")
    assert written.html.is_file() and written.markdown.is_file() and written.out_dir == tmp_path / "report"


def test_a_study_status_is_what_status_json_prints_and_an_ended_study_is_not_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_study import made_study

    study_dir = made_study(tmp_path, monkeypatch)
    study = hpctrain.status(study_dir)
    assert main(["status", str(study_dir), "--json"]) == 0
    assert study.as_dict() == json.loads(capsys.readouterr().out)
    assert [(p["label"], p["status"]) for p in study.points] == [("nodes-1", "completed"), ("nodes-2", "completed")]
    with pytest.raises(UsageError, match="no point of this study is still going"):
        hpctrain.cancel(study_dir)
    with pytest.raises(UsageError, match="is a study of 2 points"):
        hpctrain.resume(study_dir)


def test_cancel_of_a_running_job_writes_the_marker_then_scancels_and_returns_where_it_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, fake = slurm_run(tmp_path, monkeypatch, "RUNNING")
    events: list[str] = []

    def scancel(argv: list[str]) -> tuple[int, str]:
        events.append(f"{' '.join(argv)} (marker written: {cancel_marker_path(run_dir).exists()})")
        write_summary(run_dir, {"status": "stopped", "global_step": 9})
        fake.jobs["4242"] = "CANCELLED"
        return 0, ""

    fake.answers["scancel"] = scancel
    fake.kill_wait_s = 30
    done = hpctrain.cancel(run_dir, timeout_s=5)
    assert events == ["scancel 4242 (marker written: True)"]
    assert (done.job_id, done.state, done.status, done.settled, done.checkpoint_step) == (
        "4242",
        "CANCELLED",
        "stopped",
        True,
        None,
    )
