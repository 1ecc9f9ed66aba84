"""What ``submit --dry-run`` says about a script job's burn-in (launch/dry_run.py's ``burn_in_note``)."""

from __future__ import annotations

from typing import Any

from hpctrain.jobspec.models import JobSpec
from hpctrain.launch.dry_run import burn_in_note


def spec(nodes: int = 3, **sections: Any) -> JobSpec:
    data = {"name": "s", "resources": {"nodes": nodes}, "script": {"path": "t.py"}}
    return JobSpec.model_validate({**data, **sections})


def test_a_multi_node_script_job_says_every_start_probes_its_nodes() -> None:
    assert burn_in_note(spec(), local=False) == (
        "\n# burn-in: every start probes its 3 nodes before the script starts (up to 20 s; a sick node is taken "
        "out; health.burn_in.enabled: false turns it off; docs/node-health.md)\n"
    )


def test_torchrun_says_it_has_none_and_off_local_or_one_node_say_nothing() -> None:
    assert "none under launcher: torchrun" in burn_in_note(spec(launcher="torchrun"), local=False)
    assert burn_in_note(spec(health={"burn_in": {"enabled": False}}), local=False) == ""
    assert burn_in_note(spec(), local=True) == ""
    assert burn_in_note(spec(nodes=1), local=False) == ""
