"""The burn-in under ``launcher: torchrun``: the node tasks probe their nodes before torchrun starts
(programs/torchrun_node.py over healing/script_burn_in.py), and torchrun's ranks run none of their own.
The child is faked at the subprocess boundary; the probes run on the Slurm test cluster
(tests/slurm/test_torchrun_burn_in_e2e.py)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from hpctrain.healing import script_burn_in
from hpctrain.healing.script_burn_in import REQUEUED_EXIT, due
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.node_health import BURN_IN_VAR, STEP_ID_VAR, burn_in_applies
from hpctrain.launch.dry_run import burn_in_note
from hpctrain.programs import torchrun_node
from hpctrain.programs.torchrun_node import RecordedStop, TorchrunNodeLauncher, worker_environ
from hpctrain.runtime.task_env import derive_task_env


def spec(**sections: Any) -> JobSpec:
    data: dict[str, Any] = {"name": "t", "launcher": "torchrun", "resources": {"nodes": 3, "tasks_per_node": 2}}
    return JobSpec.model_validate({**data, **sections})


def node_task_env(node: int) -> dict[str, str]:
    """The environment of node ``node``'s task in a 3-node torchrun job (one Slurm task per node)."""
    return {
        "SLURM_JOB_ID": "1234",
        "SLURM_PROCID": str(node),
        "SLURM_NTASKS": "3",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": str(node),
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_JOB_NODELIST": "n[1-3]",
        "SLURM_TASKS_PER_NODE": "1(x3)",
    }


class FakeChild:
    """The burn-in's child: ends with ``status`` at its second poll."""

    def __init__(self, status: int) -> None:
        self.status, self.polls = status, 2
        self.stdin = io.BytesIO()
        self.argv: list[str] = []

    def poll(self) -> int | None:
        self.polls -= 1
        return self.status if self.polls <= 0 else None


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A node task's burn-in with a fake child; what it started, the exits it asked for, the counted signals."""
    seen: dict[str, Any] = {"children": [], "exits": [], "counts": {}, "status": 0}
    monkeypatch.setattr(script_burn_in, "POLL_S", 0.0)
    monkeypatch.delenv(BURN_IN_VAR, raising=False)
    monkeypatch.delenv(STEP_ID_VAR, raising=False)
    monkeypatch.setattr(torchrun_node.stop_signals, "recorded", lambda: dict(seen["counts"]))
    monkeypatch.setattr(torchrun_node, "_exit_at_once", seen["exits"].append)

    def start(argv: list[str], **kwargs: Any) -> FakeChild:
        child = FakeChild(seen["status"])
        child.argv = argv
        seen["children"].append(child)
        return child

    real = script_burn_in.before_script
    monkeypatch.setattr(script_burn_in, "before_script", lambda *a, **k: real(*a, **k, start=start))
    return seen


def run_node(seen: dict[str, Any], monkeypatch: pytest.MonkeyPatch, the_spec: JobSpec) -> None:
    for key, value in node_task_env(0).items():
        monkeypatch.setenv(key, value)
    env = derive_task_env(node_task_env(0))
    TorchrunNodeLauncher(the_spec.model_dump(mode="json"), "/runs/r").burn_in(the_spec, env)


def test_a_multi_node_torchrun_job_has_the_burn_in_and_its_node_task_runs_it() -> None:
    assert burn_in_applies(spec(), 3)
    assert not burn_in_applies(spec(), 1)
    assert not burn_in_applies(spec(health={"burn_in": {"enabled": False}}), 3)
    assert due(spec(), derive_task_env(node_task_env(1)), {})  # one member per node: the node task


def test_torchruns_ranks_are_told_the_burn_in_is_done() -> None:
    """Each rank would otherwise probe again inside torchrun's group (the trainer's) or start a child (a script's)."""
    child = worker_environ(node_task_env(0), tasks_per_node=2)
    assert child[BURN_IN_VAR] == "off"
    torchrun_vars = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}
    rank = derive_task_env({**child, **torchrun_vars, "MASTER_ADDR": "n1", "MASTER_PORT": "29500"})
    assert not due(spec(script={"path": "t.py"}), rank, child)


