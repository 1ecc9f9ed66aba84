"""The base of every spec section: what each YAML mapping of the job spec shares.

Every section forbids unknown keys, so a typo is an error, not a silently
ignored setting; values are strict (``"4"`` is not a number) and assignments
are re-validated. Field names are part of the user interface (docs, examples
and tests rely on them), and units live in the names (``mem_gb``, ``timeout_s``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Shared config: unknown keys are errors; assignments are re-validated."""

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        str_strip_whitespace=True,
        strict=True,
        allow_inf_nan=False,
        defer_build=True,
    )
