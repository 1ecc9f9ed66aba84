"""The batch step of a job that heals: run the training step, and start it again without a lost node.

``python -m hpctrain.runtime.supervisor RUN_DIR -- srun ARGS... COMMAND`` is
the sbatch script's command when ``resources.min_nodes`` or ``spare_nodes``
is set (the job has ``--no-kill``, so Slurm keeps the allocation when a node
fails). It starts the srun line on ``resources.nodes`` nodes of the
allocation with ``--overlap`` and an explicit ``--nodelist``, and watches:

* srun's own reports (tee'd on to the batch log, where rank 0 reads them);
* heartbeats: a node whose every rank went silent is a suspect;
* after srun reported a failed task, the nodes it said nothing about;
* a suspect's slurmd: a TCP connect to its port; no answer means lost.

srun itself only gives up on a dead node at Slurm's node-failure detection
(SlurmdTimeout, 300 s by default), and a new step is refused until then
unless it overlaps (measured, docs/preemption.md). So the supervisor ends the
step itself (``scancel --signal=KILL`` of the step, then the srun client),
blames a node (``runtime/healing.py``), records it in summary.json
(``excluded_nodes``, ``node_failures``), and starts the next step from the
last complete checkpoint; or requeues the job with ``ExcNodeList`` set; or
stops. The training code is the same on every start: the task launcher
reads :data:`~hpctrain.runtime.healing.STEP_NODES_VAR` for a smaller world.
Torch-free (it runs beside the tasks, on the batch node).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.contract.heartbeat_files import read_heartbeats
from hpctrain.contract.rundir import (
    hang_claim_path,
    latest_checkpoint_step,
    read_json_object,
    read_summary,
    spec_path,
    submitit_dir,
    supervisor_record_path,
    write_json_atomic,
    write_summary,
)
from hpctrain.contract.slurm import SlurmCommandError, run_slurm
from hpctrain.jobspec.batch import BatchLayout, micro_batch_problem
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.yaml_source import read_spec_file
from hpctrain.runtime import guardian, healing
from hpctrain.runtime.failures import TaskFailure, first_task_failure
from hpctrain.runtime.master import derive_master_port
from hpctrain.runtime.task_env import parse_hostlist

POLL_S = 1.0
SETTLE_S = 3.0  # after srun reported a failed task: how long the other nodes get to report too
PROBE_TIMEOUT_S = 3.0
SILENT_BEATS = 3  # heartbeat intervals without a beat before a node is a suspect
STOP_WAIT_S = 5.0  # for srun to exit once its step was killed
DEFAULT_SLURMD_PORT = 6818
RECORD_EVERY_S = 5.0  # the guardian takes a record older than guardian.SILENT_S for a dead batch node
START_GUARDIAN = True


def say(line: str) -> None:
    print(f"hpctrain supervisor: {line}", file=sys.stderr, flush=True)


@dataclass
class RunningStep:
    """One srun of the training step, with srun's stderr collected as it comes (and passed on)."""

    process: subprocess.Popen[bytes]
    nodes: tuple[str, ...]
    started: float
    text: list[str] = field(default_factory=list)

    def start_tee(self) -> None:
        def tee() -> None:
            assert self.process.stderr is not None
            for raw in iter(self.process.stderr.readline, b""):
                sys.stderr.buffer.write(raw)
                sys.stderr.flush()
                self.text.append(raw.decode(errors="replace"))

        threading.Thread(target=tee, daemon=True, name="srun-stderr").start()

    @property
    def srun_text(self) -> str:
        return "".join(self.text)


