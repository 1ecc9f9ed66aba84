"""The strategy table: every strategy the spec accepts has its traits, and the spec's derived values follow them."""

from __future__ import annotations

from typing import get_args

import pytest

from hpctrain.jobspec.batch import BatchLayout
from hpctrain.jobspec.models import JobSpec, Strategy
from hpctrain.jobspec.strategy_traits import ELASTIC_STRATEGIES, STRATEGY_TRAITS, traits


def test_every_strategy_of_the_spec_has_traits() -> None:
    assert set(STRATEGY_TRAITS) == set(get_args(Strategy))
    assert set(ELASTIC_STRATEGIES) == {"ddp", "single"}


@pytest.mark.parametrize("strategy", sorted(STRATEGY_TRAITS))
def test_tasks_per_node_follows_the_table(strategy: str) -> None:
    spec = JobSpec.model_validate(
        {"name": "t", "cluster": "local", "resources": {"gpus_per_node": 4}, "trainer": {"strategy": strategy}}
    )
    assert spec.tasks_per_node == (1 if traits(strategy).tasks_per_node == "one" else 4)


def test_the_batch_layout_reads_the_table() -> None:
    trainer = JobSpec.model_validate({"name": "t", "cluster": "local", "trainer": {"strategy": "dp"}}).trainer
    assert (
        traits("dp").batch_over_task_gpus and BatchLayout.of(trainer, tasks=2, gpus_per_task=4).devices_per_process == 4
    )
    ddp = trainer.model_copy(update={"strategy": "ddp"})
    assert BatchLayout.of(ddp, tasks=2, gpus_per_task=4).devices_per_process == 1
    assert [name for name, found in STRATEGY_TRAITS.items() if found.cpu_only] == ["hogwild", "ps"]
    assert [name for name, found in STRATEGY_TRAITS.items() if found.refused] == ["horovod"]
