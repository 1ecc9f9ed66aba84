"""The burn-in of a ``script:`` job (healing/script_burn_in.py): when it runs, what the wrapper does with its
child's verdict, a stop while it probes, torch missing. The child is faked at the subprocess boundary only;
the probes themselves run on the Slurm test cluster (tests/slurm/test_node_loss_e2e.py)."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hpctrain.healing import script_burn_in
from hpctrain.healing.script_burn_in import REQUEUED_EXIT, before_script, due, outcome
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.node_health import BURN_IN_EXIT, BURN_IN_VAR, STEP_ID_VAR
from hpctrain.runtime.context import TaskEnv
from hpctrain.runtime.master import PORT_RANGE_END, PORT_RANGE_START, burn_in_port, derive_master_port
from hpctrain.runtime.stop import StopRequest

ENV = TaskEnv(0, 6, 0, 2, 0, 3, ("n1", "n2", "n3"), "n1", 21000, "41", 0, "slurm")


def spec(**sections: Any) -> JobSpec:
    data: dict[str, Any] = {"name": "s", "resources": {"nodes": 3, "tasks_per_node": 2}, "script": {"path": "t.py"}}
    return JobSpec.model_validate({**data, **sections})


class FakeChild:
    """The child process: its exit status after ``polls`` polls (None: never ends by itself)."""

    def __init__(self, status: int | None, polls: int = 2) -> None:
        self.status, self.polls, self.killed = status, polls, False
        self.stdin = io.BytesIO()
        self.stdin.close = lambda: None  # type: ignore[method-assign]  # keep what was written readable
        self.argv: list[str] = []
        self.env: dict[str, str] = {}

    def poll(self) -> int | None:
        if self.killed:
            return -9
        self.polls -= 1
        return self.status if self.polls <= 0 else None

    def kill(self) -> None:
        self.killed = True

    def wait(self) -> int:
        return -9


@pytest.fixture(autouse=True)
def run_dir(tmp_path: Path) -> Path:
    RUN_DIR[0] = str(tmp_path)
    return tmp_path


RUN_DIR = ["/runs/r"]


def run(  # noqa: ANN201
    child: FakeChild,
    monkeypatch: pytest.MonkeyPatch,
    stop: StopRequest | None = None,
    env: TaskEnv = ENV,
    **sections: Any,
):
    """``before_script`` with ``child`` as the subprocess; (its outcome, exit statuses asked for, lines said)."""
    monkeypatch.setattr(script_burn_in, "POLL_S", 0.0)
    monkeypatch.delenv(BURN_IN_VAR, raising=False)
    monkeypatch.delenv(STEP_ID_VAR, raising=False)
    exits: list[int] = []
    said: list[str] = []

    def start(argv: list[str], **kwargs: Any) -> FakeChild:
        child.argv, child.env = argv, kwargs["env"]
        return child

    found = before_script(
        spec(**sections), env, RUN_DIR[0], stop or StopRequest(), exit_process=exits.append, say=said.append,
        start=start,  # type: ignore[arg-type]
    )  # fmt: skip
    return found, exits, said


def test_it_runs_on_every_multi_node_srun_start_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert due(spec(), ENV, {})
    assert not due(spec(), ENV, {BURN_IN_VAR: "off"})  # the supervisor kept a flagged node
    assert not due(spec(health={"burn_in": {"enabled": False}}), ENV, {})
    assert not due(spec(launcher="torchrun"), replace(ENV, source="slurm-torchrun"), {BURN_IN_VAR: "off"})  # ranks
    assert not due(spec(), replace(ENV, num_nodes=1, hostnames=("n1",)), {})  # nothing to compare with
    assert not due(spec(), replace(ENV, source="submitit-local"), {})  # --local: one machine


def test_each_child_status_means_one_thing() -> None:
    assert [outcome(code) for code in (0, BURN_IN_EXIT, REQUEUED_EXIT, 1, -9)] == [
        "train",
        "supervisor",
        "requeued",
        "failed",
        "failed",
    ]


def test_nobody_flagged_lets_the_script_start(monkeypatch: pytest.MonkeyPatch) -> None:
    child = FakeChild(0)
    found, exits, said = run(child, monkeypatch)
    assert (found, exits, said) == ("train", [], [])
    assert json.loads(child.stdin.getvalue())["script"]["path"] == "t.py"  # the step's spec, on its stdin
    assert child.argv[-5:] == ["-m", "hpctrain.healing.script_burn_in", RUN_DIR[0], child.argv[-2], "node"]
    port = int(child.argv[-2])
    assert port != ENV.master_port and PORT_RANGE_START <= port < PORT_RANGE_END  # never the script's rendezvous
    assert child.argv[:2] == ["/bin/sh", "-c"] and 'trap "" USR2 TERM INT;' in child.argv[2]  # as the script
    assert child.env["PYTHONUNBUFFERED"] == "1"


def test_a_healing_job_leaves_the_decision_to_the_supervisor(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(FakeChild(BURN_IN_EXIT), monkeypatch)[:2] == ("supervisor", [BURN_IN_EXIT])


def test_a_job_rank_0_requeued_without_the_node_leaves_without_a_result(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(FakeChild(REQUEUED_EXIT), monkeypatch)[:2] == ("requeued", [0])


def test_a_burn_in_that_cannot_run_is_said_and_the_script_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    found, exits, said = run(FakeChild(1), monkeypatch)
    assert (found, exits) == ("failed", [])
    assert said == ["the burn-in failed (exit status 1; its lines above say why); the script starts without it"]


def test_a_stop_while_it_probes_lets_its_verdict_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 requeued the job without a node: the requeue's own SIGTERM must not undo that."""
    stop = StopRequest()
    stop.request("preempted")
    child = FakeChild(REQUEUED_EXIT, polls=3)
    found, exits, said = run(child, monkeypatch, stop)
    assert (found, exits, child.killed) == ("requeued", [0], False)
    assert said == ["stop (preempted) during the burn-in: it ends first (within 30 s); the script is not started"]


