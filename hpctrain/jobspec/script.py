"""``script:``: your own training script, run on every rank or node instead of the trainer (docs/scripts.md).

Its checks beside it: ``script_args.py`` (the placeholders of ``script.args``)
and ``script_checks.py`` (the file or module exists, placeholders fit the
launcher, sweep keys are used), both reported with every other problem.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from hpctrain.jobspec.fields import MODULE_PATTERN, ScriptArg, check_script_text, safe_path
from hpctrain.jobspec.section import Section


class Script(Section):
    """Your own training script, run by hpctrain on every rank (or node) instead of the trainer (docs/scripts.md)."""

    model_config = ConfigDict(**{**Section.model_config, "str_strip_whitespace": False})  # arguments stay verbatim

    path: Annotated[
        str | None,
        Field(description="The script file, run as 'python PATH ARGS...' (relative to where you run hpctrain)."),
    ] = None
    module: Annotated[
        str | None,
        Field(pattern=MODULE_PATTERN, description="A module run as 'python -m MODULE ARGS...' instead of a path."),
    ] = None
    args: Annotated[
        list[ScriptArg],
        Field(
            description="The script's arguments, strings, filled per process: {master_addr} {master_port} "
            "{world_size} {rank} {local_rank} {node_rank} {nnodes} {nproc_per_node} {run_dir} {checkpoint_dir} "
            "{restart} {script_dir} and {sweep.KEY}; {{ and }} are literal braces."
        ),
    ] = []
    per: Annotated[
        Literal["rank", "node"],
        Field(
            description="rank: one process per rank (resources.tasks_per_node per node), with the torchrun "
            "environment; node: one process per node that starts its own workers (mp.spawn)."
        ),
    ] = "rank"
    stop_signal: Annotated[
        Literal["TERM", "INT", "USR1"],
        Field(
            description="Sent to the script's process group on a time limit, preemption or cancel; the script "
            "saves and exits (INT raises KeyboardInterrupt in Python)."
        ),
    ] = "TERM"
    stop_timeout_s: Annotated[
        int | None,
        Field(
            ge=1,
            le=86400,
            description="Seconds the script has to exit after the stop signal before its processes are killed. "
            "Default: signal_delay_s - 15 on the time-limit warning; on preemption the partition's GraceTime - 5 "
            "(read at submit), else until Slurm ends the job.",
        ),
    ] = None
    workdir: Annotated[
        str | None,
        Field(
            description="The script's working directory (created if missing; placeholders allowed). Default: the "
            "run directory, so a relative checkpoint path survives requeues."
        ),
    ] = None
    silence_timeout_s: Annotated[
        int | None,
        Field(
            ge=0,
            le=604800,
            description="End the job as hung when a process's script writes no output (and no hpctrain heartbeat) "
            "for this long; null or 0: off. For scripts that use neither hpctrain.task nor heartbeats.",
        ),
    ] = None

    @field_validator("path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        return safe_path(value)

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str | None) -> str | None:
        return check_script_text(safe_path(value)) if value is not None else None

    @model_validator(mode="after")
    def _one_program(self) -> Script:
        if (self.path is None) == (self.module is None):
            raise ValueError(
                "script needs exactly one of path (a file: python PATH) or module (python -m MODULE)"
                + ("; remove one" if self.path else "")
            )
        return self

    @property
    def program(self) -> str:
        """What the spec runs, as a person would name it."""
        return self.path if self.path is not None else f"-m {self.module}"
