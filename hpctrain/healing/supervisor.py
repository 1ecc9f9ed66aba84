"""The batch step of a job that heals: run the training step, and start it again without a lost or sick node.

``python -m hpctrain.runtime.stop_signals hpctrain.healing.supervisor RUN_DIR --
srun ARGS... COMMAND`` is the sbatch script's command when
``resources.min_nodes`` or ``spare_nodes`` is set (the job has ``--no-kill``,
so Slurm keeps the allocation when a node fails). It starts the srun line on
``resources.nodes`` nodes of the allocation with ``--overlap`` and an
explicit ``--nodelist``, and watches:

* srun's own reports (tee'd on to the batch log, where rank 0 reads them); under ``launcher: torchrun``
  srun's tasks are the node tasks, and the ranks' own failures are the node tasks' report in the same
  words (``torchrun-failures.log``, the step's part of it: ``evidence.launcher_report``);
* heartbeats: a node whose every rank went silent is a suspect;
* after srun reported a failed task, the nodes it said nothing about;
* a suspect's slurmd: a TCP connect to its port; no answer means lost;
* the burn-in's record of the step (``STEP_ID_VAR`` names it): flagged nodes
  end the step before it trains (``healing/burn_in.py``);
* each node's compute times in the heartbeats: a node that stays slower than
  the others is evicted (``healing/eviction.py``; ``health.eviction``).

srun itself only gives up on a dead node at Slurm's node-failure detection
(SlurmdTimeout, 300 s by default), and a new step is refused until then
unless it overlaps (measured, docs/preemption.md). So the supervisor ends the
step itself (``scancel --signal=KILL`` of the step, then the srun client),
blames a node (``healing/decide.py``), records it in summary.json
(``excluded_nodes``, ``node_failures``), and starts the next step from the
last complete checkpoint; or requeues the job with ``ExcNodeList`` set; or
stops. The training code is the same on every start: the task launcher
reads ``STEP_NODES_VAR`` (``jobspec/node_loss.py``) for a smaller world.

Like a task, it counts SIGTERM from its first line (``runtime/stop_signals.py``
runs it): a job that is ending (scancel, a requeue: the only SIGTERMs a batch
step gets) never starts a step, and a start of a job whose run it already
completed (Slurm 24.05+ may start it again) ends without one.
Torch-free (it runs beside the tasks, on the batch node).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.contract.heartbeat_files import read_heartbeats
from hpctrain.contract.node_records import BURN_IN_KEY, EVICTIONS_KEY, BurnIn, Eviction, appended, records
from hpctrain.contract.rundir import hang_claim_path
from hpctrain.contract.slurm import Slurm, SlurmCommandError
from hpctrain.contract.srun_report import first_task_failure, task_failures
from hpctrain.contract.summary import read_summary, write_summary
from hpctrain.healing import decide, eviction, evidence, guardian
from hpctrain.healing.record import RECORD_EVERY_S, HealRecord, load_spec
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.node_health import BURN_IN_VAR, STEP_ID_VAR
from hpctrain.jobspec.node_loss import STEP_NODES_VAR
from hpctrain.runtime import stop_signals
from hpctrain.runtime.master import derive_master_port
from hpctrain.runtime.requeue import completed_by
from hpctrain.runtime.task_env import parse_hostlist

POLL_S = 1.0
SETTLE_S = 3.0  # after srun reported a failed task: how long the other nodes get to report too
STOP_WAIT_S = 5.0  # for srun to exit once its step was killed
TEE_DRAIN_S = 10.0  # for the last lines of srun's stderr once srun has exited
EVICTION_POLL_S = 2.0  # how often the heartbeats' compute times are compared (they change per heartbeat)
START_GUARDIAN = True


def say(line: str) -> None:
    print(f"hpctrain supervisor: {line}", file=sys.stderr, flush=True)


@dataclass
class RunningStep:
    """One srun of the training step, with srun's stderr collected as it comes (and passed on)."""

    process: subprocess.Popen[bytes]
    nodes: tuple[str, ...]
    started: float
    launcher_report_from: int = 0  # torchrun-failures.log's size when the step started: its lines come after
    text: list[str] = field(default_factory=list)
    evidence: dict[str, dict[str, object]] = field(default_factory=dict)  # node -> numbers behind a blame
    sick: tuple[decide.Blame, ...] = ()  # a slow node the supervisor ended the step for
    tee: threading.Thread | None = None

    def start_tee(self) -> None:
        def tee() -> None:
            assert self.process.stderr is not None
            for raw in iter(self.process.stderr.readline, b""):
                sys.stderr.buffer.write(raw)
                sys.stderr.flush()
                self.text.append(raw.decode(errors="replace"))

        self.tee = threading.Thread(target=tee, daemon=True, name="srun-stderr")
        self.tee.start()

    def drain(self) -> None:
        """srun has exited: wait (bounded) until its last lines are read. Its exit does not mean the reader
        thread has them: on a loaded node the last "task N: Killed" line, the one that names the lost
        node, came after the exit, and the failure was judged without it (no node to blame)."""
        if self.tee is not None:
            self.tee.join(TEE_DRAIN_S)  # a process srun left behind may hold the pipe open: never wait forever

    @property
    def srun_text(self) -> str:
        return "".join(self.text)


