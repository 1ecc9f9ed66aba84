"""Healing from a lost node inside the allocation: the spec keys, the sbatch script, the pure
decisions (which node to blame, what next, a crash loop), and what the tasks and summary make of it."""

from __future__ import annotations

import ast
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from hpctrain.contract.srun_report import TaskFailure
from hpctrain.contract.summary import read_summary, write_summary
from hpctrain.errors import DistributedSetupError, SpecError
from hpctrain.healing import decide as healing
from hpctrain.healing.decide import Blame, Decision, Situation, StepOutcome
from hpctrain.jobspec import node_loss
from hpctrain.jobspec.load import load_job
from hpctrain.jobspec.models import JobSpec
from hpctrain.launch.submission import render_script
from hpctrain.trainer.reporting import Reporter

REPO = Path(__file__).resolve().parents[2]

SPEC = """\
name: heal
cluster: slurm
data: {{root: /datasets/x}}
resources: {{nodes: 3, tasks_per_node: 2, gpus_per_node: 0, partition: debug, {resources}}}
trainer: {{strategy: {strategy}, batch_size: 4}}
"""


pytestmark = pytest.mark.usefixtures("isolated")


def load(tmp_path: Path, resources: str, strategy: str = "ddp") -> Any:
    path = tmp_path / "job.yaml"
    path.write_text(SPEC.format(resources=resources, strategy=strategy))
    return load_job(path)


def problems(tmp_path: Path, resources: str, strategy: str = "ddp") -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        load(tmp_path, resources, strategy)
    return {p.key: p.message for p in caught.value.problems}


# -- spec --------------------------------------------------------------------------------------------------------
def test_defaults_keep_todays_behaviour(tmp_path: Path) -> None:
    spec = load(tmp_path, "cpus_per_task: 1").spec
    assert spec.resources.fewest_nodes == 3 and spec.resources.spare_nodes == 0
    assert not spec.resources.heals
    assert spec.signals.crash_loop_attempts == 3


def test_min_nodes_above_nodes_is_a_spec_error(tmp_path: Path) -> None:
    found = problems(tmp_path, "min_nodes: 4")
    assert "more than resources.nodes (3)" in found["resources.min_nodes"]


def test_negative_spares_are_a_spec_error(tmp_path: Path) -> None:
    assert "greater than or equal to 0" in problems(tmp_path, "spare_nodes: -1")["resources.spare_nodes"]


@pytest.mark.parametrize("strategy", ["dp", "hogwild"])
def test_min_nodes_with_a_one_task_strategy_is_a_spec_error(tmp_path: Path, strategy: str) -> None:
    message = problems(tmp_path, "min_nodes: 1", strategy)["resources.min_nodes"]
    assert f"strategy {strategy} cannot continue on fewer nodes" in message


def test_min_nodes_need_not_divide_the_global_batch(tmp_path: Path) -> None:
    # 6 micro-batches on 2 nodes' 4 ranks: whole ones and pieces (jobspec/shares.py); refused before issue 29
    spec = load(tmp_path, "min_nodes: 2").spec
    assert spec.resources.fewest_nodes == 2
    assert [count for count in range(1, 4) if healing.batch_fits(spec, count)] == [1, 2, 3]
    assert node_loss.fewest_nodes_step_cost(spec) == 1.5  # one whole micro-batch and half of another per rank
    assert node_loss.fewest_nodes_step_cost(load(tmp_path, "spare_nodes: 1").spec) is None


@pytest.mark.parametrize("spares", [4, 4096])
def test_more_spares_than_training_nodes_is_a_spec_error(tmp_path: Path, spares: int) -> None:
    message = problems(tmp_path, f"spare_nodes: {spares}")["resources.spare_nodes"]
    assert f"{spares} spares for 3 training nodes" in message and "at most 3" in message


def test_both_mistakes_are_named_at_once(tmp_path: Path) -> None:
    assert set(problems(tmp_path, "min_nodes: 4, spare_nodes: 9")) == {"resources.min_nodes", "resources.spare_nodes"}


