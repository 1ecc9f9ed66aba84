"""``resources:``: what to ask Slurm for (nodes, GPUs, tasks, memory, time, partition, spares).

Checks that need another section (healing needs an elastic strategy, the
profile's limits) are in ``node_loss.py`` and ``cross_checks.py``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from hpctrain.jobspec.fields import SlurmExtraMap, check_mem_gb, check_slurm_word
from hpctrain.jobspec.section import Section
from hpctrain.jobspec.slurm_time import ALLOWED_FORMS, parse_time_limit


class Resources(Section):
    """What to ask Slurm for. ``None`` means "take the cluster profile's value"."""

    nodes: Annotated[int, Field(ge=1, le=4096, description="Number of nodes.")] = 1
    min_nodes: Annotated[
        int | None,
        Field(
            ge=1,
            le=4096,
            description="Fewest nodes to keep training on after a node is lost inside the allocation "
            "(docs/preemption.md). Default: nodes (a lost node needs a spare or a requeue).",
        ),
    ] = None
    spare_nodes: Annotated[
        int,
        Field(
            ge=0,
            le=4096,
            description="Extra nodes held in the allocation to replace a lost node without waiting in the queue "
            "(at most nodes: one spare per training node). The job asks Slurm for nodes + spare_nodes; "
            "validate and --dry-run say both.",
        ),
    ] = 0
    expedited_requeue: Annotated[
        bool | Literal["auto"],
        Field(
            description="Slurm's expedited requeue (25.11+, --requeue=expedite): after a node failure the job is "
            "eligible again at once and goes to the head of the queue (docs/preemption.md). auto: where the "
            "cluster enables it (SlurmctldParameters=enable_expedited_requeue; hpctrain doctor says); true: "
            "refuse to submit where it does not; false: never.",
        ),
    ] = False
    gpus_per_node: Annotated[
        int | None, Field(ge=0, le=64, description="GPUs per node (0 = CPU job). Default: the profile's.")
    ] = None
    tasks_per_node: Annotated[
        int | None,
        Field(
            ge=1,
            le=256,
            description="Slurm tasks per node. Default: one per GPU for ddp, one per node for single/dp/hogwild, "
            "1 on CPU-only nodes.",
        ),
    ] = None
    cpus_per_task: Annotated[int | None, Field(ge=1, le=1024, description="CPUs per task.")] = None
    mem_gb: Annotated[float | None, Field(gt=0, description="Memory per node in GiB (--mem).")] = None
    time: Annotated[str, Field(description=f"Time limit: {ALLOWED_FORMS}.")] = "01:00:00"
    time_min: Annotated[
        str | None, Field(description="Shortest limit to accept (--time-min): backfill may start the job sooner.")
    ] = None
    partition: Annotated[str | None, Field(description="Slurm partition (--partition). Default: the profile's.")] = None
    account: Annotated[str | None, Field(description="Slurm account to charge (--account).")] = None
    qos: Annotated[str | None, Field(description="Slurm quality of service (--qos).")] = None
    constraint: Annotated[str | None, Field(description="Slurm node features (--constraint), e.g. 'v100&ib'.")] = None
    exclusive: Annotated[bool, Field(description="Ask for whole nodes (--exclusive).")] = False
    array_parallelism: Annotated[int, Field(ge=1, description="Max array tasks running at once (sweeps).")] = 64
    slurm_extra: Annotated[
        SlurmExtraMap,
        Field(description="Extra '#SBATCH --KEY=VALUE' lines, e.g. {reservation: myres}."),
    ] = {}

    @field_validator("time", mode="before")
    @classmethod
    def _time_is_slurm_time(cls, value: object) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ValueError(f"time must be a string such as '24:00:00' ({ALLOWED_FORMS})")
        parse_time_limit(value)
        return str(value)

    @field_validator("time_min", mode="before")
    @classmethod
    def _time_min_is_slurm_time(cls, value: object) -> str | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ValueError(f"time_min must be a string such as '04:00:00' ({ALLOWED_FORMS})")
        parse_time_limit(value)
        return str(value)

    @field_validator("expedited_requeue", mode="before")
    @classmethod
    def _auto_or_bool(cls, value: object) -> object:
        if isinstance(value, bool) or value == "auto":
            return value
        raise ValueError(f"expedited_requeue must be auto, true or false, not {str(value)[:40]!r}")

    @field_validator("mem_gb")
    @classmethod
    def _mem_not_zero(cls, value: float | None) -> float | None:
        return check_mem_gb(value)

    @field_validator("partition", "account", "qos", "constraint")
    @classmethod
    def _slurm_word(cls, value: str | None) -> str | None:
        return check_slurm_word(value)

    @property
    def time_s(self) -> int:
        return parse_time_limit(self.time)

    @property
    def fewest_nodes(self) -> int:
        """``min_nodes``, or ``nodes`` when unset."""
        return self.nodes if self.min_nodes is None else self.min_nodes

    @property
    def heals(self) -> bool:
        """The batch step supervises its training steps and survives a lost node (healing/supervisor.py)."""
        return self.fewest_nodes < self.nodes or self.spare_nodes > 0

    @property
    def allocated_nodes(self) -> int:
        """Nodes asked of Slurm: the training nodes plus the spares."""
        return self.nodes + self.spare_nodes