class Supervisor:
    """Runs the training step until it succeeds, the run must requeue, or it cannot go on."""

    def __init__(self, run_dir: Path, srun: Sequence[str], spec: JobSpec, environ: dict[str, str]) -> None:
        self.run_dir, self.srun, self.spec, self.environ = run_dir, list(srun), spec, environ
        self.record = HealRecord(run_dir, spec, environ, say=say)
        self.job_id = self.record.job_id
        self.allocation = parse_hostlist(environ["SLURM_JOB_NODELIST"])
        self.probe = evidence.NodeProbe()
        self.guardian = guardian.GuardianStep(self.srun[0], run_dir, self.record.batch_node, environ)
        self.stopping = False
        self.step_nodes: tuple[str, ...] = ()
        self.step_id = ""
        self.burn_in_off = False  # a flagged node was kept: the next steps train without a burn-in
        health = spec.health.eviction
        self.slow = eviction.SlowWatch(health.margin, health.window_s, health.min_steps) if spec.evicts else None

    # -- the loop ----------------------------------------------------------------------------------------------
    def run(self) -> int:
        self.install_handlers()
        guardian.blame_previous_start(self.record, self.probe)
        try:
            return self.supervise()
        finally:
            self.record.write_record(self.step_nodes, ended=True)
            self.guardian.stop()

    def supervise(self) -> int:
        done = completed_by(self.run_dir, [self.job_id])
        if done is not None:
            say(f"this job completed the run already (step {done.global_step}); Slurm started it again: ending")
            try:
                Slurm().disable_requeue(self.job_id)  # as its rank 0 did when it completed (runtime/requeue.py)
            except SlurmCommandError as exc:
                say(f"could not keep Slurm from starting it again: {exc}")
            return 0
        first = self.record.situation((), step_nodes=(), allocation=self.allocation)
        decision = self.record.carry_out(first, decide.decide(first))
        if not decision.continues:
            return 0 if decision.action == "requeue" else self.ended_failed(1)
        nodes, attempt = decision.nodes, 0
        while True:
            if self.stopping:
                say("the job is ending (SIGTERM): no training step is started")
                return 0
            step = self.start(nodes, attempt)
            outcome = self.watch(step)
            if outcome.exit_code == 0 or self.stopping or not self.probe.job_running(self.job_id):
                return outcome.exit_code or 0
            next_nodes = self.after_failure(outcome)
            if isinstance(next_nodes, int):
                return next_nodes
            nodes, attempt = next_nodes, attempt + 1

    def after_failure(self, outcome: decide.StepOutcome) -> tuple[str, ...] | int:
        """Blame, then decide and carry it out; the next step's nodes, or the batch step's exit status."""
        failed = outcome.exit_code or 1
        blamed = list(outcome.sick) or [b for b in [decide.blame(outcome)] if b is not None]
        if not blamed:
            say(f"the training step failed (exit {outcome.exit_code}) and no node is to blame; the job ends")
            return self.ended_failed(failed)
        kind = blamed[0].kind
        step = evidence.last_step(self.run_dir, outcome.nodes)
        situation = self.record.situation(
            blamed,
            step_nodes=outcome.nodes,
            allocation=self.allocation,
            step=step,
            can_requeue=self.record.can_requeue and kind != "slow",  # a slow node is never worth the queue
            crash_loop=True,
        )
        decision = self.record.carry_out(situation, decide.decide(situation), dict(outcome.evidence))
        if kind == "slow":
            self.record_eviction(outcome, decision, step, situation.checkpoint_step)
        if decision.action == "keep" and kind == "burn-in":
            self.burn_in_off = True
        if decision.continues:
            return decision.nodes
        return 0 if decision.action == "requeue" else self.ended_failed(failed)

    def ended_failed(self, code: int) -> int:
        """The run fails for good: take the job's ``Requeue`` flag away, as rank 0 does when a run ends
        (runtime/requeue.py). With ``--requeue=expedite`` Slurm would otherwise keep a job whose batch step
        exits non-zero on healthy nodes pending in ``REQUEUE_HOLD`` (docs/preemption.md); the supervisor
        has judged the nodes already. ``code``, the batch step's exit status."""
        try:
            Slurm().disable_requeue(self.job_id)
        except SlurmCommandError as exc:
            say(f"could not keep Slurm from holding the failed job for a requeue: {exc}")
        return code

    def record_eviction(
        self, outcome: decide.StepOutcome, decision: decide.Decision, step: int | None, checkpoint: int | None
    ) -> None:
        """summary.json's ``evictions`` gets the slow node's numbers and what the run did."""
        found = outcome.sick[0]
        numbers = dict(outcome.evidence.get(found.node) or {})
        record = Eviction(
            node=found.node,
            step=step,
            checkpoint_step=checkpoint,
            node_ms=numbers.get("compute_ms", numbers.get("forward_ms")),
            compute_kind=numbers.get("compute_kind"),
            others_ms=numbers.get("others_ms"),
            ratio=numbers.get("ratio"),
            slow_for_s=numbers.get("slow_for_s"),
            action=decision.action,
            nodes=list(decision.nodes),
            job_id=self.job_id,
            time=round(time.time(), 3),
        )
        summary = read_summary(self.run_dir)
        fields = summary.fields() if summary is not None else {}
        fields[EVICTIONS_KEY] = appended(fields.get(EVICTIONS_KEY), record.model_dump(mode="json"))
        write_summary(self.run_dir, fields)

    def burn_in_flags(self, step_id: str) -> tuple[tuple[decide.Blame, ...], dict[str, dict[str, object]]]:
        """The nodes the burn-in of step ``step_id`` flagged, as blames, with their scores as evidence."""
        summary = read_summary(self.run_dir)
        found = records(BurnIn, summary.fields().get(BURN_IN_KEY)) if summary is not None else []
        mine = [record for record in found if record.step_id == step_id and record.flagged]
        if not mine:
            return (), {}
        flagged = [score for score in mine[-1].scores if score.flagged]
        blamed = tuple(decide.Blame(s.node, s.reason or "flagged", kind="burn-in") for s in flagged)
        return blamed, {s.node: s.model_dump(exclude={"node", "flagged"}) for s in flagged}

    def slow_node(self, step: RunningStep) -> decide.Blame | None:
        """A node of ``step`` to evict now (and that the run can go on without), or None."""
        if self.slow is None:
            return None
        last = self.spec.health.eviction.min_steps
        speeds = eviction.node_speeds(read_heartbeats(self.run_dir), step.nodes, since=step.started, last=last)
        verdict = self.slow.observe(speeds, len(step.nodes), time.monotonic())
        if verdict is None:
            return None
        slow = decide.Blame(verdict.node, verdict.reason(), kind="slow")
        ask = self.record.situation([slow], step_nodes=step.nodes, allocation=self.allocation, can_requeue=False)
        decision = decide.decide(ask)  # asked only: carried out once the step has ended (after_failure)
        if not decision.continues or decision.action == "keep":
            say(f"node {verdict.node} is slow ({verdict.reason()}) but the run cannot go on without it; kept")
            self.slow = None  # said once; the rest of the run trains on it
            return None
        step.evidence[verdict.node] = verdict.evidence()
        return slow

    # -- one step ----------------------------------------------------------------------------------------------
    def start(self, nodes: tuple[str, ...], attempt: int) -> RunningStep:
        self.step_nodes = nodes
        self.record.write_record(nodes)
        if START_GUARDIAN:
            self.guardian.start(self.allocation, self.record.excluded, nodes)
        tasks = self.spec.slurm_tasks_per_node  # one per node for a script per node
        argv = [
            self.srun[0],
            "--overlap",  # a new step would otherwise wait until Slurm declares the lost node down
            f"--nodes={len(nodes)}",
            f"--ntasks={len(nodes) * tasks}",
            f"--ntasks-per-node={tasks}",
            f"--nodelist={','.join(nodes)}",
            *self.srun[1:],
        ]
        env = dict(self.environ)
        self.step_id = env[STEP_ID_VAR] = f"{self.job_id}.{self.record.restart}.{attempt}"
        if self.burn_in_off:
            env[BURN_IN_VAR] = "off"
        if self.slow is not None:
            self.slow.reset()
        if len(nodes) != self.spec.resources.nodes:
            env[STEP_NODES_VAR] = str(len(nodes))
        if attempt:  # the last step's rendezvous port may still be held
            env["MASTER_PORT"] = str(derive_master_port(f"{self.job_id}.{self.record.restart}.{attempt}"))
        # A hang in this step reports again, also after a requeue (same job id); a claim after the step is this one's.
        hang_claim_path(self.run_dir, self.job_id).unlink(missing_ok=True)
        report_from = evidence.launcher_report_size(self.run_dir) if self.spec.launcher == "torchrun" else 0
        process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        step = RunningStep(process, nodes, time.time(), report_from)
        step.start_tee()
        return step

    def watch(self, step: RunningStep) -> decide.StepOutcome:
        """Wait for the step to end, or end it once a node is found lost."""
        reported_at: float | None = None
        lost: dict[str, str] = {}
        probed: dict[str, float] = {}
        recorded = checked = time.monotonic()
        while step.process.poll() is None:
            time.sleep(POLL_S)
            if time.monotonic() - recorded >= RECORD_EVERY_S:
                self.record.write_record(step.nodes)
                recorded = time.monotonic()
                again = self.guardian.keep_up() if START_GUARDIAN and not self.stopping else None
                if again:
                    say(again)
            if self.stopping:
                continue
            if reported_at is None and first_task_failure(step.srun_text) is not None:
                reported_at = time.monotonic()
            # A hang claim of this step: the ranks' heartbeat threads are in the hang watchdog (runtime/hang.py:
            # its grace and report wait, 5-90 s without a beat), so a silent node is no suspect then; one that
            # dies meanwhile is still one once srun reports the others and not it (CI #58 probed n1 then).
            hang = hang_claim_path(self.run_dir, self.job_id).exists()
            suspects = set() if hang else set(self.silent_nodes(step))
            if reported_at is not None and time.monotonic() - reported_at >= SETTLE_S:
                suspects |= set(step.nodes) - evidence.reported_nodes(step.srun_text)
            suspects |= set(decide.node_failures_in(step.srun_text))
            for node in sorted(suspects):
                if time.monotonic() - probed.get(node, 0.0) < evidence.PROBE_TIMEOUT_S:
                    continue
                probed[node] = time.monotonic()
                why = self.probe.lost_reason(node)
                if why is not None:
                    lost[node] = why
            if lost:
                self.end_step(step)
                break
            if time.monotonic() - checked >= EVICTION_POLL_S:
                checked = time.monotonic()
                slow = self.slow_node(step)
                if slow is not None:
                    step.sick = (slow,)
                    self.end_step(step)
                    break
        step.process.wait()
        step.drain()
        if step.process.returncode == 0 and not lost and not step.sick:
            return decide.StepOutcome(nodes=step.nodes, exit_code=0)
        return self.outcome(step, lost)

    def outcome(self, step: RunningStep, lost: dict[str, str]) -> decide.StepOutcome:
        ended_by_us = bool(lost) or bool(step.sick)
        text = step.srun_text
        if self.spec.launcher == "torchrun":  # the ranks' own failures first: srun's report names the node tasks
            text = evidence.launcher_report(self.run_dir, step.launcher_report_from) + text
        sick, numbers = (step.sick, step.evidence) if step.sick else self.burn_in_flags(self.step_id)
        for node in decide.node_failures_in(text):
            lost.setdefault(node, "srun reports a node failure")
        for node, state in self.probe.node_states(step.nodes).items():
            if node in step.nodes and node not in lost and self.probe.lost_by_state(node, state):
                lost[node] = f"Slurm marks it {state}"
        return decide.StepOutcome(
            nodes=step.nodes,
            exit_code=None if ended_by_us else step.process.returncode,
            task_failures=tuple(task_failures(text)),
            lost_nodes=lost,
            silent_nodes=frozenset(self.silent_nodes(step)),
            hung=evidence.hung_rank(self.run_dir, self.job_id),
            sick=sick,
            evidence=numbers,
        )

    def silent_nodes(self, step: RunningStep) -> list[str]:
        limit = evidence.SILENT_BEATS * self.spec.distributed.heartbeat_interval_s
        return evidence.silent_nodes(self.run_dir, step.nodes, since=step.started, limit_s=limit, now=time.time())

    def end_step(self, step: RunningStep) -> None:
        """Kill the step's tasks on the nodes that still answer, then the srun client waiting for the lost one."""
        slurm = Slurm()
        try:
            listed = slurm.job_steps(self.job_id)
        except SlurmCommandError:
            listed = []
        for step_id, name in listed:
            if step_id.rpartition(".")[2].isdigit() and name != guardian.STEP_NAME:
                try:
                    slurm.kill_step(step_id)
                except SlurmCommandError:
                    pass
        try:
            step.process.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            step.process.kill()

    def install_handlers(self) -> None:
        """SIGTERM/SIGINT: the job is ending; never start another step. USR1/USR2 are for the tasks."""

        def stop(signum: int, frame: object) -> None:
            self.stopping = True

        def ignore(signum: int, frame: object) -> None:
            pass

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        for name in ("SIGUSR1", "SIGUSR2"):
            signal.signal(getattr(signal, name), ignore)  # a handler, not SIG_IGN: srun must not inherit it
        if stop_signals.recorded().get("TERM"):  # came before these handlers: since the first line
            self.stopping = True


def main(argv: Sequence[str], *, environ: dict[str, str] | None = None, execv: Callable[..., Any] = os.execvp) -> int:
    if "--" not in argv or argv.index("--") != 1 or len(argv) < 3:
        say("usage: python -m hpctrain.healing.supervisor RUN_DIR -- srun ARGS... COMMAND")
        return 2
    run_dir, srun = Path(argv[0]), list(argv[2:])
    environ = dict(os.environ if environ is None else environ)
    try:
        supervisor = Supervisor(run_dir, srun, load_spec(run_dir), environ)
    except Exception as exc:  # no supervision is better than no job: run the step once, as without it
        say(f"cannot supervise ({type(exc).__name__}: {exc}); running the step once")
        execv(srun[0], srun)
        return 1
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