def test_summaries_name_the_spares_and_the_minimum_the_script_asks_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpctrain.cli.main import main
    from hpctrain.launch.dry_run import dry_run

    (tmp_path / "job.yaml").write_text(SPEC.format(resources="spare_nodes: 2, min_nodes: 1", strategy="ddp"))
    assert main(["validate", str(tmp_path / "job.yaml")]) == 0
    line = capsys.readouterr().out
    assert "3 nodes + 2 spares (5 allocated; continues on as few as 1 after a lost node) x 2 CPU tasks" in line
    text = dry_run(load_job(tmp_path / "job.yaml")).text
    assert "#SBATCH --nodes=5" in text
    assert "# nodes: 3 nodes + 2 spares (5 allocated; continues on as few as 1 after a lost node)" in text
    plain = load(tmp_path, "cpus_per_task: 1")
    assert node_loss.node_count_text(plain.spec.resources) == "3 nodes" and "# nodes:" not in dry_run(plain).text


def test_spares_fit_any_strategy_shape(tmp_path: Path) -> None:
    spec = load(tmp_path, "spare_nodes: 1").spec
    assert spec.resources.heals and spec.resources.allocated_nodes == 4


def test_a_torchrun_job_may_heal_and_its_supervisor_starts_one_node_task_per_node(tmp_path: Path) -> None:
    """Refused before issue 42 ("launcher: torchrun cannot heal from a lost node yet"); the supervisor's srun
    line for it has one Slurm task per node (torchrun's node task), the ranks' failures in its report."""
    path = tmp_path / "job.yaml"
    path.write_text(SPEC.format(resources="spare_nodes: 1, min_nodes: 2", strategy="ddp") + "launcher: torchrun\n")
    job = load_job(path)
    assert job.spec.resources.heals and job.spec.slurm_tasks_per_node == 1
    assert "hpctrain.healing.supervisor" in render_script(job, Path("/runs/X"))


# -- the sbatch script -------------------------------------------------------------------------------------------
def test_a_healing_job_asks_for_the_spares_with_no_kill_and_runs_the_supervisor(tmp_path: Path) -> None:
    job = load(tmp_path, "min_nodes: 1, spare_nodes: 1")
    script = render_script(job, Path("/runs/X"))
    assert "#SBATCH --nodes=4" in script and "#SBATCH --no-kill" in script
    command = script.split("# command\n", 1)[1].splitlines()[1]
    supervisor = f"exec {shlex.quote(sys.executable)} -m hpctrain.runtime.stop_signals "
    supervisor += "hpctrain.healing.supervisor /runs/X -- srun "
    assert command.startswith(supervisor)
    assert "--kill-on-bad-exit=1" in command and command.endswith("/runs/X/submitit")


def test_the_submitting_executor_writes_what_dry_run_prints_for_a_healing_job(tmp_path: Path) -> None:
    from hpctrain.launch.submission import build_executor

    job = load(tmp_path, "spare_nodes: 1")
    executor = build_executor(job, "slurm", Path("/runs/X"))
    submitted = executor._make_submission_file_text(executor._submitit_command_str, "uid")  # type: ignore[attr-defined]
    assert submitted == render_script(job, Path("/runs/X")) and "hpctrain.healing.supervisor" in submitted


def test_a_default_job_has_neither(tmp_path: Path) -> None:
    script = render_script(load(tmp_path, "cpus_per_task: 1"), Path("/runs/X"))
    assert "--no-kill" not in script and "supervisor" not in script and "#SBATCH --nodes=3" in script


# -- blame -------------------------------------------------------------------------------------------------------
NODES = ("n1", "n2", "n3")


def test_a_lost_node_is_blamed_before_the_ranks_that_failed_because_of_it() -> None:
    outcome = StepOutcome(
        NODES,
        task_failures=(TaskFailure(0, "n1", "Exited with exit code 1"),),
        lost_nodes={"n2": "its slurmd does not answer"},
    )
    assert healing.blame(outcome) == Blame("n2", "its slurmd does not answer")


@pytest.mark.parametrize("reason", ["Killed", "Exited with exit code 137", "Segmentation fault"])
def test_a_rank_killed_first_blames_its_node(reason: str) -> None:
    outcome = StepOutcome(NODES, task_failures=(TaskFailure(3, "n2", reason), TaskFailure(0, "n1", "Killed")))
    assert healing.blame(outcome).node == "n2"  # type: ignore[union-attr]


