"""Which global batch a run keeps when it resumes on another number of ranks (docs/preemption.md).

A run's global batch is ``micro_batches`` canonical micro-batches of the per-process batch,
fixed when it first starts and recorded in every checkpoint. A resume on another number of
ranks keeps it: the ranks share the micro-batches of every step (``jobspec/shares.py``: whole
ones, and pieces of those left over) and accumulate gradients
(:meth:`~hpctrain.trainer.step.TrainStep.accumulate`), so the sequence of global batches, the
learning rate and the weights (up to summation order) are the uninterrupted run's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.batch import micro_batch_problem
from hpctrain.jobspec.strategy_traits import ELASTIC_STRATEGIES


def run_micro_batches(
    state: dict[str, Any] | None, *, processes: int, world_size: int, strategy: str, source: Path | None
) -> int:
    """The run's micro-batches per step: the checkpoint's, else this job's ``processes``.

    A checkpoint without the record (written before it existed) was written with one micro-batch
    per process; an elastic strategy's processes are its ranks. Raises when this job cannot
    split the run's global batch over its ranks.
    """
    if state is None:
        return processes
    saved = state.get("micro_batches")
    if not isinstance(saved, int) or isinstance(saved, bool) or saved < 1:
        same_shape = state.get("world_size") == world_size or strategy not in ELASTIC_STRATEGIES
        saved = processes if same_shape else int(state.get("world_size") or processes)
    problem = micro_batch_problem(saved, processes, strategy=strategy)
    if problem is not None:
        raise TrainingConfigError(
            f"{source}: {problem}",
            hint=f"resume with at most {saved} ranks (hpctrain resume RUN --set resources.nodes=K)",
        )
    return saved
