"""The checks of ``after:`` that need the rest of the spec: where ``{after.NAME}`` may stand, and what it may be.

``validate`` and ``submit`` call :func:`chain_problems` through
``cross_checks.check_resolved``. An ``{after.NAME}`` needs an ``after:``
section (or ``submit --after RUN``) and a known NAME; in ``entrypoint_args``
it is filled only in string values (the texts of a ``script:`` are checked by
the section itself, ``script_args.py``). ``after:`` owns the job's Slurm
dependency, so ``resources.slurm_extra.dependency`` beside it is refused.
Whether the upstream run exists is asked at submit (``launch/chain.py``), not
here: ``validate`` reads no run directory. Pure, torch-free.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from hpctrain.errors import SpecProblem
from hpctrain.jobspec.after_names import AFTER_PLACEHOLDERS, AFTER_PREFIX, after_known_list
from hpctrain.jobspec.script_args import after_names_used

if TYPE_CHECKING:
    from hpctrain.jobspec.models import JobSpec


def placeholder_texts(spec: JobSpec) -> list[tuple[str, str]]:
    """(dotted key, text) of everything ``{after.NAME}`` may stand in."""
    texts: list[tuple[str, str]] = []
    if spec.script is not None:
        texts += [(f"script.args.{index}", arg) for index, arg in enumerate(spec.script.args)]
        texts += [("script.workdir", spec.script.workdir)] if spec.script.workdir is not None else []
    texts += [
        (f"entrypoint_args.{key}", value) for key, value in spec.entrypoint_args.items() if isinstance(value, str)
    ]
    return texts


def chain_problems(spec: JobSpec) -> Iterator[SpecProblem]:
    for key, text in placeholder_texts(spec):
        for name in after_names_used(text):
            field = name[len(AFTER_PREFIX) :]
            if field not in AFTER_PLACEHOLDERS:
                yield SpecProblem(key, f"unknown placeholder {{{name}}} in {text!r}; known: {after_known_list()}")
            elif spec.after is None:
                yield SpecProblem(
                    key,
                    f"{{{name}}} in {text!r}, but the spec names no upstream run; add 'after: {{run: RUN_DIR}}' "
                    "or submit with --after RUN",
                )
    if spec.after is not None and "dependency" in spec.resources.slurm_extra and not _ours(spec):
        yield SpecProblem(
            "resources.slurm_extra.dependency",
            "after: sets the job's Slurm dependency itself (and re-points it when the upstream is resumed); "
            "remove slurm_extra.dependency",
        )


def _ours(spec: JobSpec) -> bool:
    """A dependency written by ``launch/chain.py`` at submit (recorded in the run's spec.yaml)."""
    value = str(spec.resources.slurm_extra.get("dependency", ""))
    return value.startswith(("afterok:", "afterany:", "afternotok:")) and value.count(":") == 1