def test_the_node_task_probes_before_torchrun_on_a_port_of_its_own(
    node: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_node(node, monkeypatch, spec())
    (child,) = node["children"]
    assert child.argv[-3:-1] == ["hpctrain.healing.script_burn_in", "/runs/r"] and node["exits"] == []  # train
    env = derive_task_env(node_task_env(0))
    assert int(child.argv[-1]) != env.master_port  # never torchrun's rendezvous port


def test_a_requeue_without_the_flagged_node_ends_the_node_task_without_a_result(
    node: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    node["status"] = REQUEUED_EXIT
    run_node(node, monkeypatch, spec())
    assert node["exits"] == [0]  # the exit protocol of requeue.py: no result, torchrun never started


def test_a_stop_before_the_burn_in_skips_it(node: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    node["counts"] = {"USR2": 1}
    run_node(node, monkeypatch, spec())
    assert node["children"] == [] and node["exits"] == []  # torchrun's ranks get the signal and stop


def test_the_node_tasks_stop_flag_is_what_its_handlers_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    counts: dict[str, int] = {}
    monkeypatch.setattr(torchrun_node.stop_signals, "recorded", lambda: dict(counts))
    stop = RecordedStop("USR2")
    assert stop.local_reason is None
    counts["USR1"] = 1  # not this job's time-limit signal
    assert stop.local_reason is None
    counts["USR2"] = 1
    assert stop.local_reason == "timeout"
    counts["TERM"] = 1
    assert stop.local_reason == "preempted"


def test_a_burn_in_that_cannot_run_is_said_in_torchruns_words(
    node: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    node["status"] = 1
    run_node(node, monkeypatch, spec())
    assert node["exits"] == []
    assert "hpctrain: node n1: the burn-in failed (exit status 1; its lines above say why); torchrun starts " in (
        capsys.readouterr().err
    )


def test_dry_run_says_the_burn_in_happens_under_torchrun_too(tmp_path: Path) -> None:
    assert burn_in_note(spec(), local=False) == (
        "\n# burn-in: every start probes its 3 nodes before torchrun starts (each node task probes its node) "
        "(up to 20 s; a sick node is taken out while its partition can spare it; health.burn_in.enabled: false "
        "turns it off; docs/node-health.md)\n"
    )
    assert "before training starts" in burn_in_note(spec(launcher="srun"), local=False)
    assert burn_in_note(spec(), local=True) == ""


# -- one process per node probes every GPU of it ---------------------------------------------------------------
def test_a_nodes_only_process_probes_every_gpu_of_the_node_its_own_first() -> None:
    import torch

    from hpctrain.healing.probes import node_devices

    cuda = [torch.device("cuda", i) for i in range(4)]
    assert node_devices(cuda[0], processes_on_node=1, device_count=4) == cuda  # a torchrun node task
    assert node_devices(cuda[2], processes_on_node=1, device_count=4) == [cuda[2], cuda[0], cuda[1], cuda[3]]
    assert node_devices(cuda[1], processes_on_node=4, device_count=4) == [cuda[1]]  # srun: one rank per GPU
    assert node_devices(cuda[0], processes_on_node=1, device_count=1) == [cuda[0]]
    assert node_devices(torch.device("cpu"), processes_on_node=1, device_count=1) == [torch.device("cpu")]


def test_a_pass_on_every_device_starts_each_before_it_waits_for_any(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from hpctrain.healing import probes

    events: list[str] = []
    monkeypatch.setattr(probes, "_sync", lambda device: events.append(f"sync {device}"))
    devices = [torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cuda", 2)]
    works = [lambda batch, i=i: events.append(f"run {i} x{batch}") for i in range(3)]
    probes.on_every_device(works, devices)(4)
    # compute_probe syncs devices[0] itself after the pass
    assert events == ["run 0 x4", "run 1 x4", "run 2 x4", "sync cuda:1", "sync cuda:2"]
    assert probes.on_every_device(works[:1], devices[:1]) is works[0]  # one device: its workload as it is


def test_a_stop_during_the_burn_in_lets_it_end_then_torchrun_starts_and_its_ranks_stop(
    node: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its verdict counts (node task 0 may have requeued the job); what was counted goes on to the ranks."""
    calls = {"n": 0}

    def recorded() -> dict[str, int]:
        calls["n"] += 1
        return {"TERM": 1} if calls["n"] > 1 else {}  # the signal comes once the child runs

    monkeypatch.setattr(torchrun_node.stop_signals, "recorded", recorded)
    run_node(node, monkeypatch, spec())
    assert len(node["children"]) == 1 and node["exits"] == []
    assert "hpctrain: node n1: stop (preempted) during the burn-in: it ends first (within 30 s); torchrun starts " in (
        capsys.readouterr().err
    )
