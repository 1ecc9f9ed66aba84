"""A study's axes: which resource keys may vary, their grid, and each point's label.

A ``study:`` maps dotted resource keys to lists (``resources.nodes: [1, 2, 4]``);
the cartesian product of the lists gives the points, and each point becomes
its own Slurm job (not an array task: an array shares one allocation size).
Everything here is pure and torch-free; ``jobspec/load.py`` resolves each point (its ``StudyPoint``)'s
spec with these helpers, ``hpctrain/launch/study.py`` submits and records them.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping
from typing import Any

from hpctrain.errors import SpecProblem
from hpctrain.jobspec.fields import shown_value

# The resource keys that change a job's size; each takes whole numbers, so a
# point's label is a safe folder name. Anything else stays the same across points.
STUDY_KEYS: tuple[str, ...] = (
    "resources.nodes",
    "resources.gpus_per_node",
    "resources.tasks_per_node",
    "resources.cpus_per_task",
)


def check_axes(axes: object) -> list[SpecProblem]:
    """Every problem with a ``study:`` mapping at once, each naming its key. Pure, and linear in
    the number of values (a list longer than the point cap is refused before it is looked into)."""
    if not isinstance(axes, Mapping):
        return []  # the model reports the wrong type
    from hpctrain.contract.study_file import MAX_POINTS  # here: a spec without a study need not load it

    problems = []
    for key, values in axes.items():
        message = _axis_problem(key, values)
        if message is not None:
            problems.append(SpecProblem(f"study.{key}", message))
    if not problems:
        count = study_size(axes)
        if count > MAX_POINTS:
            problems.append(
                SpecProblem("study", f"{count} points, but a study submits at most {MAX_POINTS} jobs; use fewer values")
            )
    return problems


def _axis_problem(key: object, values: object) -> str | None:
    """What is wrong with one axis, or None. Every shape YAML can give is answered here."""
    if key not in STUDY_KEYS:
        return f"a study varies resources only; {shown_value(key)} is not one of {', '.join(STUDY_KEYS)}" + (
            " (training settings go in sweep:)" if not str(key).startswith("resources.") else ""
        )
    if not isinstance(values, list):
        one = f"; to run one size only, set {key}: {shown_value(values)} instead" if type(values) is int else ""
        return f"must be a list of values such as [1, 2, 4], not {shown_value(values)}{one}"
    if not values:
        return "needs at least one value, e.g. [1, 2, 4]"
    from hpctrain.contract.study_file import MAX_POINTS

    if len(values) > MAX_POINTS:
        return f"{len(values):,} values, but a study submits at most {MAX_POINTS} jobs (one per point); use fewer"
    bad = [v for v in values if type(v) is not int]  # bool is an int subclass; true is not a size
    if bad:
        return f"values must be whole numbers such as 4, not {shown_value(bad[0])}" + (
            f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        )
    repeated = sorted(value for value, count in Counter(values).items() if count > 1)
    if repeated:
        return f"lists {shown_value(repeated)[1:-1]} more than once; each point runs once"
    return None


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