def test_a_rank_that_raised_blames_no_node() -> None:
    outcome = StepOutcome(NODES, exit_code=1, task_failures=(TaskFailure(2, "n2", "Exited with exit code 1"),))
    assert healing.blame(outcome) is None


def test_a_hung_rank_blames_its_node_then_a_silent_node() -> None:
    frozen = healing.HungRank(4, "n3", phase="forward_backward", step=5, frozen_s=40.2)
    hung = StepOutcome(NODES, hung=frozen, silent_nodes=frozenset({"n2"}))
    assert healing.blame(hung) == Blame(
        "n3", "rank 4 hung in phase forward_backward at step 5 (its process froze: heartbeat silent 40 s)"
    )
    waiting = healing.HungRank(1, "n1", phase="data", step=7)
    expected = Blame("n1", "rank 1 hung in phase data at step 7 (no progress)")
    assert healing.blame(StepOutcome(NODES, hung=waiting)) == expected
    assert healing.blame(StepOutcome(NODES, silent_nodes=frozenset({"n2"}))).node == "n2"  # type: ignore[union-attr]


def test_srun_node_failures_and_bad_node_states_are_read() -> None:
    text = "srun: error: n1: task 0: Exited with exit code 1\nsrun: error: Node failure on n2\n"
    assert healing.node_failures_in(text) == ["n2"]
    assert [s for s in ("down*", "idle*", "drained", "allocated", "mixed", "idle") if healing.bad_node_state(s)] == [
        "down*",
        "idle*",
        "drained",
    ]


# -- decide ------------------------------------------------------------------------------------------------------
def situation(
    found: Blame | list[Blame], *, min_nodes: int = 3, allocation: tuple[str, ...] = (*NODES, "n4"), **kw: Any
) -> Situation:
    args: dict[str, Any] = dict(
        step_nodes=NODES, allocation=allocation, excluded=(), batch_node="n1", nodes=3, min_nodes=min_nodes
    )
    args.update(kw)
    blamed = (found,) if isinstance(found, Blame) else tuple(found)
    return Situation(blamed=blamed, fits=args.pop("fits", lambda n: True), **args)


def decide(found: Blame | list[Blame], **kw: Any) -> Decision:
    return healing.decide(situation(found, **kw))


def test_a_lost_node_is_replaced_by_a_spare() -> None:
    decision = decide(Blame("n2", "gone"))
    assert decision.action == "swap" and decision.nodes == ("n1", "n3", "n4") and decision.excluded == ("n2",)


def test_without_a_spare_the_run_shrinks_to_a_count_its_batch_fits() -> None:
    decision = decide(Blame("n2", "gone"), min_nodes=1, allocation=NODES, fits=lambda n: n != 2)
    assert decision.action == "drop" and decision.nodes == ("n1",)


def test_below_min_nodes_or_the_batch_node_lost_requeues() -> None:
    below = decide(Blame("n2", "gone"), allocation=NODES)
    assert below.action == "requeue" and "2 healthy nodes left, min_nodes is 3" in below.why
    batch = decide(Blame("n1", "rank 0 killed"))
    assert batch.action == "requeue" and batch.excluded == ("n1",)


def test_nodes_excluded_before_stay_excluded() -> None:
    decision = decide(Blame("n3", "gone"), excluded=("n4",), min_nodes=2)
    assert decision.nodes == ("n1", "n2") and decision.excluded == ("n4", "n3")


def test_nothing_blamed_keeps_the_step_and_before_the_first_step_starts_on_the_healthy_nodes() -> None:
    assert decide([]).action == "keep"
    first = decide([], step_nodes=(), excluded=("n2",))
    assert (first.action, first.nodes, first.continues) == ("start", ("n1", "n3", "n4"), True)
    too_few = decide([], step_nodes=(), excluded=("n2", "n3"))
    assert too_few.action == "requeue" and too_few.why == "2 healthy nodes left, min_nodes is 3"
    spent = decide([], step_nodes=(), excluded=("n2", "n3"), can_requeue=False)
    assert spent.action == "fail" and spent.why.endswith("no requeue left (signals.max_requeues)")


