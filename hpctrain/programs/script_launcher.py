"""What submitit runs on every task of a ``script:`` job: the user's script, with hpctrain's guarantees.

``ScriptLauncher`` is the task wrapper, one per rank (``script.per: rank``)
or per node (``per: node``); under ``launcher: torchrun`` each rank's
wrapper is torchrun's program (``programs/script_torchrun.py``). Its story:

1. the stop handling is installed first (:meth:`ScriptLauncher.install_stop_handling`,
   the one place it happens), before the spec is even validated, and takes over
   what ``runtime/stop_signals.py`` counted since the task's first Python: a
   time-limit warning or a preemption in the task's first moments is kept, and a
   script asked to stop before it started is never started;
2. a start of a job that already completed its run ends at once
   (``launcher.end_if_completed``); the task's rank layout (``TaskEnv``), this
   start's number (``{restart}``),
   the summary (``running``, main task only), the reaper (cleanup.py);
3. a multi-node start probes its nodes first (``healing/script_burn_in.py``: the burn-in, which may end the
   task to take a sick node out); the script runs in its own session (``runtime/script/child.py``) with the
   torchrun and hpctrain variables (``runtime/script/command.py``), in the run
   directory or ``script.workdir``;
4. a stop request sends ``script.stop_signal`` to its process group, waits for
   it within the stop timeout, and kills the group after that;
5. the end: exit 0 without a stop is ``completed`` (and global rank 0 sets
   ``Requeue=0``: ``requeue.keep_ended``); any end after a stop is
   ``stopped`` and goes through ``runtime/requeue.py``'s decision exactly as the
   trainer's stop does (global rank 0 requeues on a time limit, Slurm on a
   preemption); any other end is ``failed``, recorded with the first failed
   process (``runtime/script/outcome.py``), and the task fails so that
   ``srun --kill-on-bad-exit`` ends the others.

Importing this module imports no torch, and neither does the wrapper: the script brings its own
(the burn-in's torch runs in a child process, ``healing/script_burn_in.py``).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hpctrain.contract.cancel_marker import cancel_marker_paths
from hpctrain.contract.file_writes import write_atomic
from hpctrain.contract.rundir import hang_claim_path, heartbeat_path, read_run_info
from hpctrain.contract.script_env import ScriptCode
from hpctrain.contract.starts import process_began
from hpctrain.contract.summary import read_summary, write_summary
from hpctrain.errors import DistributedSetupError, RunDirError
from hpctrain.healing import script_burn_in
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.node_health import STEP_ID_VAR
from hpctrain.programs.launcher import (
    ALLOW_LOOPBACK_MASTER_VAR,
    TaskLauncher,
    end_if_completed,
    record_this_start,
    report_failure,
)
from hpctrain.runtime import chain_start, stop_signals
from hpctrain.runtime.context import TaskEnv, configure_logging
from hpctrain.runtime.master import check_master_address
from hpctrain.runtime.script import command as script_command
from hpctrain.runtime.script.child import ExitStatus, OutputTail, ScriptProcess, Silence, ignored_signals
from hpctrain.runtime.script.outcome import (
    PEER_WAIT_S,
    RECORD_WAIT_S,
    FailureWatch,
    PeerFailed,
    ScriptExit,
    ScriptFailed,
    ScriptSummary,
    StepReport,
    failure_fields,
    record_exit,
    recorded_exits,
)
from hpctrain.runtime.stop import StopRequest, install_handlers
from hpctrain.runtime.task_env import derive_task_env, rank_hint
from hpctrain.runtime.tracker_relay import LAST_SYNC_WAIT_S, stop_live_sender

POLL_S = 0.05
LEFTOVER_WAIT_S = 2.0  # the script ended: its group's remaining processes get this long after SIGTERM
REPORT_WAIT_S = 1.5  # a SIGTERM may be the step ending after a failure: how long rank 0 looks for its report


class ScriptLauncher(TaskLauncher):
    """The callable submitit runs once per task of a script job; returns the task's outcome."""

    def __init__(
        self,
        spec_data: dict[str, Any],
        run_dir: str,
        code: dict[str, Any],
        preempt_grace_s: float | None = None,
    ) -> None:
        super().__init__(spec_data, run_dir, None)
        self.code = code  # ScriptCode's fields (plain data: the pickle must not depend on class layout)
        self.preempt_grace_s = preempt_grace_s

    # -- 1. stop handling, first ---------------------------------------------------------------------------
    def install_stop_handling(self) -> StopRequest:
        """Route the time-limit signal, SIGTERM and SIGINT to a stop request. The first thing the task does.

        The spec is not validated yet: the signal's name is read from its raw data (the default when absent
        or odd; validation then fails the task anyway). The cancel marker's job ids are set once known.
        """
        raw = self.spec_data.get("signals") if isinstance(self.spec_data, dict) else None
        name = raw.get("timeout_signal") if isinstance(raw, dict) else None
        timeout_signal = name if name in ("USR1", "USR2") else "USR2"
        stop = StopRequest(cancel_markers=cancel_marker_paths(self.run_dir))
        install_handlers(stop, timeout_signal)
        stop_signals.hand_over(stop, timeout_signal)  # what came since the task's first Python
        signal.signal(signal.SIGINT, lambda signum, frame: stop.note_term())
        return stop

    def __call__(self) -> dict[str, Any]:
        stop_signals.listen()  # first: what Slurm sent since the task's first Python is counted (stop_signals.py)
        began = process_began(time.time())  # this start's cost counts from here (contract/starts.py)
        stop = self.install_stop_handling()
        rank = rank_hint(os.environ)
        env: TaskEnv | None = None
        try:
            spec = JobSpec.model_validate(self.spec_data)
            os.environ.update(spec.env)
            spec = self.step_spec(spec)
            env = derive_task_env(os.environ, spec_master_port=spec.distributed.master_port)
            stop.job_ids = tuple(env.job_aliases)
            self._env, rank = env, str(env.global_rank)
            configure_logging(env)
            restart = self.restart_number(env)
            # Slurm started a finished job again (not: this start's rank 0 finished first)
            end_if_completed(self.run_dir, env, self.exit_without_result, this_start=restart)
            self.after = chain_start.begin(
                spec, self.run_dir, is_main=env.is_main, exit_process=self.exit_without_result
            )
            if env.is_main:
                record_this_start(self.run_dir, env, began)
            result = self.run_script(spec, env, stop, restart)
        except BaseException as exc:
            if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
                report_failure(rank, exc)
                if env is not None and not isinstance(exc, ScriptFailed):
                    self.setup_failed(env, exc)
            raise
        return {"rank": env.global_rank, "hostname": socket.gethostname(), "result": result}

    # -- 2-5 ------------------------------------------------------------------------------------------------
    def run_script(self, spec: JobSpec, env: TaskEnv, stop: StopRequest, restart: int) -> dict[str, Any]:
        """``restart``: this start's number (``{restart}``, :meth:`restart_number`)."""
        script = spec.script
        assert script is not None
        check_tasks(spec, env)
        self.attempt = f"{env.job_id}.{restart}"
        self.summary = ScriptSummary(Path(self.run_dir), self.facts(spec, env, restart), enabled=env.is_main)
        self.summary.write("running")
        self.watch = None
        report = self.report_path(env)
        if env.is_main and report is not None:
            self.watch = FailureWatch(StepReport(report), Path(self.run_dir), self.attempt, self.summary).start()
        self.start_reaper()
        self.start_tracker_sender(spec, env)
        check_master_address(env, allow_loopback=os.environ.get(ALLOW_LOOPBACK_MASTER_VAR) == "1")

        code = ScriptCode(**self.code)
        place = script_command.layout(env, spec)
        values = {**script_command.placeholder_values(place, self.run_dir, code, restart), **getattr(self, "after", {})}
        argv = script_command.command(sys.executable, code, script, values)
        cwd = script_command.workdir(script, values, self.run_dir)
        Path(cwd).mkdir(parents=True, exist_ok=True)
        child_env = script_command.environ(
            os.environ, place, spec, run_dir=self.run_dir, job_id=env.job_id, restart=restart, code=code,
            cpu_count=os.cpu_count(), local=env.source == "submitit-local",
        )  # fmt: skip
        who = f"rank {env.global_rank}" if place.rank is not None else f"node task {env.global_rank}"
        self.who = f"{who} on {env.hostname}"
        if stop.local_reason is None:  # a multi-node start probes its nodes first; may end this task
            script_burn_in.before_script(
                spec, env, self.run_dir, stop, exit_process=self.exit_without_result, say=self.say
            )
        if stop.local_reason is not None:  # asked to stop before the script started: it never starts
            self.say(f"stop ({stop.local_reason}) before the script started; it is not started")
            return self.stopped(spec, env, stop, None)
        self.say(f"running {' '.join(argv)} in {cwd} (start {restart})")
        process = ScriptProcess(argv, child_env, cwd, ignored_signals(spec.signals.timeout_signal, script.stop_signal))
        tail = OutputTail()
        tail.mark()
        process.start()
        status, hung_s = self.supervise(process, spec, env, stop)
        if hung_s is not None:
            return self.hung(spec, env, process, hung_s, tail)
        self.end_leftovers(process)
        if stop.local_reason is not None:
            return self.stopped(spec, env, stop, status)
        if status.ok:
            return self.completed(env)
        return self.failed(spec, env, status, tail.lines())

    def supervise(
        self, process: ScriptProcess, spec: JobSpec, env: TaskEnv, stop: StopRequest
    ) -> tuple[ExitStatus, float | None]:
        """Wait for the script; pass a stop on and end it when its time is up. (exit status, silent seconds
        when the silence watchdog ended it)."""
        script = spec.script
        assert script is not None
        stop_signal = signal.Signals[f"SIG{script.stop_signal}"]
        silence_limit = script.silence_timeout_s or None
        silence = Silence(heartbeat_path(Path(self.run_dir), env.global_rank)) if silence_limit else None
        reason: str | None = None
        deadline: float | None = None
        killed = False
        while (status := process.poll()) is None:
            now_reason = stop.local_reason
            if now_reason is not None and now_reason != reason:
                if reason is None:
                    process.signal_group(stop_signal)
                reason = now_reason
                # Said at once: Slurm may SIGKILL every process KillWait later, before the script has exited.
                self.summary.write("stopped", stop_reason=reason)
                timeout = script_command.stop_timeout_s(reason, spec, self.preempt_grace_s)
                deadline = None if timeout is None else time.monotonic() + timeout
                limit = f"; it has {timeout:.0f} s to exit" if timeout is not None else ""
                self.say(f"stopping ({reason}): sent SIG{script.stop_signal} to the script{limit}")
            if deadline is not None and not killed and time.monotonic() >= deadline:
                self.say(f"the script did not exit within its stop timeout: killing its processes ({reason})")
                process.kill_group()
                killed = True
            if silence is not None and reason is None:
                silent = silence.seconds()
                if silent is not None and silent >= silence_limit:
                    return ExitStatus(None, "SIGKILL"), silent
            time.sleep(POLL_S)
        return status, None

    # -- the outcomes -----------------------------------------------------------------------------------------
    def completed(self, env: TaskEnv) -> dict[str, Any]:
        """Global rank 0's script exited 0: the run completed, unless another task's failed meanwhile (srun's
        report, or an exit record: a local run has no srun; looked at after the write too, for the one that
        failed while this was written -- that one writes only over a summary that already says completed)."""
        if self.watch is not None and self.watch.report.failures():
            self.watch.settle(None, wait_s=RECORD_WAIT_S)
            raise PeerFailed("another task's script failed first (summary.json names it)")
        for attempt in range(2):
            others = recorded_exits(Path(self.run_dir), self.attempt) if env.is_main else []
            if others:
                self.summary.write("failed", **failure_fields(others[0]))
                raise PeerFailed(f"the script of {others[0].who} {others[0].reason}")
            if attempt == 0:
                self.summary.write("completed", exit_code=0)
        from hpctrain.runtime.requeue import keep_ended
        from hpctrain.runtime.slurm_relay import slurm_runner

        keep_ended(env, run=slurm_runner())  # global rank 0: Requeue=0, so Slurm never starts it again
        stop_live_sender(self.sender, wait_s=LAST_SYNC_WAIT_S, ended=True)  # tracking.live: the end goes out too
        return {"status": "completed", "exit_code": 0}

    def failed(self, spec: JobSpec, env: TaskEnv, status: ExitStatus, stderr: list[str]) -> dict[str, Any]:
        per_rank = spec.script is not None and spec.script.per == "rank"
        own = ScriptExit(
            env.global_rank,
            env.global_rank if per_rank else None,
            env.hostname,
            status.code,
            status.signal_name,
            status.describe(),
            stderr,
        )
        record_exit(Path(self.run_dir), self.attempt, own)
        self.say(f"the script {own.reason}")
        self.save_failure_marker(own)
        if env.is_main:
            if self.watch is not None:
                self.watch.settle(own, wait_s=PEER_WAIT_S if own.peer else 0.0)
            else:
                self.summary.write("failed", **failure_fields(own))
            if status.code is not None and not own.peer:  # its own error, not a lost peer: no requeue helps
                from hpctrain.runtime.requeue import keep_ended
                from hpctrain.runtime.slurm_relay import slurm_runner

                keep_ended(env, run=slurm_runner())  # with --requeue=expedite: ended, not held (docs/preemption.md)
        else:
            self.late_failure(own)
        raise ScriptFailed(
            f"the script of {own.who} {own.reason}",
            hint="its last lines are in summary.json and 'hpctrain status RUN'; its log: hpctrain logs RUN --rank N",
        )

    def stopped(self, spec: JobSpec, env: TaskEnv, stop: StopRequest, status: ExitStatus | None) -> dict[str, Any]:
        reason = stop.local_reason or "preempted"
        if self.watch is not None and reason == "preempted" and self.watch.reported(REPORT_WAIT_S):
            # srun (or torchrun) ends the other tasks with SIGTERM when one fails: that is no preemption
            self.watch.settle(None, wait_s=RECORD_WAIT_S)
            raise PeerFailed("another task's script failed first (summary.json names it)")
        exit_fields = {"exit_code": status.code} if status is not None and status.code is not None else {}
        self.summary.write("stopped", stop_reason=reason, **exit_fields)
        from hpctrain.runtime.requeue import finish_after_stop
        from hpctrain.runtime.slurm_relay import slurm_runner

        # No process group joins the wrappers: each decides alone, and only global rank 0 acts on Slurm.
        finish_after_stop(
            reason,
            env,
            spec.signals,
            stop,
            agree=lambda outcome: outcome,
            run=slurm_runner(),
            exit_process=self.exit_without_result,
        )
        return {"status": "stopped", "stop_reason": reason}

    def hung(
        self, spec: JobSpec, env: TaskEnv, process: ScriptProcess, silent_s: float, tail: OutputTail
    ) -> dict[str, Any]:
        """The silence watchdog fired: end the script, report the hang once per job, and fail."""
        reason = f"wrote nothing for {silent_s:.0f} s (script.silence_timeout_s)"
        self.say(f"the script {reason}: ending it as hung")
        process.kill_group()
        claim = hang_claim_path(Path(self.run_dir), env.job_id)
        try:
            claim.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(claim, "", exclusive=True, mode=0o644)
            first = True
        except OSError:
            first = False
        if first:
            previous = read_summary(Path(self.run_dir))
            fields = previous.fields() if previous is not None else {}
            fields.update(
                status="failed",
                hung_rank=env.global_rank,
                hung_node=env.hostname,
                hung_phase="silent",
                failed_reason=f"the script of {self.who} {reason}",
                failed_stderr=tail.lines(),
            )
            write_summary(Path(self.run_dir), fields)
            self.summary.failure_recorded = True
        raise ScriptFailed(
            f"the script of {self.who} {reason}", hint="see its stack or log: hpctrain logs RUN --rank N"
        )

    # -- helpers ----------------------------------------------------------------------------------------------
    def facts(self, spec: JobSpec, env: TaskEnv, restart: int) -> dict[str, Any]:
        script = spec.script
        assert script is not None
        per_node = script.per == "node"
        return {
            "name": spec.name,
            "job_id": env.job_id,
            "script": script.program,
            "per": script.per,
            "world_size": env.world_size * (spec.tasks_per_node if per_node else 1),
            "num_nodes": env.world_size if per_node else env.num_nodes,
            "hostnames": list(env.hostnames),
            "restarts": restart,
        }

    def restart_number(self, env: TaskEnv) -> int:
        """``{restart}``: earlier jobs of the run, this job's requeues, a healing job's earlier steps."""
        try:
            job_ids = read_run_info(Path(self.run_dir)).get("job_ids")
        except RunDirError:
            job_ids = None
        attempt = os.environ.get(STEP_ID_VAR, "").rpartition(".")[2]  # the supervisor's JOB.RESTART.ATTEMPT
        steps = int(attempt) if attempt.isdigit() else 0
        return script_command.restart_count(job_ids, env.job_id, env.restart_count, steps)

    def report_path(self, env: TaskEnv) -> Path | None:
        """Where srun reports failed tasks: the batch step's stderr, which is global rank 0's own (Slurm only)."""
        log = self.step_log(env)
        return log.path if log is not None else None

    def end_leftovers(self, process: ScriptProcess) -> None:
        """The script ended: what it left in its group (workers of a crashed script) ends now, not at the reaper."""
        if process.signal_group(signal.SIGTERM):
            deadline = time.monotonic() + LEFTOVER_WAIT_S
            while time.monotonic() < deadline and process.signal_group(0):
                time.sleep(POLL_S)
            process.kill_group()

    def late_failure(self, own: ScriptExit) -> None:
        """A failure after global rank 0 finished and wrote ``completed``: nobody else can say it."""
        previous = read_summary(Path(self.run_dir))
        if previous is not None and previous.status == "completed":
            fields = {key: value for key, value in previous.fields().items() if key != "exit_code"}
            write_summary(Path(self.run_dir), {**fields, "status": "failed", **failure_fields(own)})

    def save_failure_marker(self, own: ScriptExit) -> None:
        """For a launcher that watches its workers (torchrun's node task); nothing under srun."""

    def setup_failed(self, env: TaskEnv, exc: BaseException) -> None:
        """The task failed before (or while starting) its script: global rank 0 says so in summary.json."""
        summary = getattr(self, "summary", None)
        if summary is not None and env.is_main:
            summary.write(
                "failed",
                error=f"{type(exc).__name__}: {exc}",
                failed_rank=env.global_rank,
                failed_node=env.hostname,
                failed_reason=f"{type(exc).__name__}: {exc}",
            )

    def say(self, text: str) -> None:
        print(f"hpctrain: {getattr(self, 'who', 'task')}: {text}", file=sys.stderr, flush=True)


def check_tasks(spec: JobSpec, env: TaskEnv) -> None:
    """The job started as many tasks as the spec asked for: one per rank, or one per node."""
    if not (env.under_slurm or env.source == "submitit-local"):
        return
    per_node = spec.script is not None and spec.script.per == "node"
    expected = spec.resources.nodes if per_node else spec.world_size
    if env.world_size != expected:
        what = f"{spec.resources.nodes} nodes" + ("" if per_node else f" x {spec.tasks_per_node}")
        raise DistributedSetupError(
            f"the spec asks for {expected} script processes ({what}) but {env.world_size} tasks were started",
            hint="submit with `hpctrain submit` so the Slurm request matches the spec",
        )


def script_code_json(code: ScriptCode) -> dict[str, Any]:
    """What a launcher carries of :class:`ScriptCode` (plain data)."""
    return asdict(code)
