"""``signals:``: the time-limit warning, requeues on time-out and preemption, and the crash-loop limit."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from hpctrain.jobspec.section import Section


class Signals(Section):
    """Time-limit and preemption handling."""

    timeout_signal: Annotated[
        Literal["USR1", "USR2"], Field(description="Signal Slurm sends signal_delay_s before the time limit.")
    ] = "USR2"
    signal_delay_s: Annotated[
        int, Field(ge=10, le=3600, description="Seconds before the time limit that Slurm warns the job.")
    ] = 120
    requeue_on_timeout: Annotated[
        bool, Field(description="On the time-limit signal: checkpoint and requeue the job.")
    ] = True
    requeue_on_preemption: Annotated[
        bool, Field(description="On preemption (SIGTERM): checkpoint; Slurm requeues the job.")
    ] = True
    max_requeues: Annotated[int, Field(ge=0, description="Stop requeueing after this many restarts.")] = 100
    crash_loop_attempts: Annotated[
        int,
        Field(
            ge=1,
            le=1000,
            description="A run healing from lost nodes stops as failed after this many consecutive attempts "
            "that end without a newer complete checkpoint.",
        ),
    ] = 3