# -- crash loop --------------------------------------------------------------------------------------------------
def test_a_crash_loop_is_k_failures_without_a_newer_checkpoint() -> None:
    records = [{"checkpoint_step": 40, "node": "n2"}, {"checkpoint_step": 80}, {"checkpoint_step": 80}]
    assert healing.crash_loop(records, 3) is None  # the first attempt saved step 80
    assert healing.crash_loop(records, 2) == records[1:]
    assert healing.crash_loop([{"checkpoint_step": None}] * 2, 3) is None
    assert "attempt 1 (job 7): n2 at step 12, rank 3 killed" in healing.describe_attempts(
        [{"job_id": "7", "node": "n2", "step": 12, "reason": "rank 3 killed"}]
    )


def test_the_log_line_says_what_happened() -> None:
    decision = healing.Decision("swap", nodes=("n1", "n3"), excluded=("n2",))
    line = healing.log_line(Blame("n2", "rank 3 exited 137"), 412, decision, 400)
    assert line == "node n2 lost at step 412 (rank 3 exited 137); continuing on n1,n3 from step 400"


# -- the tasks and the summary -----------------------------------------------------------------------------------
def test_a_step_on_fewer_nodes_runs_the_spec_on_them(tmp_path: Path) -> None:
    spec = load(tmp_path, "min_nodes: 1").spec
    assert node_loss.step_spec(spec, {}) is spec
    smaller = node_loss.step_spec(spec, {node_loss.STEP_NODES_VAR: "1"})
    assert smaller.resources.nodes == 1 and smaller.world_size == 2
    with pytest.raises(DistributedSetupError, match="HPCTRAIN_STEP_NODES='4'"):
        node_loss.step_spec(spec, {node_loss.STEP_NODES_VAR: "4"})


def test_a_task_on_fewer_nodes_tells_the_trainer_the_runs_micro_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpctrain.programs.launcher import TaskLauncher

    spec = load(tmp_path, "min_nodes: 1").spec
    monkeypatch.setenv(node_loss.STEP_NODES_VAR, "1")
    # The task sets it in os.environ; set (then drop) it here first so that monkeypatch puts the
    # environment back afterwards (a bare delenv of an unset name records nothing, and the value
    # leaked into every later in-process trainer: other micro-batches, other steps).
    monkeypatch.setenv(node_loss.RUN_MICRO_BATCHES_VAR, "0")
    monkeypatch.delenv(node_loss.RUN_MICRO_BATCHES_VAR)
    launcher = TaskLauncher(spec.model_dump(mode="json"), str(tmp_path))
    assert launcher.step_spec(JobSpec.model_validate(spec.model_dump(mode="json"))).world_size == 2
    import os

    assert os.environ[node_loss.RUN_MICRO_BATCHES_VAR] == "6"


def test_a_new_attempt_keeps_the_records_of_lost_nodes(tmp_path: Path) -> None:
    failures = [{"node": "n2", "step": 5, "reason": "gone", "action": "continue"}]
    write_summary(tmp_path, {"status": "running", "excluded_nodes": ["n2"], "node_failures": failures})
    Reporter(tmp_path, enabled=True, static={"name": "x"}).summary("running", {})
    summary = read_summary(tmp_path)
    assert summary is not None and summary.excluded_nodes == ["n2"] and summary.node_failures == failures


# -- status, watch and report -------------------------------------------------------------------------------------
def test_lost_nodes_read_as_one_line_whatever_the_file_holds() -> None:
    from hpctrain.observe.node_losses import node_loss_text

    record = {"node": "n2", "step": 412, "reason": "rank 3 exited 137", "action": "continue", "nodes": ["n1", "n3"]}
    assert node_loss_text([record]) == "n2 at step 412 (rank 3 exited 137): continue on n1,n3"
    assert node_loss_text(None) is None and node_loss_text(["x", 3]) is None and node_loss_text({"a": 1}) is None
    hostile = node_loss_text([{**record, "node": "\x1b[2Jn2"}] * 7)
    assert hostile is not None and "\x1b" not in hostile and hostile.endswith("(and 2 earlier)")


