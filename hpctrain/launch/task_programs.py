"""The program each task of a job runs, built for submitit to pickle into the job.

A trainer job's task runs a ``TaskLauncher`` (or, under ``launcher: torchrun``
on Slurm, a node task that starts torchrun); a script job's task runs the
script wrapper (or its torchrun node task). Each holds its trial's resolved
spec as plain data. This is the one login-side module that imports a program
(``programs/``): pickle names a program's class by its module path, so a
program that moves keeps its old name in ``hpctrain/__init__.py``'s import
hook. The programs import no torch at import time. ``submission.py`` hands
what is built here to the executor.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from hpctrain.errors import UsageError

if TYPE_CHECKING:
    from hpctrain.jobspec.load import LoadedJob


def task_launchers(
    job: LoadedJob, run_dirs: list[Path], backend: Literal["slurm", "local"] = "slurm", code_root: str | None = None
) -> list:
    """One launcher per trial, each holding that trial's resolved spec (a plain job is one trial).

    ``launcher: torchrun`` under Slurm runs a node task per node (programs/torchrun_node.py);
    a local run starts its processes as always (submitit's local executor).
    """
    from hpctrain.programs.launcher import TaskLauncher  # light: imports no torch
    from hpctrain.programs.torchrun_node import TorchrunNodeLauncher

    launcher = TorchrunNodeLauncher if backend == "slurm" and job.spec.launcher == "torchrun" else TaskLauncher
    return [
        launcher(trial.model_dump(mode="json"), str(d), code_root)
        for trial, d in zip(job.trials, run_dirs, strict=True)
    ]


def script_launchers(
    job: LoadedJob, run_dir: Path, trial_dirs: list[Path], backend: Literal["slurm", "local"], code_record: object
) -> list:
    """One script wrapper per trial (programs/script_launcher.py); under ``launcher: torchrun`` on Slurm, a
    node task per node that starts torchrun with each rank's wrapper as its program (script_torchrun.py)."""
    from hpctrain.launch.script_code import preempt_grace_s, script_code
    from hpctrain.programs.script_launcher import ScriptLauncher
    from hpctrain.programs.script_torchrun import ScriptTorchrunNode

    found = script_code(job.spec, run_dir, code_record)
    if found.file is not None and not Path(found.file).is_file():  # a resume without a copy, its file gone
        raise UsageError(
            f"{found.file}: the script is not there (the run has no copy of it: submitted with --no-snapshot)",
            hint="put it back where it was, or submit the spec again",
        )
    code = asdict(found)
    grace = preempt_grace_s(job.spec) if backend == "slurm" else None
    node = backend == "slurm" and job.spec.launcher == "torchrun"
    return [
        ScriptTorchrunNode(trial.model_dump(mode="json"), str(d), code, grace)
        if node
        else ScriptLauncher(trial.model_dump(mode="json"), str(d), code, grace)
        for trial, d in zip(job.trials, trial_dirs, strict=True)
    ]
