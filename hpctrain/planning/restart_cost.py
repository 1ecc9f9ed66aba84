"""What one start of a chunk costs before it trains again: measured by this spec's earlier runs, or assumed.

Each run records its starts (``contract/starts.py``): when a start began and
when its first step was done, so a start's cost is the difference (plus the
steps it trained again since its checkpoint, at the run's step time). The
plan charges every chunk that cost (``timeline.py``), best source first,
always said:

1. ``--restart S`` (``restart_s=``): the user's own number;
2. **measured from N restarts**: the median cost of the later starts (a
   requeue, a preemption's restart, a relaunch, ``hpctrain resume``) of this
   spec's earlier runs (``history.py``: the same model, batch, data, node);
3. **measured from N first starts**: where no run restarted yet, the median of
   their first starts (no checkpoint to load, so it may be a little low);
4. **assumed**: :data:`~hpctrain.planning.timeline.RESTART_S` (120 s).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Literal

from hpctrain.planning.history import History
from hpctrain.planning.timeline import RESTART_S

Basis = Literal["yours", "restarts", "first starts", "assumed"]


@dataclass(frozen=True)
class RestartCost:
    seconds: float
    basis: Basis
    starts: int = 0  # how many starts the median is over
    runs: int = 0  # of how many earlier runs

    @property
    def measured(self) -> bool:
        return self.basis in ("restarts", "first starts")

    @property
    def source(self) -> str:
        """In words, for the plan's note and estimate lines."""
        if self.basis == "yours":
            return "yours (--restart)"
        if self.basis == "assumed":
            return "assumed (no earlier run of this spec recorded a start; --restart to set it)"
        return (
            f"measured: median of {self.starts} {self.basis if self.starts != 1 else self.basis[:-1]} of "
            f"{self.runs} earlier run(s)"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "basis": self.basis,
            "measured": self.measured,
            "starts": self.starts,
            "runs": self.runs,
            "source": self.source,
        }


def restart_cost(found: History, user_s: float | None = None) -> RestartCost:
    """The cost a plan charges each chunk's start (see the module docstring)."""
    if user_s is not None:
        return RestartCost(float(user_s), "yours")
    if found.restart_costs:
        costs, basis = found.restart_costs, "restarts"
    elif found.first_start_costs:
        costs, basis = found.first_start_costs, "first starts"
    else:
        return RestartCost(RESTART_S, "assumed")
    return RestartCost(round(statistics.median(costs), 1), basis, len(costs), found.started_runs)
