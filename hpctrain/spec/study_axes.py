"""A study's axes: which resource keys may vary, their grid, and each point's label.

A ``study:`` maps dotted resource keys to lists (``resources.nodes: [1, 2, 4]``);
the cartesian product of the lists gives the points, and each point becomes
its own Slurm job (not an array task: an array shares one allocation size).
Everything here is pure and torch-free; ``spec/load.py`` resolves each point's
spec with these helpers, ``hpctrain/study.py`` submits and records them.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpctrain.errors import SpecProblem

if TYPE_CHECKING:
    from hpctrain.spec.load import LoadedJob

# The resource keys that change a job's size; each takes whole numbers, so a
# point's label is a safe folder name. Anything else stays the same across points.
STUDY_KEYS: tuple[str, ...] = (
    "resources.nodes",
    "resources.gpus_per_node",
    "resources.tasks_per_node",
    "resources.cpus_per_task",
)
MAX_POINTS = 256  # one Slurm job each; more is a typo or a job for a sweep


@dataclass(frozen=True)
class StudyPoint:
    """One point of a study: its label (and run folder name), its axis values and its resolved job."""

    label: str
    values: dict[str, Any]
    job: LoadedJob


def check_axes(axes: object) -> list[SpecProblem]:
    """Every problem with a ``study:`` mapping at once, each naming its key. Pure."""
    if not isinstance(axes, Mapping):
        return []  # the model reports the wrong type
    problems = []
    for key, values in axes.items():
        where = f"study.{key}"
        if key not in STUDY_KEYS:
            problems.append(
                SpecProblem(
                    where,
                    f"a study varies resources only; {key!r} is not one of {', '.join(STUDY_KEYS)}"
                    + (" (training settings go in sweep:)" if not str(key).startswith("resources.") else ""),
                )
            )
            continue
        if not isinstance(values, list):
            continue  # the model reports the wrong type
        if not values:
            problems.append(SpecProblem(where, "needs at least one value, e.g. [1, 2, 4]"))
            continue
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int)]
        if bad:
            problems.append(SpecProblem(where, f"values must be whole numbers, not {bad[0]!r}"))
            continue
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            problems.append(
                SpecProblem(where, f"lists {', '.join(map(str, repeated))} more than once; each point runs once")
            )
    if not problems:
        count = study_size(axes)
        if count > MAX_POINTS:
            problems.append(
                SpecProblem("study", f"{count} points, but a study submits at most {MAX_POINTS} jobs; use fewer values")
            )
    return problems


def study_size(axes: Mapping[str, list[Any]]) -> int:
    size = 1
    for values in axes.values():
        size *= len(values)
    return size


def combinations(axes: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """The points of the grid, first axis slowest, each as {dotted key: value}."""
    keys = list(axes)
    return [dict(zip(keys, values)) for values in itertools.product(*(axes[k] for k in keys))]


def point_label(values: Mapping[str, Any]) -> str:
    """``{"resources.nodes": 2, "resources.gpus_per_node": 4}`` -> ``nodes-2_gpus_per_node-4``."""
    return "_".join(f"{key.rpartition('.')[2]}-{value}" for key, value in values.items())
