"""``distributed:``: the process group (backend, collective timeout, port, NCCL variables) and the hang watchdog."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from hpctrain.jobspec.fields import NcclEnvMap
from hpctrain.jobspec.section import Section


class Distributed(Section):
    """Process-group settings."""

    backend: Annotated[
        Literal["auto", "nccl", "gloo"], Field(description="auto: NCCL when CUDA is available, gloo otherwise.")
    ] = "auto"
    timeout_s: Annotated[int, Field(ge=10, le=7200, description="Collective timeout.")] = 300
    master_port: Annotated[int | None, Field(ge=1024, le=65535, description="Default: derived from job id.")] = None
    nccl_env: Annotated[NcclEnvMap, Field(description="Extra NCCL_* variables (override defaults).")] = {}
    heartbeat_interval_s: Annotated[
        float, Field(gt=0, le=600, description="How often each rank writes heartbeats/rank-N.json (docs/hangs.md).")
    ] = 10.0
    hang_timeout_s: Annotated[
        int | Literal["auto"] | None,
        Field(
            description="End the job with stack dumps when a rank makes no progress this long; "
            "below timeout_s; auto: 80% of timeout_s; null or 0: off (docs/hangs.md)."
        ),
    ] = "auto"

    @field_validator("hang_timeout_s", mode="before")
    @classmethod
    def _hang_timeout_form(cls, value: object) -> object:
        if value is None or value == "auto" or (type(value) is int and value >= 0):
            return value
        raise ValueError(f"must be whole seconds (>= 0), 'auto', or null/0 to turn the watchdog off (got {value!r})")

    @model_validator(mode="after")
    def _hang_before_timeout(self) -> Distributed:
        hang = self.hang_timeout_s
        if isinstance(hang, int) and hang > 0 and hang >= self.timeout_s:
            raise ValueError(
                f"distributed.hang_timeout_s ({hang}) must be shorter than distributed.timeout_s "
                f"({self.timeout_s}): the collective timeout would end a hung job before the watchdog "
                "could report it; lower hang_timeout_s or raise timeout_s"
            )
        return self

    @property
    def hang_timeout(self) -> float | None:
        """The watchdog's limit in seconds, or None when it is off ("auto": 80% of timeout_s)."""
        if self.hang_timeout_s == "auto":
            return 0.8 * self.timeout_s
        return float(self.hang_timeout_s) if self.hang_timeout_s else None