def test_status_watch_and_report_show_the_lost_nodes(tmp_path: Path) -> None:
    from hpctrain.contract.rundir import write_run_info
    from hpctrain.observe.live_status import Snapshot
    from hpctrain.observe.live_view import alerts
    from hpctrain.observe.report.load import RunData
    from hpctrain.observe.report.render import _run_facts
    from hpctrain.observe.run_status import run_status

    failures = [{"node": "n2", "step": 5, "reason": "its slurmd does not answer", "action": "continue"}]
    write_run_info(tmp_path, {"name": "x", "backend": "local", "job_id": "1"})
    write_summary(tmp_path, {"status": "completed", "excluded_nodes": ["n2"], "node_failures": failures})
    expected = "n2 at step 5 (its slurmd does not answer): continue"
    assert run_status(tmp_path)["lost_nodes"] == expected
    snapshot = Snapshot(0.0, "x", "1", "COMPLETED", "completed", True, lost_nodes=expected)
    assert f"lost nodes: {expected}" in alerts(snapshot)
    run = RunData(path=tmp_path, label="x", summary={"node_failures": failures})  # type: ignore[call-arg]
    assert f"lost nodes: {expected}" in _run_facts(run)


# -- the one decider, for sick nodes too ---------------------------------------------------------------------------
def test_sick_nodes_are_swapped_dropped_requeued_or_kept() -> None:
    flagged = [Blame("n2", "compute 4x", kind="burn-in"), Blame("n3", "read 5x", kind="burn-in")]
    both = decide(flagged, min_nodes=1)
    assert (both.action, both.nodes, both.excluded) == ("drop", ("n1", "n4"), ("n2", "n3"))
    assert decide(flagged).action == "requeue"
    kept = decide(flagged, can_requeue=False)
    assert (kept.action, kept.nodes, kept.excluded) == ("keep", NODES, ()) and "no requeue left" in kept.why


def test_a_sick_batch_node_is_dropped_a_lost_one_requeues_or_fails() -> None:
    sick = decide(Blame("n1", "forward 3x", kind="slow"))
    assert (sick.action, sick.nodes) == ("swap", ("n2", "n3", "n4"))
    assert decide(Blame("n1", "gone"), can_requeue=False).action == "fail"
    assert decide([]).action == "keep"


def test_the_log_line_names_the_cause() -> None:
    decision = healing.Decision(
        "keep", nodes=NODES, why="1 healthy node left, min_nodes is 3, and no requeue left: kept"
    )
    line = healing.log_line(Blame("n2", "compute 4x", kind="burn-in"), None, decision, None)
    assert line.startswith("node n2 flagged by the burn-in before the first step (compute 4x); training on it anyway")


def test_nodes_blamed_by_one_decision_are_one_attempt_of_a_crash_loop() -> None:
    one = [{"job_id": "7", "time": 5.0, "checkpoint_step": 20, "node": n} for n in ("n2", "n4")]
    assert healing.crash_loop([{"job_id": "7", "time": 1.0, "checkpoint_step": 20}, *one], 3) is None
    assert healing.crash_loop([{"job_id": "7", "time": 1.0, "checkpoint_step": 20}, *one], 2) is not None


def test_the_batch_nodes_loss_requeues_and_a_requeue_slurm_made_is_only_recorded() -> None:
    guardian = decide(Blame("n1", "its slurmd does not answer"), step_nodes=())
    assert (guardian.action, guardian.excluded, guardian.why) == ("requeue", ("n1",), "n1 ran the batch step")
    assert not guardian.requeued_by_slurm
    looked_back = decide(Blame("n1", "down*"), step_nodes=(), excluded=("n4",), requeued_by_slurm=True)
    assert (looked_back.action, looked_back.excluded, looked_back.requeued_by_slurm) == ("requeue", ("n4", "n1"), True)


def test_a_requeue_slurm_refuses_keeps_the_ranks_only_when_they_live_and_nothing_is_lost() -> None:
    flagged = Blame("n2", "compute 4x", kind="burn-in")
    assert decide(flagged, allocation=NODES, ranks_alive=True).if_requeue_fails == "keep"
    assert decide(flagged, allocation=NODES).if_requeue_fails == "fail"  # the step ended: nothing to keep
    assert decide(Blame("n2", "gone"), allocation=NODES, ranks_alive=True).if_requeue_fails == "fail"


