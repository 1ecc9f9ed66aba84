"""Entry points of the task API's end-to-end tests (``entrypoint: tests.slurm.task_entrypoints:NAME``).

The launcher imports them by name on the compute nodes, so they live in a
module, not in a test file (see ``entrypoints.py``).
"""

from __future__ import annotations

import time
from typing import Any

ENTRYPOINT_MODULE = "tests.slurm.task_entrypoints"


def held_own_loop(ctx: Any, step_s: float = 0.5, **kwargs: Any) -> dict[str, Any]:
    """The example loop of docs/your-own-loop.md (hpctrain/examples/own_loop.py), each step held ``step_s`` (0.5 s).

    Its tiny model trains a step in milliseconds; held, a run of 18 steps lasts long enough for a test
    to signal it between two checkpoints. The hold sits in ``task.step``, which the loop calls once per
    step, outside anything that is saved: the weights are those of the loop as it is.
    """
    from hpctrain import task
    from hpctrain.examples.own_loop import main
    from hpctrain.task import reporting

    def held_step(number: int, epoch: int | None = None) -> None:
        time.sleep(step_s)
        reporting.step(number, epoch)

    task.step = held_step  # type: ignore[attr-defined]  # the package's name now answers before its __getattr__
    return main(ctx, **kwargs)
