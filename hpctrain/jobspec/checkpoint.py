"""``checkpoint:``: when checkpoints are saved and how many are kept."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from hpctrain.jobspec.section import Section


class Checkpoint(Section):
    """When and how to checkpoint."""

    every_epochs: Annotated[int, Field(ge=1, description="Save a checkpoint every N epochs.")] = 1
    every_steps: Annotated[int | None, Field(ge=1, description="Also save every N optimizer steps.")] = None
    keep_last: Annotated[int, Field(ge=1, description="Keep the newest N checkpoints (plus the best).")] = 2
    keep_best: Annotated[bool, Field(description="Also keep the checkpoint with the best val top-1.")] = True
    async_save: Annotated[bool, Field(description="Snapshot to CPU, then write in the background.")] = True