# -- no requeue into a job the partition can never run (sinfo's usable nodes) --------------------------------------
def room(*nodes: str, needs: int = 3, partition: str = "debug") -> Any:
    """What HealRecord.room answers: the partition's usable nodes, and what the job asks for."""
    return lambda: healing.Room({partition: nodes}, needs)


def test_a_requeue_that_leaves_enough_usable_nodes_goes_ahead_as_before() -> None:
    flagged = Blame("n2", "compute 2.2x", kind="burn-in")
    decision = decide(flagged, allocation=NODES, ranks_alive=True, room=room("n1", "n2", "n3", "n5"))
    assert (decision.action, decision.excluded, decision.why) == (
        "requeue",
        ("n2",),
        "2 healthy nodes left, min_nodes is 3",
    )


def test_a_flagged_node_the_partition_cannot_spare_is_kept_and_why() -> None:
    flagged = Blame("n2", "compute 2.2x", kind="burn-in")
    kept = decide(flagged, allocation=NODES, ranks_alive=True, room=room("n1", "n2", "n3"))
    assert (kept.action, kept.nodes, kept.excluded) == ("keep", NODES, ())
    assert kept.why == "excluding n2 would leave 2 usable nodes in partition debug, the job needs 3: kept"
    line = healing.log_line(flagged, None, kept, None)
    assert line == (
        "node n2 flagged by the burn-in before the first step (compute 2.2x); training on it anyway: "
        "excluding n2 would leave 2 usable nodes in partition debug, the job needs 3: kept"
    )
    # the supervisor's step ended (ranks gone): kept all the same, the next step starts on the same nodes
    assert decide(flagged, allocation=NODES, room=room("n1", "n2", "n3")).action == "keep"
    # nodes the run excluded before count as gone too
    earlier = decide(flagged, allocation=NODES, excluded=("n5",), room=room("n1", "n2", "n3", "n5"))
    assert earlier.action == "keep" and "excluding n5,n2 would leave 2 usable nodes" in earlier.why


def test_a_job_with_several_partitions_requeues_when_one_of_them_has_room() -> None:
    flagged = Blame("n2", "compute 2.2x", kind="burn-in")
    both = lambda: healing.Room({"small": ("n1", "n2", "n3"), "big": ("n1", "n2", "n3", "n7")}, 3)  # noqa: E731
    assert decide(flagged, allocation=NODES, room=both).action == "requeue"


def test_a_lost_node_slurm_still_runs_jobs_on_is_not_kept_out_and_a_truly_lost_one_fails() -> None:
    # n1 ran the batch step; its rank was killed but sinfo still lists it usable: requeue, n1 not excluded
    soft = decide(Blame("n1", "rank 0 killed"), room=room("n1", "n2", "n3"))
    assert (soft.action, soft.excluded) == ("requeue", ())
    assert soft.why.endswith("so n1 (which Slurm still runs jobs on) is not kept out")
    # n1 is down (not usable): a requeue could never start
    lost = decide(Blame("n1", "slurmd does not answer"), room=room("n2", "n3"))
    assert (lost.action, lost.excluded) == ("fail", ("n1",))
    assert lost.why == (
        "excluding n1 would leave 2 usable nodes in partition debug, the job needs 3: "
        "a requeue could never start (it would pend forever)"
    )
    # before the first step, with too few healthy nodes in the allocation and none to spare in the partition
    first = decide([], step_nodes=(), excluded=("n2", "n3"), room=room("n1", "n2", "n3", "n4"))
    assert first.action == "fail" and "excluding n2,n3 would leave 2 usable nodes" in first.why


def test_when_sinfo_cannot_say_the_requeue_goes_ahead_and_says_so() -> None:
    said = "could not count the usable nodes of partition debug (sinfo: error): requeued without checking"
    decision = decide(Blame("n2", "compute 2.2x", kind="burn-in"), allocation=NODES, room=lambda: said)
    assert decision.action == "requeue" and decision.excluded == ("n2",)
    assert decision.why == f"2 healthy nodes left, min_nodes is 3; {said}"


def test_a_slow_node_never_asks_slurm_how_many_nodes_are_left() -> None:
    def never() -> Any:
        raise AssertionError("a slow node is never requeued for: the partition is not asked")

    kept = decide(Blame("n2", "step compute 3x", kind="slow"), allocation=NODES, can_requeue=False, room=never)
    assert kept.action == "keep"


