"""The sbatch script of a job: written here, submitted by submitit.

submitit drives the job (pickles the task, runs ``sbatch``, tracks the job,
and on the compute nodes runs ``python -m submitit.core._submit FOLDER``); the
script text is ours, in the layout submitit's own ``_make_sbatch_string``
writes, so its job side finds what it expects: ``SUBMITIT_EXECUTOR=slurm``
and the per-task logs ``FOLDER/%j_%t_log.out`` (``%A_%a`` for arrays).
``hpctrain.launch.submission``'s executor hands submitit this text, and
``submit --dry-run`` prints the same text without importing submitit, which
would cost a login-node command about a fifth of its time (it imports asyncio).
``tests/unit/test_jobscript_sbatch_script.py`` checks the layout against submitit's
renderer for every example job. Pure and torch-free.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpctrain.contract.process_tokens import HOLD_OPTION, REAPER_MODULE
from hpctrain.contract.rundir import task_log_name

SUBMITIT_ENTRY = "-u -m submitit.core._submit"
# submitit's defaults for the parameters hpctrain may leave out.
DEFAULTS: dict[str, Any] = {
    "job_name": "submitit",
    "time": 5,
    "nodes": 1,
    "wckey": "submitit",
    "signal_delay_s": 90,
    "array_parallelism": 256,
}
# Parameters that shape the script but are not #SBATCH lines.
NOT_SBATCH = frozenset(
    {
        "map_count",
        "array_parallelism",
        "additional_parameters",
        "setup",
        "teardown",
        "signal_delay_s",
        "stderr_to_stdout",
        "srun_args",
        "use_srun",
    }
)


def executor_folder(folder: str | Path) -> Path:
    """The folder as submitit's executor holds it (absolute, ``~`` expanded)."""
    return Path(folder).expanduser().absolute()


def python_command(python: str = sys.executable, *, hold_stop_signals: bool = False) -> str:
    """A shell command that runs ``python ARGS...`` with a fresh task token in its exec-time environment
    (the reaper's exec wrapper, ``runtime/cleanup.py``).

    Pass it as submitit's ``SlurmExecutor(python=...)``: submitit appends
    ``-u -m submitit.core._submit FOLDER``. ``hold_stop_signals``: the task starts with
    Slurm's stop signals held; only for a task that listens (``runtime/stop_signals.py``).
    """
    hold = [HOLD_OPTION] if hold_stop_signals else []
    return " ".join(shlex.quote(part) for part in (python, "-m", REAPER_MODULE, "exec", *hold, python))


def task_command(python: str, folder: str | Path) -> str:
    """What srun runs in every task: submitit's job side, under ``python`` (already shell-quoted)."""
    return " ".join([python, SUBMITIT_ENTRY, shlex.quote(str(executor_folder(folder)))])


def slurm_mem(mem_gb: float) -> str:
    """``--mem``: whole gigabytes as GB, anything else in MB (as submitit writes it)."""
    return f"{int(mem_gb)}GB" if mem_gb == int(mem_gb) else f"{int(mem_gb * 1024)}MB"


def signal_parameter(timeout_signal: str, signal_delay_s: int) -> str:
    """The value of sbatch's ``--signal``: the spec's signal, ``signal_delay_s`` before the limit."""
    return f"{timeout_signal}@{signal_delay_s}"


def sbatch_flag(key: str, value: Any) -> str:
    key = key.replace("_", "-")
    return f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={shlex.quote(str(value))}"


def render_sbatch(
    parameters: Mapping[str, Any], folder: str | Path, command: str, supervisor: str | None = None
) -> str:
    """The script for executor ``parameters`` (submitit's names), logs under ``folder``; ``supervisor``:
    the command that runs the srun line in a healing job (``jobscript.parameters.supervisor_command``)."""
    given = {k: v for k, v in {**DEFAULTS, **parameters}.items() if v is not None}  # None: leave it out
    sbatch = {k: v for k, v in given.items() if k not in NOT_SBATCH}
    sbatch["signal"] = signal_parameter("USR2", given["signal_delay_s"])  # submitit default; hpctrain overrides it
    logs = executor_folder(folder)
    stdout, stderr = str(logs / task_log_name("%j", "%t", err=False)), str(logs / task_log_name("%j", "%t", err=True))
    map_count = given.get("map_count")
    if map_count is not None:
        sbatch["array"] = f"0-{map_count - 1}%{min(map_count, given['array_parallelism'])}"
        stdout, stderr = stdout.replace("%j", "%A_%a"), stderr.replace("%j", "%A_%a")
    to_stdout = bool(given.get("stderr_to_stdout"))
    sbatch["output"] = stdout.replace("%t", "0")
    if not to_stdout:
        sbatch["error"] = stderr.replace("%t", "0")
    sbatch["open-mode"] = "append"
    sbatch.update(given.get("additional_parameters") or {})

    lines = ["#!/bin/bash", "", "# Parameters", *(sbatch_flag(k, sbatch[k]) for k in sorted(sbatch))]
    if given.get("setup") is not None:
        lines += ["", "# setup", *given["setup"]]
    if given.get("use_srun", True):
        srun = ["srun", "--unbuffered", "--output", stdout, *([] if to_stdout else ["--error", stderr])]
        command = " ".join([shlex.join([*srun, *(given.get("srun_args") or [])]), command])
    if supervisor:  # it starts the srun line itself, once per training step
        command = f"{supervisor} {command}"
    lines += ["", "# command", "export SUBMITIT_EXECUTOR=slurm", command, ""]
    if given.get("teardown") is not None:
        lines += ["", "# teardown", *given["teardown"]]
    return "\n".join(lines)