class Supervisor:
    """Runs the training step until it succeeds, the run must requeue, or it cannot go on."""

    def __init__(self, run_dir: Path, srun: Sequence[str], spec: JobSpec, environ: dict[str, str]) -> None:
        self.run_dir, self.srun, self.spec, self.environ = run_dir, list(srun), spec, environ
        self.job_id = environ["SLURM_JOB_ID"]
        self.restart = int(environ.get("SLURM_RESTART_COUNT") or 0)
        self.allocation = parse_hostlist(environ["SLURM_JOB_NODELIST"])
        self.batch_node = environ.get("SLURMD_NODENAME") or socket.gethostname()
        previous = read_summary(run_dir)
        recorded = previous.fields().get("excluded_nodes") if previous is not None else None
        self.excluded: list[str] = [n for n in recorded if isinstance(n, str)] if isinstance(recorded, list) else []
        self.stopping = False
        self._slurmd_port: int | None = None
        self.step_nodes: tuple[str, ...] = ()
        self.guardian: subprocess.Popen[bytes] | None = None

    # -- the loop ----------------------------------------------------------------------------------------------
    def run(self) -> int:
        self.install_handlers()
        self.blame_previous_start()
        try:
            return self.supervise()
        finally:
            self.write_record(ended=True)
            self.stop_guardian()

    def supervise(self) -> int:
        res = self.spec.resources
        healthy = [n for n in self.allocation if n not in self.excluded]
        nodes = healing.choose_nodes(healthy, [], nodes=res.nodes, min_nodes=res.fewest_nodes, fits=self.fits)
        if nodes is None:
            return self.requeue_or_fail(f"{len(healthy)} healthy nodes left, min_nodes is {res.fewest_nodes}")
        attempt = 0
        while True:
            step = self.start(nodes, attempt)
            outcome = self.watch(step)
            if outcome.exit_code == 0 or self.stopping or not self.job_running():
                return outcome.exit_code or 0
            next_nodes = self.after_failure(outcome)
            if isinstance(next_nodes, int):
                return next_nodes
            nodes, attempt = next_nodes, attempt + 1

    def after_failure(self, outcome: healing.StepOutcome) -> tuple[str, ...] | int:
        """Blame, decide, record and say; the next step's nodes, or the batch step's exit status."""
        failed = outcome.exit_code or 1
        res = self.spec.resources
        found = healing.blame(outcome)
        decision = healing.decide(
            found,
            step_nodes=outcome.nodes,
            allocation=self.allocation,
            excluded=self.excluded,
            batch_node=self.batch_node,
            nodes=res.nodes,
            min_nodes=res.fewest_nodes,
            fits=self.fits,
        )
        if found is None:
            say(f"the training step failed (exit {outcome.exit_code}) and no node is to blame; the job ends")
            return failed
        checkpoint, step = latest_checkpoint_step(self.run_dir), self.failed_step(outcome)
        failures = self.record(found, decision, checkpoint, step)
        loop = healing.crash_loop(failures, self.spec.signals.crash_loop_attempts)
        if loop is not None and decision.action != "fail":
            decision = healing.Decision(
                "fail",
                excluded=decision.excluded,
                why=f"crash loop: {len(loop)} attempts in a row ended without a checkpoint newer than "
                f"{'step ' + str(checkpoint) if checkpoint is not None else 'the start'} "
                f"({healing.describe_attempts(loop)})",
            )
            self.record_outcome(decision)
        say(healing.log_line(found, step, decision, checkpoint))
        self.excluded = list(decision.excluded)
        if decision.action == "continue":
            return decision.nodes
        if decision.action == "requeue":
            return self.requeue_or_fail(decision.why)
        return failed

    # -- a start of the job whose batch node died ----------------------------------------------------------------
    def blame_previous_start(self) -> None:
        """When this job's previous start ended with its batch step (the record says it never ended) and
        Slurm now marks that node bad, the node went down with it: record it, and keep it out."""
        record = read_json_object(supervisor_record_path(self.run_dir)) or {}
        node, restart = record.get("batch_node"), record.get("restart")
        if record.get("job_id") != self.job_id or record.get("ended") or not isinstance(node, str):
            return
        if not isinstance(restart, int) or restart >= self.restart or node in self.excluded:
            return
        state = self.node_states([node]).get(node)
        if state is None or not healing.bad_node_state(state):
            return
        found = healing.Blame(node, f"the batch step's node went down (Slurm marks it {state})")
        self.excluded.append(node)
        decision = healing.Decision("requeue", excluded=tuple(self.excluded), why="Slurm requeued the job")
        checkpoint = latest_checkpoint_step(self.run_dir)
        step = max((b.step for b in read_heartbeats(self.run_dir) if b.node == node), default=None)
        self.record(found, decision, checkpoint, step)
        say(healing.log_line(found, step, decision, checkpoint))

    def write_record(self, *, ended: bool = False, batch_node: str | None = None) -> None:
        """What the guardian and a later start of this job need to know about this one (:meth:`blame_previous_start`,
        ``runtime/guardian.py``); its ``time`` says the supervisor is alive."""
        record = {
            "job_id": self.job_id,
            "restart": self.restart,
            "batch_node": batch_node or self.batch_node,
            "ended": ended,
            "nodes": list(self.step_nodes),
            "time": round(time.time(), 3),
        }
        try:
            write_json_atomic(supervisor_record_path(self.run_dir), record)
        except OSError as exc:
            say(f"could not write {supervisor_record_path(self.run_dir)}: {exc}")

    # -- one step ----------------------------------------------------------------------------------------------
    def start(self, nodes: tuple[str, ...], attempt: int) -> RunningStep:
        self.step_nodes = nodes
        self.write_record()
        self.start_guardian()
        tasks = self.spec.tasks_per_node
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
        if len(nodes) != self.spec.resources.nodes:
            env[healing.STEP_NODES_VAR] = str(len(nodes))
        if attempt:  # the last step's rendezvous port may still be held
            env["MASTER_PORT"] = str(derive_master_port(f"{self.job_id}.{self.restart}.{attempt}"))
        # A hang in this step reports again, also after a requeue (same job id); a claim after the step is this one's.
        hang_claim_path(self.run_dir, self.job_id).unlink(missing_ok=True)
        process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        step = RunningStep(process, nodes, time.time())
        step.start_tee()
        return step

    def watch(self, step: RunningStep) -> healing.StepOutcome:
        """Wait for the step to end, or end it once a node is found lost."""
        reported_at: float | None = None
        lost: dict[str, str] = {}
        probed: dict[str, float] = {}
        recorded = time.monotonic()
        while step.process.poll() is None:
            time.sleep(POLL_S)
            if time.monotonic() - recorded >= RECORD_EVERY_S:
                self.write_record()
                recorded = time.monotonic()
            if self.stopping:
                continue
            failure = first_task_failure(step.srun_text)
            if failure is not None and reported_at is None:
                reported_at = time.monotonic()
            suspects = set(self.silent_nodes(step))
            if reported_at is not None and time.monotonic() - reported_at >= SETTLE_S:
                suspects |= set(step.nodes) - self.reported_nodes(step.srun_text)
            suspects |= set(healing.node_failures_in(step.srun_text))
            for node in sorted(suspects):
                if time.monotonic() - probed.get(node, 0.0) < PROBE_TIMEOUT_S:
                    continue
                probed[node] = time.monotonic()
                why = self.lost_reason(node)
                if why is not None:
                    lost[node] = why
            if lost:
                self.end_step(step)
                break
        step.process.wait()
        if step.process.returncode == 0 and not lost:
            return healing.StepOutcome(nodes=step.nodes, exit_code=0)
        return self.outcome(step, lost)

    def outcome(self, step: RunningStep, lost: dict[str, str]) -> healing.StepOutcome:
        ended_by_us = bool(lost)
        text = step.srun_text
        for node in healing.node_failures_in(text):
            lost.setdefault(node, "srun reports a node failure")
        for node, state in self.node_states(step.nodes).items():
            if node in step.nodes and healing.bad_node_state(state):
                lost.setdefault(node, f"Slurm marks it {state}")
        return healing.StepOutcome(
            nodes=step.nodes,
            exit_code=None if ended_by_us else step.process.returncode,
            task_failures=tuple(_task_failures(text)),
            lost_nodes=lost,
            silent_nodes=frozenset(self.silent_nodes(step)),
            hung=self.hung_rank(),
        )

    def end_step(self, step: RunningStep) -> None:
        """Kill the step's tasks on the nodes that still answer, then the srun client waiting for the lost one."""
        try:
            listed = run_slurm(["squeue", "-h", "-s", "-j", self.job_id, "-o", "%i %j"]).splitlines()
        except SlurmCommandError:
            listed = []
        for line in listed:
            step_id, _, name = line.partition(" ")
            if step_id.rpartition(".")[2].isdigit() and name.strip() != guardian.STEP_NAME:
                try:
                    run_slurm(["scancel", "--signal=KILL", step_id])
                except SlurmCommandError:
                    pass
        try:
            step.process.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            step.process.kill()

    # -- the guardian --------------------------------------------------------------------------------------------
    def start_guardian(self) -> None:
        """Watch this node from another one (``runtime/guardian.py``): a spare first, else a training node."""
        if not START_GUARDIAN or (self.guardian is not None and self.guardian.poll() is None):
            return
        others = [n for n in self.allocation if n not in self.excluded and n != self.batch_node]
        others.sort(key=lambda n: n in self.step_nodes)  # a spare first: it has the most room
        if not others:
            return
        log = str(submitit_dir(self.run_dir) / "%j_guardian_log.err")
        argv = [
            self.srun[0],
            "--overlap",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={others[0]}",
            f"--job-name={guardian.STEP_NAME}",
            f"--output={log}",
            f"--error={log}",
            "--open-mode=append",  # a later start's guardian keeps what this one said
            sys.executable,
            "-m",
            "hpctrain.runtime.guardian",
            str(self.run_dir),
            self.batch_node,
        ]
        self.guardian = subprocess.Popen(argv, env=self.environ, stdin=subprocess.DEVNULL)

    def stop_guardian(self) -> None:
        """The record says ended: the guardian leaves within its poll; else its srun is ended."""
        if self.guardian is None:
            return
        try:
            self.guardian.wait(timeout=2 * guardian.POLL_S + STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.guardian.terminate()
            try:
                self.guardian.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.guardian.kill()

    # -- evidence ----------------------------------------------------------------------------------------------
    def silent_nodes(self, step: RunningStep) -> list[str]:
        """Nodes of the step whose every rank wrote a heartbeat in this step and then stopped."""
        now = time.time()
        limit = SILENT_BEATS * self.spec.distributed.heartbeat_interval_s
        beats = [b for b in read_heartbeats(self.run_dir) if b.time >= step.started and b.node in step.nodes]
        by_node: dict[str, list[float]] = {}
        for beat in beats:
            by_node.setdefault(beat.node, []).append(beat.age_s(now))
        return [node for node, ages in by_node.items() if min(ages) > limit]

    @staticmethod
    def reported_nodes(text: str) -> set[str]:
        return {failure.node for failure in _task_failures(text)}

    def lost_reason(self, node: str) -> str | None:
        """Why ``node`` is gone, or None while its slurmd answers."""
        try:
            address = socket.gethostbyname(node)
        except OSError:
            return None  # cannot tell
        try:
            with socket.create_connection((address, self.slurmd_port()), timeout=PROBE_TIMEOUT_S):
                return None
        except OSError:
            return "its slurmd does not answer"

    def slurmd_port(self) -> int:
        if self._slurmd_port is None:
            self._slurmd_port = DEFAULT_SLURMD_PORT
            try:
                for line in run_slurm(["scontrol", "show", "config"]).splitlines():
                    key, _, value = line.partition("=")
                    if key.strip() == "SlurmdPort" and value.strip().isdigit():
                        self._slurmd_port = int(value.strip())
            except SlurmCommandError:
                pass
        return self._slurmd_port

    def node_states(self, nodes: Sequence[str]) -> dict[str, str]:
        try:
            out = run_slurm(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %T"])
        except SlurmCommandError:
            return {}
        return dict(line.split(None, 1) for line in out.splitlines() if len(line.split()) == 2)

    def hung_rank(self) -> healing.HungRank | None:
        """The hang watchdog's culprit when it ended this step: its report was claimed since the step started."""
        if not hang_claim_path(self.run_dir, self.job_id).exists():
            return None
        summary = read_summary(self.run_dir)
        if summary is None or summary.hung_rank is None or summary.hung_node is None:
            return None
        if summary.model_extra.get("hang_job_id") != self.job_id:
            return None
        step = summary.model_extra.get("hung_step")
        return healing.HungRank(
            summary.hung_rank,
            summary.hung_node,
            phase=summary.hung_phase,
            step=step if isinstance(step, int) else None,
            frozen_s=summary.hung_frozen_s,
        )

    def failed_step(self, outcome: healing.StepOutcome) -> int | None:
        steps = [b.step for b in read_heartbeats(self.run_dir) if b.node in outcome.nodes]
        return max(steps) if steps else None

    def job_running(self) -> bool:
        try:
            record = run_slurm(["scontrol", "--oneliner", "show", "job", self.job_id])
        except SlurmCommandError:
            return True  # cannot tell: carry on as if it does
        return "JobState=RUNNING" in record

    # -- what the run records ----------------------------------------------------------------------------------
    def fits(self, count: int) -> bool:
        """Whether the run's global batch splits over ``count`` nodes' ranks (always, for user code)."""
        spec = self.spec
        if spec.entrypoint is not None or count == spec.resources.nodes:
            return True
        gpus_per_task = (spec.resources.gpus_per_node or 0) // spec.tasks_per_node
        fewer = BatchLayout.of(spec.trainer, tasks=count * spec.tasks_per_node, gpus_per_task=gpus_per_task)
        return micro_batch_problem(spec.batch_layout.processes, fewer.processes, strategy=spec.trainer.strategy) is None

    def record(
        self, found: healing.Blame, decision: healing.Decision, checkpoint: int | None, step: int | None
    ) -> list[dict[str, Any]]:
        """Add the failure to summary.json; every node failure of the run so far."""
        summary = read_summary(self.run_dir)
        fields = summary.fields() if summary is not None else {}
        failures = [f for f in fields.get("node_failures") or [] if isinstance(f, dict)]
        failures.append(
            {
                "node": found.node,
                "step": step,
                "checkpoint_step": checkpoint,
                "reason": found.reason,
                "action": decision.action,
                "nodes": list(decision.nodes),
                "job_id": self.job_id,
                "time": round(time.time(), 3),
            }
        )
        fields.update(node_failures=failures, excluded_nodes=list(decision.excluded))
        if decision.action == "continue":
            fields["status"] = "running"
        write_summary(self.run_dir, fields)
        return failures

    def record_outcome(self, decision: healing.Decision) -> None:
        summary = read_summary(self.run_dir)
        fields = summary.fields() if summary is not None else {}
        failures = [f for f in fields.get("node_failures") or [] if isinstance(f, dict)]
        if failures:
            failures[-1]["action"] = decision.action
        fields.update(node_failures=failures, status="failed", error=decision.why)
        write_summary(self.run_dir, fields)

    def requeue_or_fail(self, why: str) -> int:
        """Requeue with the excluded nodes kept out (``ExcNodeList``), or fail when requeues are spent or off."""
        signals = self.spec.signals
        if not signals.requeue_on_preemption or self.restart >= signals.max_requeues:
            self.record_outcome(healing.Decision("fail", why=f"{why}; no requeue left (signals.max_requeues)"))
            return 1
        try:
            run_slurm(["scontrol", "requeue", self.job_id])
        except SlurmCommandError as exc:
            say(f"could not requeue: {exc}")
            self.record_outcome(healing.Decision("fail", why=f"{why}; requeue failed: {exc}"))
            return 1
        self.exclude_from_next_start()
        return 0

    def exclude_from_next_start(self) -> None:
        """``ExcNodeList`` for the requeued job. Slurm takes it only from a pending job ("Job is no longer
        pending execution" before the requeue, measured on 22.05); this process is the batch step's main
        one (``exec``), so the requeue's SIGTERM leaves it KillWait to say it."""
        if not self.excluded:
            return
        update = ["scontrol", "update", f"JobId={self.job_id}", f"ExcNodeList={','.join(self.excluded)}"]
        try:
            run_slurm(update)
        except SlurmCommandError as exc:
            say(f"could not keep {','.join(self.excluded)} out of the next start: {exc}")

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


def _task_failures(text: str) -> list[TaskFailure]:
    """Every task failure srun reported, first first."""
    found = []
    for line in text.splitlines(keepends=True):
        failure = first_task_failure(line)
        if failure is not None:
            found.append(failure)
    return found


def load_spec(run_dir: Path) -> JobSpec:
    data, _ = read_spec_file(spec_path(run_dir))
    return JobSpec.model_validate(data)


def main(argv: Sequence[str], *, environ: dict[str, str] | None = None, execv: Callable[..., Any] = os.execvp) -> int:
    if "--" not in argv or argv.index("--") != 1 or len(argv) < 3:
        say("usage: python -m hpctrain.runtime.supervisor RUN_DIR -- srun ARGS... COMMAND")
        return 2
    run_dir, srun = Path(argv[0]), list(argv[2:])
    environ = dict(os.environ if environ is None else environ)
    try:
        spec = load_spec(run_dir)
        supervisor = Supervisor(run_dir, srun, spec, environ)
    except Exception as exc:  # no supervision is better than no job: run the step once, as without it
        say(f"cannot supervise ({type(exc).__name__}: {exc}); running the step once")
        execv(srun[0], srun)
        return 1
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
