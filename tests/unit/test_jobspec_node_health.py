"""The health: section (jobspec/models.py, node_health.py): ranges, and eviction only where a node can go."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.errors import SpecError
from hpctrain.jobspec.load import load_job

pytestmark = pytest.mark.usefixtures("isolated")

SPEC = """\
name: h
cluster: slurm
data: {{root: /datasets/x}}
resources: {{nodes: 3, tasks_per_node: 1, gpus_per_node: 0, partition: debug, {resources}}}
health: {health}
"""


def load(tmp_path: Path, resources: str, health: str):  # noqa: ANN201
    path = tmp_path / "job.yaml"
    path.write_text(SPEC.format(resources=resources, health=health))
    return load_job(path)


def test_defaults_burn_in_on_eviction_only_where_the_job_can_lose_a_node(tmp_path: Path) -> None:
    plain = load(tmp_path, "time: '01:00:00'", "{}").spec
    assert plain.health.burn_in.enabled and plain.health.burn_in.budget_s == 20 and not plain.evicts
    assert load(tmp_path, "spare_nodes: 1", "{}").spec.evicts
    assert load(tmp_path, "min_nodes: 1", "{}").spec.evicts
    assert not load(tmp_path, "spare_nodes: 1", "{eviction: {enabled: false}}").spec.evicts


def test_eviction_without_a_node_to_spare_is_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load(tmp_path, "time: '01:00:00'", "{eviction: {enabled: true}}")
    [problem] = caught.value.problems
    assert problem.key == "health.eviction.enabled" and "resources.spare_nodes: 1" in problem.message


@pytest.mark.parametrize(
    "health, key",
    [
        ("{burn_in: {budget_s: 1}}", "health.burn_in.budget_s"),
        ("{burn_in: {margin: 1.0}}", "health.burn_in.margin"),
        ("{burn_in: {margin: .nan}}", "health.burn_in.margin"),
        ("{burn_in: {network_margin: 1.0}}", "health.burn_in.network_margin"),
        ("{burn_in: {network_margin: .inf}}", "health.burn_in.network_margin"),
        ("{eviction: {window_s: 1}}", "health.eviction.window_s"),
        ("{eviction: {enabled: maybe}}", "health.eviction.enabled"),
        ("{ledger_days: -1}", "health.ledger_days"),
        ("{burn_in: {typo: 1}}", "health.burn_in.typo"),
        ("{burn_in: {budget_s: 2000}}", "health.burn_in.budget_s"),
    ],
)
def test_keys_out_of_range_name_the_key(tmp_path: Path, health: str, key: str) -> None:
    with pytest.raises(SpecError) as caught:
        load(tmp_path, "time: '00:30:00'", health)
    assert key in {p.key for p in caught.value.problems}, caught.value.problems
