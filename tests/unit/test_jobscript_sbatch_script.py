"""hpctrain writes the sbatch script (sbatch_script.py) that submitit submits: it must be
the text submitit's own renderer writes from the same parameters, so submitit's job side finds
its logs and environment, and the executor that submits must write what --dry-run prints."""

from __future__ import annotations

from pathlib import Path

import pytest
from submitit.slurm.slurm import _make_sbatch_string

from hpctrain.contract.rundir import submitit_dir
from hpctrain.jobscript.parameters import slurm_parameters
from hpctrain.jobscript.sbatch_script import render_sbatch, slurm_mem, task_command
from hpctrain.jobspec.load import load_job
from hpctrain.launch.submission import build_executor, render_script

REPO = Path(__file__).resolve().parents[2]
RUN_DIR = Path("/runs/X")
EXAMPLES = sorted(p.stem for p in (REPO / "jobs").glob("*.yaml"))


@pytest.fixture(autouse=True)
def builtin_profiles_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCTRAIN_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.chdir(REPO)


@pytest.mark.parametrize("example", EXAMPLES)
def test_same_text_as_submitits_renderer(example: str) -> None:
    job = load_job(REPO / "jobs" / f"{example}.yaml")
    for spec in job.trials[:2]:
        parameters = slurm_parameters(spec, job.profile, RUN_DIR)
        for extra in ({}, {"map_count": 7}):
            folder = submitit_dir(RUN_DIR)
            command = task_command("PY", folder)
            ours = render_sbatch({**parameters, **extra}, folder, command)
            assert ours == _make_sbatch_string(command=command, folder=folder, **parameters, **extra)


@pytest.mark.parametrize(
    "parameters",
    [
        {},
        {"stderr_to_stdout": True, "use_srun": False, "teardown": ["echo done"]},
        {"wckey": "mine", "mem": slurm_mem(0.5), "exclusive": True, "map_count": 400, "array_parallelism": 16},
        {"job_name": "a b'c", "additional_parameters": {"comment": "x; rm -rf ~", "signal": "TERM@60"}},
    ],
)
def test_same_text_for_parameters_hpctrain_does_not_write_today(parameters: dict) -> None:
    folder = Path("/tmp/some where/submitit")
    ours = render_sbatch(parameters, folder, "CMD")
    assert ours == _make_sbatch_string(command="CMD", folder=folder, **parameters)


@pytest.mark.parametrize("example", ["resnet50_4x4", "sweep_lr", "smoke_apptainer_cpu", "smoke_2x2_torchrun_cpu"])
def test_the_submitting_executor_writes_what_dry_run_prints(example: str) -> None:
    job = load_job(REPO / "jobs" / f"{example}.yaml")
    executor = build_executor(job, "slurm", RUN_DIR)
    if job.is_sweep:
        executor.parameters["map_count"] = len(job.trials)
    submitted = executor._make_submission_file_text(executor._submitit_command_str, "uid")
    assert submitted == render_script(job, RUN_DIR)


def test_memory_is_written_as_submitit_writes_it() -> None:
    assert [slurm_mem(m) for m in (64, 64.0, 0.5, 1.25)] == ["64GB", "64GB", "512MB", "1280MB"]
