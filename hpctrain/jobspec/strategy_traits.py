"""What each ``trainer.strategy`` is, as data: the one table validation, the batch layout and tasks-per-node read.

A strategy's facts -- how many tasks a node runs, what one task's batch is
spread over, which processes load data, what hardware and launcher it
needs, what it refuses -- are stated once here; ``jobspec/load.py``'s
checks, :class:`~hpctrain.jobspec.batch.BatchLayout` and
``JobSpec.tasks_per_node`` ask the table instead of comparing names.
Torch-free (login nodes validate specs). The trainer's strategies
(``trainer/strategies/``) implement what the table promises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TasksPerNode = Literal["one", "per-gpu"]
# Which processes load a batch per step: every task; every hogwild worker of every task; every task but the
# parameter servers; one per pipeline (its stages share each batch).
DataProcesses = Literal["tasks", "hogwild-workers", "worker-tasks", "pipelines"]


@dataclass(frozen=True)
class StrategyTraits:
    tasks_per_node: TasksPerNode  # the default: one task driving the node, or one task per GPU
    tasks_per_node_fixed: bool = False  # resources.tasks_per_node may not differ from the default (on GPUs)
    batch_over_task_gpus: bool = False  # one task's batch is trainer.batch_size per GPU it drives (dp)
    data_processes: DataProcesses = "tasks"
    one_process: bool = False  # the whole job is one process
    one_node: bool = False  # its processes share memory on one node
    cpu_only: str = ""  # why it refuses GPUs ("trains on CPU"); empty when it does not
    needs_gpus: int = 0  # GPUs one task needs at least
    torchrun: bool = True  # torchrun can start it (False: one process per node, which srun starts directly)
    compiles: bool = True  # torch.compile works with it
    parallel_loss: bool = False  # trainer.dp_parallel_loss applies
    elastic: bool = False  # may resume on another number of ranks (several micro-batches per rank)
    refused: bool = False  # never runs here (jobspec/horovod.py says why)


STRATEGY_TRAITS: dict[str, StrategyTraits] = {
    "single": StrategyTraits("one", one_process=True, torchrun=False, elastic=True),
    "dp": StrategyTraits(
        "one", tasks_per_node_fixed=True, batch_over_task_gpus=True, torchrun=False, compiles=False, parallel_loss=True
    ),
    "ddp": StrategyTraits("per-gpu", tasks_per_node_fixed=True, elastic=True),
    "hogwild": StrategyTraits(
        "one", data_processes="hogwild-workers", one_node=True, cpu_only="trains on CPU", torchrun=False, compiles=False
    ),
    "ps": StrategyTraits("per-gpu", data_processes="worker-tasks", cpu_only="runs on CPU tasks"),
    "pipeline": StrategyTraits("per-gpu", data_processes="pipelines"),
    "model_parallel": StrategyTraits("one", needs_gpus=2),  # one task: layer_split.py checks its shape
    "horovod": StrategyTraits("per-gpu", refused=True),
}

ELASTIC_STRATEGIES = tuple(name for name, found in STRATEGY_TRAITS.items() if found.elastic)


def traits(strategy: str) -> StrategyTraits:
    """The traits of ``strategy`` (a name the spec model has already accepted)."""
    return STRATEGY_TRAITS[strategy]
