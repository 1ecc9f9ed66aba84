"""srun's report of the tasks that failed: ``srun: error: NODE: task N: REASON``, parsed. Pure.

``srun --kill-on-bad-exit`` prints one such line to the batch step's stderr
(submitit's ``<job>_0_log.err``) for every task that died, before it ends
the others; the torchrun launcher's node tasks write the same words
(``torchrun: error: ...``, with global ranks) into
``.hpctrain/torchrun-failures.log``. Rank 0 records the first one in
``summary.json`` (``runtime/failures.py``), ``status`` names it for a job
whose rank 0 could not (``launch/run_state.py``), and the healing
supervisor weighs every one (``healing/``): one parser for all of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# "srun: error: n2: task 3: Killed", "srun: error: n1: tasks 0-1: Exited with exit code 1";
# the torchrun launcher's node tasks write the same with "torchrun:" and global ranks.
_SRUN_TASK_ERROR = re.compile(
    r"^(?:srun|torchrun): error: (?P<node>[^:\s]+): tasks? (?P<tasks>\d[\d,\-]*): (?P<reason>.+)$", re.M
)


@dataclass(frozen=True)
class TaskFailure:
    rank: int
    node: str
    reason: str


def parse_task_list(text: str) -> list[int]:
    """``"3"``, ``"0-1"``, ``"0,2-3"`` -> the task ids, ascending."""
    ranks: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            ranks.update(range(int(low), int(high or low) + 1))
    return sorted(ranks)


def first_task_failure(text: str) -> TaskFailure | None:
    """The first task srun reported as failed in ``text`` (its lowest id when a line names several). Pure."""
    for match in _SRUN_TASK_ERROR.finditer(text):
        ranks = parse_task_list(match.group("tasks"))
        if ranks:
            return TaskFailure(ranks[0], match.group("node"), match.group("reason").strip())
    return None


def task_failures(text: str) -> list[TaskFailure]:
    """Every task failure srun reported in ``text``, first first (a line's lowest task id). Pure."""
    found = []
    for line in text.splitlines(keepends=True):
        failure = first_task_failure(line)
        if failure is not None:
            found.append(failure)
    return found