def test_a_crash_loop_overrides_whatever_else_the_decider_would_do() -> None:
    before = [{"job_id": "7", "time": 1.0, "checkpoint_step": 40, "node": "n3", "step": 44, "reason": "rank 2 killed"}]
    loop = dict(history=tuple(before), checkpoint_step=40, step=45, job_id="7", crash_loop_attempts=2)
    ended = decide(Blame("n2", "rank 3 killed"), **loop)
    assert ended.action == "fail" and ended.excluded == ("n2",)
    assert ended.why.startswith("crash loop: 2 attempts in a row ended without a checkpoint newer than step 40")
    assert "attempt 2 (job 7): n2 at step 45, rank 3 killed" in ended.why
    assert decide(Blame("n2", "rank 3 killed"), **{**loop, "checkpoint_step": 80}).action == "swap"  # it saved
    assert decide(Blame("n2", "rank 3 killed"), **{**loop, "crash_loop_attempts": None}).action == "swap"


# -- one decider, one executor: read from the source, as test_house_layering.py reads imports -----------------------
PACKAGE = Path(healing.__file__).resolve().parents[1]
DECIDE_CALLERS = {  # (module, function) -> the node question it asks
    ("healing/supervisor.py", "Supervisor.supervise"): "the first start's nodes",
    ("healing/supervisor.py", "Supervisor.after_failure"): "a lost node, a burn-in verdict, an eviction, a crash loop",
    ("healing/supervisor.py", "Supervisor.slow_node"): "whether the run can go on without a slow node (asked only)",
    ("healing/guardian.py", "lose_batch_node"): "the batch node's loss (the guardian, or the next start looking back)",
    ("healing/burn_in.py", "decide_here"): "a plain job's burn-in verdict",
}
# What only the decider does, and what only the executor (HealRecord.carry_out and its own steps) does.
DECIDER_ONLY = {"decide": None, "Decision": "healing/record.py:HealRecord.carry_out", "choose_nodes": None}
DECIDER_ONLY |= {"crash_loop": None}
EXECUTOR_ONLY = {"requeue_job": "HealRecord._requeue", "exclude_nodes": "HealRecord._exclude_from_next_start"}


def calls_in(path: Path) -> list[tuple[str, str, int]]:
    """(called name, enclosing Class.function, line) of every call in ``path``."""
    found: list[tuple[str, str, int]] = []

    def walk(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{where}.{child.name}" if where else child.name
            if isinstance(child, ast.Call):
                name = getattr(child.func, "attr", getattr(child.func, "id", ""))
                found.append((name, inner, child.lineno))
            walk(child, inner)

    walk(ast.parse(path.read_text(), str(path)), "")
    return found


def test_every_node_decision_is_a_decide_call_and_one_executor_carries_it_out() -> None:
    callers, misplaced = set(), []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        for name, where, line in calls_in(path):
            if name == "decide" and module != "healing/decide.py":
                callers.add((module, where))
            elif name in DECIDER_ONLY and module != "healing/decide.py" and f"{module}:{where}" != DECIDER_ONLY[name]:
                misplaced.append(f"{module}:{line} ({where}) calls {name}: only the decider (healing/decide.py) does")
            elif name in EXECUTOR_ONLY and module.startswith("healing/") and where != EXECUTOR_ONLY[name]:
                misplaced.append(f"{module}:{line} ({where}) calls {name}: only HealRecord.carry_out does")
    assert callers == set(DECIDE_CALLERS), "decide() callers changed: " + repr(sorted(callers ^ set(DECIDE_CALLERS)))
    assert not misplaced, "a node decision made or carried out outside the one decider and executor:\n  " + (
        "\n  ".join(misplaced)
    )
    carriers = {
        (path.relative_to(PACKAGE).as_posix(), where)
        for path in PACKAGE.rglob("*.py")
        for name, where, _ in calls_in(path)
        if name == "carry_out"
    }
    asked_only = {("healing/supervisor.py", "Supervisor.slow_node")}
    assert carriers == set(DECIDE_CALLERS) - asked_only, "each answer is carried out where it was asked"
