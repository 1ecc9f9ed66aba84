"""The sbatch scripts hpctrain renders, compared with recorded golden files
(submitit's own approach), and the pure spec -> executor parameter functions.

A golden file that is missing is written by the test; delete one to record a
new version after an intended change.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from hpctrain.jobscript.parameters import slurm_parameters
from hpctrain.jobspec.load import load_job
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.profiles import BUILTIN_PROFILES, ClusterProfile, apply_profile
from hpctrain.launch.submission import local_parameters, render_script, task_python

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
RUN_DIR = Path("/runs/X")


@pytest.fixture(autouse=True)
def builtin_profiles_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's own ~/.config/hpctrain/clusters/hal.yaml must not change the scripts."""
    monkeypatch.setenv("HPCTRAIN_CONFIG_DIR", str(tmp_path / "config"))


def normalised(script: str) -> str:
    """The interpreter path differs between machines; everything else must not."""
    script = script.replace(shlex.quote(sys.executable), "PYTHON").replace(sys.executable, "PYTHON")
    return script.replace(str(REPO), "REPO")  # container mounts name the submit directory


@pytest.mark.parametrize(
    "example",
    [
        "resnet50_4x4",
        "smoke_2x2_cpu",
        "smoke_2x2_torchrun_cpu",
        "sweep_lr",
        "resnet50_pyxis",
        "smoke_apptainer_cpu",
        "script_imagenet_hal",
    ],
)
def test_rendered_script_matches_golden_file(example: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the examples' relative paths resolve as they do for a user
    script = normalised(render_script(load_job(REPO / "jobs" / f"{example}.yaml"), RUN_DIR))
    golden = GOLDEN / f"{example}.sbatch"
    if not golden.exists():
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(script)
    relative = golden.relative_to(REPO)
    assert script == golden.read_text(), (
        f"the rendered sbatch script for jobs/{example}.yaml changed; "
        f"delete {relative} if the change is intended (the test writes it again)"
    )


def test_golden_scripts_say_what_the_issue_asks_for() -> None:
    """The golden files themselves are checked, so a bad one cannot be recorded by accident."""
    lines = (GOLDEN / "resnet50_4x4.sbatch").read_text().splitlines()
    for expected in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=4", "#SBATCH --gres=gpu:v100:4"):
        assert expected in lines
    srun = next(line for line in lines if line.startswith("srun "))
    assert "--kill-on-bad-exit=1" in shlex.split(srun)
    assert srun.split()[-5] == "PYTHON"
    smoke = (GOLDEN / "smoke_2x2_cpu.sbatch").read_text()
    assert "--gres" not in smoke and "--gpus" not in smoke
    assert "#SBATCH --partition=debug" in smoke.splitlines()
    assert "#SBATCH --array=0-5%3" in (GOLDEN / "sweep_lr.sbatch").read_text().splitlines()
    assert "hpctrain_slurm_relay" not in smoke


def test_container_scripts_start_tasks_inside_the_image_and_keep_requeue_outside() -> None:
    pyxis = (GOLDEN / "resnet50_pyxis.sbatch").read_text()
    srun = shlex.split(next(line for line in pyxis.splitlines() if line.startswith("srun ")))
    assert "--container-image=nvcr.io#nvidia/pytorch:24.05-py3" in srun
    mounts = next(a for a in srun if a.startswith("--container-mounts=")).split("=", 1)[1].split(",")
    assert "/home/shared/imagenet/raw:/home/shared/imagenet/raw:ro" in mounts and "REPO/runs" in mounts
    assert srun[srun.index("--container-workdir=REPO") + 1 : srun.index("--container-workdir=REPO") + 3] == [
        "python3",
        "-m",
    ]
    apptainer = (GOLDEN / "smoke_apptainer_cpu.sbatch").read_text()
    srun = shlex.split(next(line for line in apptainer.splitlines() if line.startswith("srun ")))
    start = srun.index("apptainer")
    assert srun[start : start + 2] == ["apptainer", "exec"] and "--nv" not in srun  # a CPU job
    assert srun[srun.index("/home/shared/images/hpctrain.sif") + 1] == "python3"
    for script in (pyxis, apptainer):
        relay = script.index('hpctrain_slurm_relay "$HPCTRAIN_SLURM_RELAY" &')
        assert relay < script.index("\nsrun "), "the relay runs in the batch step, outside the image, before srun"
        assert "PYTHON" not in script  # the host interpreter is not what the tasks run


def resolved(profile: ClusterProfile | str, **spec: Any) -> tuple[JobSpec, ClusterProfile]:
    profile = BUILTIN_PROFILES[profile] if isinstance(profile, str) else profile
    spec.setdefault("name", "job")
    spec.setdefault("data", {"root": "/d"})
    return apply_profile(JobSpec.model_validate(spec), profile), profile


def params(profile: ClusterProfile | str, **spec: Any) -> dict[str, Any]:
    job, profile = resolved(profile, **spec)
    return slurm_parameters(job, profile, RUN_DIR)


def test_gres_when_the_profile_names_one() -> None:
    result = params("hal", resources={"gpus_per_node": 2})
    assert result["gres"] == "gpu:v100:2"
    assert "gpus_per_node" not in result
    assert result["ntasks_per_node"] == 2


def test_gpus_per_node_without_a_gres_template() -> None:
    result = params("slurm", resources={"gpus_per_node": 8})
    assert result["gpus_per_node"] == 8
    assert "gres" not in result


def test_cpu_jobs_ask_for_no_gpus() -> None:
    result = params("slurm", resources={"tasks_per_node": 2, "cpus_per_task": 3})
    assert "gres" not in result and "gpus_per_node" not in result
    assert (result["ntasks_per_node"], result["cpus_per_task"]) == (2, 3)


@pytest.mark.parametrize(("mem_gb", "mem"), [(64, "64GB"), (1.5, "1536MB"), (None, None)])
def test_memory(mem_gb: float | None, mem: str | None) -> None:
    assert params("slurm", resources={"mem_gb": mem_gb}).get("mem") == mem


def test_exclusive_only_when_asked() -> None:
    assert params("slurm", resources={"exclusive": True})["exclusive"] is True
    assert "exclusive" not in params("slurm")


def test_time_is_whole_minutes_rounded_up() -> None:
    assert params("slurm", resources={"time": "01:30:01"})["time"] == 91
    assert params("slurm", resources={"time": "2-00:00:00"})["time"] == 2880


def test_default_signal_line_is_written_from_the_spec() -> None:
    # Never left to submitit, whose line follows SUBMITIT_PREEMPT_SIGNAL in the submitting shell.
    result = params("slurm", signals={"signal_delay_s": 300})
    assert result["signal_delay_s"] == 300
    assert result["additional_parameters"]["signal"] == "USR2@300"


def test_usr1_overrides_submitits_signal_line() -> None:
    result = params("slurm", signals={"timeout_signal": "USR1", "signal_delay_s": 200})
    assert result["additional_parameters"]["signal"] == "USR1@200"


@pytest.mark.parametrize(
    ("timeout", "preemption", "flag"),
    [(True, True, "requeue"), (True, False, "requeue"), (False, True, "requeue"), (False, False, "no-requeue")],
)
def test_requeue(timeout: bool, preemption: bool, flag: str) -> None:
    signals = {"requeue_on_timeout": timeout, "requeue_on_preemption": preemption}
    extra = params("slurm", signals=signals)["additional_parameters"]
    assert extra[flag] is True
    assert set(extra) & {"requeue", "no-requeue"} == {flag}


def test_slurm_extra_from_profile_and_spec() -> None:
    profile = BUILTIN_PROFILES["slurm"].model_copy(update={"slurm_extra": {"reservation": "p", "mail-type": "END"}})
    extra = params(profile, resources={"slurm_extra": {"reservation": "mine"}})["additional_parameters"]
    assert extra["reservation"] == "mine"
    assert extra["mail-type"] == "END"


def test_words_from_profile_and_spec() -> None:
    result = params("hal", resources={"account": "bbka", "qos": "high", "constraint": "v100&ib"})
    assert (result["partition"], result["account"], result["qos"], result["constraint"]) == (
        "gpu",
        "bbka",
        "high",
        "v100&ib",
    )
    assert "account" not in params("slurm")


def test_every_task_dies_if_one_fails_and_wckey_is_unset() -> None:
    result = params("slurm")
    assert result["srun_args"] == ["--kill-on-bad-exit=1"]
    assert result["wckey"] is None


def test_preamble_carries_setup_and_quoted_env() -> None:
    setup = params("hal", env={"A": "x y", "B": "$(id)"}, setup=["module load cuda"])["setup"]
    assert setup.index("module load opence") < setup.index("module load cuda")
    assert "export A='x y'" in setup
    assert "export B='$(id)'" in setup
    assert f"export HPCTRAIN_RUN_DIR={RUN_DIR}" in setup


def test_slurm_parameters_is_pure() -> None:
    job, profile = resolved("hal")
    before = job.model_dump()
    assert slurm_parameters(job, profile, RUN_DIR) == slurm_parameters(job, profile, RUN_DIR)
    assert job.model_dump() == before


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"resources": {"nodes": 2, "tasks_per_node": 2, "time": "00:10:00"}},
            {"tasks_per_node": 4, "nodes": 1, "timeout_min": 10, "gpus_per_node": 0, "signal_delay_s": 120},
        ),
        (
            {"resources": {"nodes": 2, "gpus_per_node": 2}, "signals": {"signal_delay_s": 30}},
            {"tasks_per_node": 4, "nodes": 1, "timeout_min": 60, "gpus_per_node": 4, "signal_delay_s": 30},
        ),
        (
            {"trainer": {"strategy": "hogwild", "hogwild_processes": 4}},
            {"tasks_per_node": 1, "nodes": 1, "timeout_min": 60, "gpus_per_node": 0, "signal_delay_s": 120},
        ),
    ],
)
def test_local_parameters_put_the_whole_world_on_this_machine(spec: dict, expected: dict) -> None:
    job, _ = resolved("local", **spec)
    assert local_parameters(job) == expected


