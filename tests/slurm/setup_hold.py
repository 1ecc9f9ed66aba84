"""An entry point whose set-up a Slurm test holds, to signal a task there deterministically, not after a sleep.

``entrypoint: tests.slurm.setup_hold:train``, with ``env: {HPCTRAIN_TEST_HOLD: FOLDER}``.
The launcher imports the entry point during the task's set-up, before the
process group forms (the moment of the bug this exercises: a stop signal in a
start's first seconds). So *importing* this module holds every task:

* it touches ``holding-S-R`` (S: the start, SLURM_RESTART_COUNT; R: the rank)
  and waits until a stop signal reaches the task -- then ``heard-S-R`` says
  which -- or ``release-S`` exists. The task's own handlers still get the
  signal: the hold only looks on.

``train`` is the built-in trainer; with ``hold_after_start=S`` that start
holds again after its last step (``trained-S-R``) until a stop signal or
``finish-S``: a preemption in a run's last seconds.

``BATCH_HOLD_SCRIPT`` holds the *batch script's* set-up (a ``setup:`` line,
before srun starts any task) of start S while ``batch-hold-S`` exists,
until ``batch-release-S``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

HOLD_VAR = "HPCTRAIN_TEST_HOLD"
HOLD_MAX_S = 300.0
WATCHED = (signal.SIGTERM, signal.SIGUSR2)
BATCH_HOLD_SCRIPT = """#!/bin/bash
# A setup: line of the sbatch script: holds start N before srun while batch-hold-N exists.
dir=$(dirname "$0")
n=${SLURM_RESTART_COUNT:-0}
[ -e "$dir/batch-hold-$n" ] || exit 0
touch "$dir/batch-holding-$n"
for _ in $(seq 3000); do
  [ -e "$dir/batch-release-$n" ] && exit 0
  sleep 0.1
done
"""


def _tag() -> str:
    return f"{os.environ.get('SLURM_RESTART_COUNT', '0')}-{os.environ.get('SLURM_PROCID', os.getpid())}"


def hold(folder: Path, name: str, release: Path, stopped: Any = None) -> list[str]:
    """Touch ``FOLDER/NAME-TAG``, wait for a stop signal (or ``stopped()``) or ``release``; the signals heard."""
    heard: list[str] = []
    previous = {signum: signal.getsignal(signum) for signum in WATCHED}

    def note(signum: int, frame: Any) -> None:
        heard.append(signal.Signals(signum).name)
        handler = previous[signum]
        if callable(handler):
            handler(signum, frame)

    for signum in WATCHED:
        signal.signal(signum, note)
    try:
        (folder / f"{name}-{_tag()}").touch()
        deadline = time.monotonic() + HOLD_MAX_S
        while not heard and not release.exists() and time.monotonic() < deadline:
            if stopped is not None and stopped():
                heard.append("stop request")
                break
            time.sleep(0.05)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if heard:
        (folder / f"heard-{_tag()}").write_text(",".join(heard))
    return heard


def _hold_the_import() -> None:
    folder = os.environ.get(HOLD_VAR)
    if folder:
        start = os.environ.get("SLURM_RESTART_COUNT", "0")
        hold(Path(folder), "holding", Path(folder) / f"release-{start}")


_hold_the_import()


def train(ctx: Any, hold_after_start: int = -1) -> dict[str, Any]:
    """The built-in trainer; start ``hold_after_start`` holds after its last step (see the module docstring)."""
    from hpctrain.trainer.trainer import run_training

    result = run_training(ctx)
    folder = os.environ.get(HOLD_VAR)
    if folder and ctx.env.restart_count == hold_after_start:
        start = ctx.env.restart_count
        hold(Path(folder), "trained", Path(folder) / f"finish-{start}", stopped=lambda: ctx.stop.local_reason)
    return result