def test_a_burn_in_still_running_after_a_stop_is_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer saw the stop first and never joined: the child would wait for it until the collective timeout."""
    monkeypatch.setattr(script_burn_in, "STOP_MARGIN_S", -20.0)  # the 20 s budget is spent at once
    stop = StopRequest()
    stop.request("timeout")
    child = FakeChild(None)
    found, exits, said = run(child, monkeypatch, stop)
    assert (found, exits, child.killed) == ("stopped", [], True)  # the wrapper's stop path takes it from here
    assert said[-1] == "the burn-in did not end in time after the stop: ended"


def test_without_torch_a_gpu_script_has_no_burn_in_and_a_cpu_script_has_its_plain_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(script_burn_in.importlib.util, "find_spec", lambda name: None)
    child = FakeChild(0)
    found, exits, said = run(child, monkeypatch, resources={"nodes": 3, "tasks_per_node": 2, "gpus_per_node": 2})
    assert (found, exits, child.argv) == (None, [], [])
    [line] = said
    assert line.startswith("no burn-in: torch is not installed in ") and "the script starts without one" in line
    child = FakeChild(0)
    assert run(child, monkeypatch)[0] == "train" and script_burn_in.MODULE in child.argv


def test_turned_off_it_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    child = FakeChild(0)
    assert run(child, monkeypatch, health={"burn_in": {"enabled": False}})[0] is None and child.argv == []


def test_the_burn_in_port_is_per_step_and_never_the_masters() -> None:
    assert burn_in_port(21000, "41.0") == burn_in_port(21000, "41.0")  # every task computes the same
    assert burn_in_port(21000, "41.0.1") != burn_in_port(21000, "41.0.2")  # a relaunch: a fresh port
    clash = derive_master_port("41.0.burn-in")
    moved = burn_in_port(clash, "41.0")
    assert moved != clash and PORT_RANGE_START <= moved < PORT_RANGE_END


def test_a_script_probes_with_the_matrix_product_not_the_trainers_default_model() -> None:
    torch = pytest.importorskip("torch")
    from hpctrain.healing.probes import MATMUL_MAX_BATCH, compute_workload

    work, largest = compute_workload(spec(), torch.device("cpu"))
    assert largest == MATMUL_MAX_BATCH
    work(2)  # a pass runs


def test_the_scripts_summary_keeps_the_burn_in_records(tmp_path: Path) -> None:
    from hpctrain.contract.summary import read_summary, write_summary
    from hpctrain.runtime.script.outcome import ScriptSummary

    write_summary(tmp_path, {"status": "running", "burn_in": [{"nodes": ["n1", "n2"], "flagged": []}]})
    ScriptSummary(tmp_path, {"name": "s"}, enabled=True).write("completed")
    summary = read_summary(tmp_path)
    assert (
        summary is not None
        and summary.status == "completed"
        and summary.burn_in == [{"nodes": ["n1", "n2"], "flagged": []}]
    )


def test_a_cpu_nodes_first_task_probes_for_the_node_and_tells_its_other_tasks(
    monkeypatch: pytest.MonkeyPatch, run_dir: Path
) -> None:
    """Two tasks on a node would import torch twice on the same cores for the same numbers."""
    assert script_burn_in.node_prober(spec(), ENV)
    assert not script_burn_in.node_prober(spec(resources={"nodes": 3, "tasks_per_node": 2, "gpus_per_node": 2}), ENV)
    assert not script_burn_in.node_prober(spec(), replace(ENV, local_world_size=1))  # per: node, torchrun
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    first = FakeChild(REQUEUED_EXIT)
    assert run(first, monkeypatch)[:2] == ("requeued", [0])
    assert first.argv[-1] == "node" and first.env["OMP_NUM_THREADS"] == "6"  # both tasks' cores
    other = FakeChild(0)
    found, exits, said = run(other, monkeypatch, env=replace(ENV, global_rank=1, local_rank=1))
    assert (found, exits, said, other.argv) == ("requeued", [0], [], [])  # the first task's verdict; no child
    [verdict] = (run_dir / ".hpctrain" / "burn-in-verdicts").iterdir()
    assert verdict.name == "41.0-node0" and verdict.read_text() == "requeued"


def test_a_gpu_job_keeps_one_child_per_rank(monkeypatch: pytest.MonkeyPatch, run_dir: Path) -> None:
    child = FakeChild(0)
    other = replace(ENV, global_rank=1, local_rank=1)
    assert (
        run(child, monkeypatch, env=other, resources={"nodes": 3, "tasks_per_node": 2, "gpus_per_node": 2})[0]
        == "train"
    )
    assert child.argv[-1] != "node" and not (run_dir / ".hpctrain").exists()


def test_a_nodes_other_task_stopped_waits_as_the_child_would_then_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(script_burn_in, "STOP_MARGIN_S", -20.0)  # the 20 s budget is spent at once
    stop = StopRequest()
    stop.request("timeout")
    found, exits, said = run(FakeChild(0), monkeypatch, stop, env=replace(ENV, global_rank=1, local_rank=1))
    assert (found, exits) == ("stopped", [])
    assert said[-1] == "the burn-in did not end in time after the stop"


def test_a_nodes_member_is_its_node_in_a_group_of_nodes() -> None:
    member = script_burn_in.node_member(replace(ENV, global_rank=3, local_rank=1, node_rank=1))
    assert (member.global_rank, member.world_size, member.local_rank, member.local_world_size) == (1, 3, 0, 1)
    assert member.hostnames == ENV.hostnames and member.master_addr == ENV.master_addr


def test_a_verdict_that_is_not_a_small_regular_file_is_no_verdict(
    monkeypatch: pytest.MonkeyPatch, run_dir: Path
) -> None:
    """The node's other tasks read what lies at the verdict's path: a link or a blob there tells them nothing
    (they wait out their bound and start without one), never what it points at nor a megabyte read."""
    monkeypatch.setattr(script_burn_in, "STOP_MARGIN_S", -10_000.0)  # the bound is spent at once
    verdict = script_burn_in.burn_in_verdict_path(run_dir, "41.0", 0)
    verdict.parent.mkdir(parents=True)
    (run_dir / "elsewhere").write_text("requeued")
    verdict.symlink_to(run_dir / "elsewhere")
    said: list[str] = []
    assert script_burn_in.follow(verdict, spec(), StopRequest(), say=said.append, after_stop="") == "failed"
    verdict.unlink()
    verdict.write_text("requeued" + " " * 100_000)
    assert script_burn_in.follow(verdict, spec(), StopRequest(), say=said.append, after_stop="") == "failed"
    verdict.write_text("requeued")
    assert script_burn_in.follow(verdict, spec(), StopRequest(), say=said.append, after_stop="") == "requeued"
