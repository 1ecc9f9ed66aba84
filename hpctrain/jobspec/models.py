"""The job spec: ``JobSpec`` assembles one typed, validated section model per YAML key.

Each section lives in its own module with its checks beside it
(``resources.py``, ``trainer.py``, ``data.py``, ``distributed.py``,
``checkpoint.py``, ``signals.py``, ``script.py``, ``health.py``,
``container.py``, ``after.py``; the base they share is ``section.py``). This module holds
the job's own top-level keys, the list of sections, and the values derived
from several of them. Adding a section is one field line here (and its
import): see the charter in ``hpctrain/jobspec/__init__.py``.

Every name a caller imports from here (``from hpctrain.jobspec.models import
Trainer``) still is: the sections are re-exported below.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator

from hpctrain.jobspec.after import After
from hpctrain.jobspec.batch import BatchLayout
from hpctrain.jobspec.checkpoint import Checkpoint
from hpctrain.jobspec.container import OWNED_CONTAINER_FLAGS, Container
from hpctrain.jobspec.data import MAX_IMAGE_PIXELS, Data, Decode
from hpctrain.jobspec.distributed import Distributed
from hpctrain.jobspec.fields import (
    ENTRYPOINT_PATTERN,
    NAME_PATTERN,
    EnvMap,
    SetupLines,
    SweepKey,
    SweepValues,
    safe_path,
)
from hpctrain.jobspec.health import BurnIn, Eviction, Health
from hpctrain.jobspec.resources import Resources
from hpctrain.jobspec.script import Script
from hpctrain.jobspec.section import Section
from hpctrain.jobspec.signals import Signals
from hpctrain.jobspec.strategy_traits import traits
from hpctrain.jobspec.tracking import Tracking
from hpctrain.jobspec.trainer import (
    APEX_LEVELS,
    ModelParallel,
    ParameterServer,
    Pipeline,
    Precision,
    Strategy,
    Trainer,
)

__all__ = [
    "APEX_LEVELS",
    "After",
    "MAX_IMAGE_PIXELS",
    "OWNED_CONTAINER_FLAGS",
    "BurnIn",
    "Checkpoint",
    "Container",
    "Data",
    "Decode",
    "Distributed",
    "Eviction",
    "Health",
    "JobSpec",
    "ModelParallel",
    "ParameterServer",
    "Pipeline",
    "Precision",
    "Resources",
    "Script",
    "Section",
    "Signals",
    "Strategy",
    "Trainer",
]


class JobSpec(Section):
    """A whole job: what to run, where, and with what resources."""

    name: Annotated[str, Field(pattern=NAME_PATTERN, description="Job name: letters, digits, _ . -")]
    cluster: Annotated[str, Field(description="Cluster profile; 'local' runs on this machine.")] = "local"
    output_dir: Annotated[str, Field(description="Runs go to OUTPUT_DIR/NAME/RUN_ID/.")] = "~/hpctrain-runs"
    entrypoint: Annotated[
        str | None, Field(description="'package.module:function' to call on every rank instead of the trainer.")
    ] = None
    entrypoint_args: Annotated[
        dict[str, object], Field(description="Keyword arguments for the entrypoint function.")
    ] = {}
    script: Annotated[
        Script | None,
        Field(description="Run your own training script on every rank or node (docs/scripts.md); not with entrypoint."),
    ] = None
    setup: Annotated[
        SetupLines, Field(description="Shell lines run before the tasks start, e.g. 'module load cuda'.")
    ] = []
    env: Annotated[EnvMap, Field(description="Environment variables for every task.")] = {}
    launcher: Annotated[
        Literal["srun", "torchrun"],
        Field(
            description="srun: one Slurm task per process; torchrun: one Slurm task per node that starts "
            "torchrun, which starts resources.tasks_per_node processes (docs/launchers.md)."
        ),
    ] = "srun"
    sweep: Annotated[
        dict[SweepKey, SweepValues],
        Field(description="Dotted key -> values; the grid becomes a Slurm array, one task per combination."),
    ] = {}
    study: Annotated[
        dict[str, list[object]],
        Field(
            description="Resource key -> values, e.g. {resources.nodes: [1, 2, 4]}; one Slurm job per combination "
            "(docs/studies-and-reports.md)."
        ),
    ] = {}
    # The sections, one line each (adding one: the charter in hpctrain/jobspec/__init__.py).
    resources: Resources = Resources()
    trainer: Trainer = Trainer()
    data: Data = Data()
    distributed: Distributed = Distributed()
    checkpoint: Checkpoint = Checkpoint()
    signals: Signals = Signals()
    health: Annotated[
        Health, Field(description="Burn-in, slow-node eviction and the bad-node ledger (docs/node-health.md).")
    ] = Health()
    container: Annotated[
        Container | None, Field(description="Run the tasks inside a container image (pyxis or Apptainer).")
    ] = None
    tracking: Annotated[
        Tracking, Field(description="W&B and MLflow runs, sent by 'hpctrain sync' (docs/tracking.md).")
    ] = Tracking()
    after: Annotated[
        After | None,
        Field(description="Start once another run has completed, ended or failed; {after.NAME} (docs/chains.md)."),
    ] = None

    @field_validator("output_dir")
    @classmethod
    def _output_path(cls, value: str) -> str:
        return safe_path(value) or value

    @field_validator("cluster")
    @classmethod
    def _cluster_word(cls, value: str) -> str:
        if not re.match(NAME_PATTERN, value):
            raise ValueError("cluster must be a profile name: letters, digits, _ . -")
        return value

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_form(cls, value: str | None) -> str | None:
        if value is not None and not re.match(ENTRYPOINT_PATTERN, value):
            raise ValueError("entrypoint must look like 'package.module:function'")
        return value

    # Derived values used by submission, the runtime and the docs.
    @property
    def tasks_per_node(self) -> int:
        if self.resources.tasks_per_node is not None:
            return self.resources.tasks_per_node
        gpus = self.resources.gpus_per_node or 0
        if self.runs_trainer and traits(self.trainer.strategy).tasks_per_node == "one":
            return 1
        return max(1, gpus)

    @property
    def runs_trainer(self) -> bool:
        """Whether the built-in trainer runs (no entrypoint, no script)."""
        return self.entrypoint is None and self.script is None

    @property
    def one_task_per_node(self) -> bool:
        """One Slurm task per node, which starts the node's processes itself (torchrun, or a script per node)."""
        return self.launcher == "torchrun" or (self.script is not None and self.script.per == "node")

    @property
    def slurm_tasks_per_node(self) -> int:
        """Slurm tasks per node: one per process, or one per node (``one_task_per_node``)."""
        return 1 if self.one_task_per_node else self.tasks_per_node

    @property
    def requeues(self) -> bool:
        """Whether the job may be requeued at all (``--requeue``, not ``--no-requeue``)."""
        return self.signals.requeue_on_timeout or self.signals.requeue_on_preemption

    @property
    def world_size(self) -> int:
        return self.resources.nodes * self.tasks_per_node

    @property
    def batch_layout(self) -> BatchLayout:
        gpus_per_task = (self.resources.gpus_per_node or 0) // self.tasks_per_node
        return BatchLayout.of(self.trainer, tasks=self.world_size, gpus_per_task=gpus_per_task)

    @property
    def global_batch_size(self) -> int:
        return self.batch_layout.global_batch

    @property
    def uses_gpus(self) -> bool:
        return bool(self.resources.gpus_per_node)

    @property
    def evicts(self) -> bool:
        """Slow nodes are evicted during training (``health.eviction``; auto: when the job can lose a node).
        Never from a script: it reports no compute times."""
        enabled = self.health.eviction.enabled
        if self.script is not None:
            return False
        return self.resources.heals if enabled == "auto" else bool(enabled)