def test_container_options_are_runtime_flags_before_the_image() -> None:
    container = {"runtime": "apptainer", "image": "/i/a.sif", "options": ["--no-privs", "--writable-tmpfs"]}
    job, _ = resolved("hal", container=container, resources={"gpus_per_node": 0})
    words = shlex.split(task_python(job))
    assert words[:4] == ["apptainer", "exec", "--no-privs", "--writable-tmpfs"]
    assert words[words.index("/i/a.sif") - 2] == "--pwd"  # the image follows every flag
    gpu, _ = resolved("hal", container={**container, "options": ["--nv"]}, resources={"gpus_per_node": 1})
    assert shlex.split(task_python(gpu)).count("--nv") == 1  # a GPU job's own --nv is not doubled
    pyxis, profile = resolved(
        "hal", container={"runtime": "pyxis", "image": "a.sqsh", "options": ["--container-remap-root"]}
    )
    assert slurm_parameters(pyxis, profile, RUN_DIR)["srun_args"][-1] == "--container-remap-root"


def test_a_full_disk_at_submit_names_the_file_and_its_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import errno

    from cli_helpers import assert_user_error, in_process

    from hpctrain.contract import file_writes

    (tmp_path / "train.py").write_text("")
    runs = tmp_path / "runs"
    (tmp_path / "job.yaml").write_text(
        f"name: s\ncluster: local\noutput_dir: {runs}\nresources: {{gpus_per_node: 0}}\nscript: {{path: train.py}}\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HPCTRAIN_CONFIG_DIR", str(tmp_path / "config"))

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(file_writes.os, "fsync", full)
    done = in_process(capsys, "submit", "job.yaml", "--local")
    assert_user_error(done, 2, "No space left on device", "spec.yaml", "MiB free", "output_dir")
    assert str(runs / "s") in done.stderr
    assert not any((runs / "s").iterdir())  # the unsubmitted run directory is gone
