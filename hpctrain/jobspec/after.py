"""``after:``: start this run once another run has completed (or ended, or failed), with its results at hand.

The section names the upstream run (a run directory, or the job id
``hpctrain status`` prints) and the condition; ``hpctrain submit SPEC --after
RUN`` writes it from the command line. The upstream's results reach a
``script:``'s ``args`` and ``workdir`` and an ``entrypoint:``'s string
``entrypoint_args`` as ``{after.NAME}`` placeholders, filled on the nodes when
the run starts (its upstream's final checkpoint is known only then), each as
one value: a script gets it as one argument word, never through a shell.
How a chain follows its upstream across requeues and resumes: docs/chains.md
and ``launch/chain.py``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from hpctrain.jobspec.after_names import AFTER_PLACEHOLDERS, AFTER_PREFIX, after_known_list, is_after_name
from hpctrain.jobspec.fields import safe_path
from hpctrain.jobspec.section import Section

Condition = Literal["completed", "ended", "failed"]


class After(Section):
    """Start once another run has completed (or ended, or failed); its results as {after.NAME} (docs/chains.md)."""

    run: Annotated[
        str,
        Field(
            min_length=1,
            description="The upstream run: its run directory, or its job id as 'hpctrain status' lists it.",
        ),
    ]
    when: Annotated[
        Condition,
        Field(
            description="completed: the upstream's run completed; ended: it ended for good, any way (completed, "
            "failed or cancelled); failed: it failed or was cancelled. Otherwise this run ends, the reason in "
            "its status."
        ),
    ] = "completed"

    @field_validator("run")
    @classmethod
    def _run(cls, value: str) -> str:
        return safe_path(value) or value


__all__ = ["AFTER_PLACEHOLDERS", "AFTER_PREFIX", "After", "Condition", "after_known_list", "is_after_name"]
