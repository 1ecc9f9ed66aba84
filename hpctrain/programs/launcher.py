"""What submitit runs on every task: spec -> task environment -> process group -> user code.

``TaskLauncher`` is pickled on the login node and called on each compute
task, so importing this module must not import torch; torch comes in with
``hpctrain.runtime.process_group`` inside ``__call__``.

Stop signals count from the task's first Python (``stop_signals.py``): the
launcher listens first thing, hands what came to the ``StopRequest`` as soon
as it exists, and once the process group is up -- the first moment the ranks
can agree -- stops before the entry point or trainer runs if a stop came
during set-up (or Slurm preempted the job before its tasks existed). A start
of a job whose run this very job completed ends at once (``requeue.py``).
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from hpctrain.contract.cancel_marker import cancel_marker_paths
from hpctrain.contract.entrypoint import call_text, function_problem
from hpctrain.contract.starts import began_from, process_began, record_start, step_reached
from hpctrain.contract.summary import Summary, read_summary, write_summary
from hpctrain.errors import DistributedSetupError, HpctrainError
from hpctrain.jobspec.models import JobSpec
from hpctrain.runtime import chain_start, failures, heartbeat, stop_signals
from hpctrain.runtime.cleanup import leave_dataset_mount
from hpctrain.runtime.context import TaskContext, TaskEnv, configure_logging, register_context
from hpctrain.runtime.master import check_master_address
from hpctrain.runtime.run_summary import finish_summary
from hpctrain.runtime.stop import StopReason, StopRequest, install_handlers
from hpctrain.runtime.task_env import derive_task_env, export_torchrun_env, rank_hint, thread_env
from hpctrain.runtime.tracker_relay import LAST_SYNC_WAIT_S, start_live_sender, stop_live_sender

# Set to 1 on test clusters whose "nodes" are loopback aliases of one machine.
ALLOW_LOOPBACK_MASTER_VAR = "HPCTRAIN_ALLOW_LOOPBACK_MASTER"

UserCode = Callable[..., Any]


class TaskLauncher:
    """The callable submitit runs once per task; returns this rank's result."""

    sender: subprocess.Popen | None = None  # tracking.live's, started by global rank 0

    def __init__(self, spec_data: dict[str, Any], run_dir: str, code_root: str | None = None) -> None:
        self.spec_data = spec_data
        self.run_dir = run_dir
        self.code_root = code_root  # the run's copy of the entry point's code (code_snapshot.py)

    def __call__(self) -> dict[str, Any]:
        stop_signals.listen()  # first: what Slurm sent since the task's first Python is counted now
        began = process_began(time.time())  # this start's cost counts from here (contract/starts.py)
        rank = rank_hint(os.environ)
        try:
            spec = JobSpec.model_validate(self.spec_data)
            os.environ.update(spec.env)
            spec = self.step_spec(spec)
            env = derive_task_env(os.environ, spec_master_port=spec.distributed.master_port)
            rank = str(env.global_rank)
            configure_logging(env)
            end_if_completed(self.run_dir, env, self.exit_without_result)
            after = chain_start.begin(spec, self.run_dir, is_main=env.is_main, exit_process=self.exit_without_result)
            if env.is_main:
                record_this_start(self.run_dir, env, began)
            result = self.run(chain_start.fill_entrypoint_args(spec, after), env)
        except BaseException as exc:
            if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
                report_failure(rank, exc)
                self.record_failure(exc)
            raise
        return {"rank": env.global_rank, "hostname": socket.gethostname(), "result": result}

    def step_spec(self, spec: JobSpec) -> JobSpec:
        """The spec on the nodes this step got: fewer than ``resources.nodes`` after a lost node
        (healing/supervisor.py); the trainer keeps the run's global batch (``RUN_MICRO_BATCHES_VAR``)."""
        from hpctrain.jobspec.node_loss import RUN_MICRO_BATCHES_VAR, step_spec

        step = step_spec(spec, os.environ)
        if step is not spec:
            os.environ[RUN_MICRO_BATCHES_VAR] = str(spec.batch_layout.processes)
        return step

    def run(self, spec: JobSpec, env: TaskEnv) -> Any:
        """Set the task up, run the entry point or the trainer, then the post-run hook."""
        self._env, self._step_log = env, self.step_log(env)  # before anything can fail: see record_failure
        if self._step_log is not None:
            failures.FailureWatch(Path(self.run_dir), self._step_log).start()
        monitor = self.start_heartbeats(spec, env)
        ended = False
        try:
            result = self._run_monitored(spec, env, monitor)
            ended = True  # done, or stopped for good: the node's copies of the dataset can go
            stop_live_sender(self.sender, wait_s=LAST_SYNC_WAIT_S, ended=True)  # the run's end goes out too
            return result
        except BaseException:
            if monitor is not None:
                monitor.stop(final_phase=None)  # the heartbeat keeps the phase the rank failed in
            raise
        finally:
            leave_dataset_mount(keep_copies=not ended)

    def _run_monitored(self, spec: JobSpec, env: TaskEnv, monitor: heartbeat.Monitor | None) -> Any:
        stop = listen_for_stop(self.run_dir, env, spec.signals.timeout_signal)
        check_world_size(spec, env)
        export_torchrun_env(env, os.environ)
        os.environ.update(thread_env(os.environ, os.cpu_count()))  # before torch is imported: it reads them once
        check_master_address(env, allow_loopback=os.environ.get(ALLOW_LOOPBACK_MASTER_VAR) == "1")
        # before the group forms: import errors fail fast
        user_code = load_user_code(spec.entrypoint, getattr(self, "code_root", None), spec.entrypoint_args)
        self.start_reaper()
        self.start_tracker_sender(spec, env)

        from hpctrain.runtime.process_group import process_group

        with process_group(env, spec.distributed, use_cuda=spec.uses_gpus) as device:
            if monitor is not None and device.type == "cuda":
                from hpctrain.runtime.gpu_monitor import gpu_sampler

                monitor.gpu = gpu_sampler(device.index or 0, os.environ)
            ctx = TaskContext(env=env, spec=spec, run_dir=Path(self.run_dir), device=device, stop=stop)
            register_context(ctx)  # what hpctrain.task.session() finds
            result = self.train_or_stop(ctx, user_code)
            heartbeat.set_phase("done")  # a requeue's wait for Slurm is not a hang
            if monitor is not None:
                monitor.stop()
            if env.is_main and spec.entrypoint:
                finish_summary(Path(self.run_dir), env.job_id, result)
            self.after_run(ctx, result)
        return result

    def train_or_stop(self, ctx: TaskContext, user_code: UserCode) -> Any:
        """The entry point's or trainer's result; a stop that came during set-up ends the start first,
        before the burn-in too (a start that is ending probes nothing)."""
        reason = stop_before_start(ctx)
        if reason is not None:
            return stopped_before_start(ctx, reason)
        self.burn_in(ctx)
        return user_code(ctx, **(ctx.spec.entrypoint_args if ctx.spec.entrypoint else {}))

    def burn_in(self, ctx: TaskContext) -> None:
        """Probe the step's nodes before training, and take a sick one out (healing/burn_in.py): every
        multi-node Slurm step with ``health.burn_in`` on. May end this process (the step starts again
        without the node, or the job requeues without it)."""
        from hpctrain.jobspec.node_health import burn_in_applies

        if ctx.env.under_slurm and burn_in_applies(ctx.spec, ctx.env.num_nodes):
            from hpctrain.healing.burn_in import run_burn_in

            run_burn_in(ctx, exit_process=self.exit_without_result)

    def start_heartbeats(self, spec: JobSpec, env: TaskEnv) -> heartbeat.Monitor | None:
        """Start this rank's heartbeat thread (with the hang watchdog unless it is off); see docs/hangs.md.

        Heartbeats go only into the run directory, which every node shares; where
        it does not exist on this node, none are written (with a warning).
        """
        run_dir = Path(self.run_dir)
        if not run_dir.is_dir():
            print(f"hpctrain: warning: no heartbeats: {run_dir} does not exist on this node", file=sys.stderr)
            return None
        from hpctrain.runtime.hang import HangWatchdog

        node = env.hostname if env.hostnames else socket.gethostname()  # torchrun names no hosts
        identity = {"rank": env.global_rank, "node": node, "pid": os.getpid(), "job_id": env.job_id}
        dist = spec.distributed
        monitor = heartbeat.Monitor(
            run_dir, identity, interval_s=dist.heartbeat_interval_s, gpu_metrics=env.is_main, first_step=env.is_main
        )
        if dist.hang_timeout is not None:
            monitor.watchdog = HangWatchdog(
                run_dir,
                rank=env.global_rank,
                node=node,
                job_id=env.job_id,
                limit_s=dist.hang_timeout,
                recorder=monitor.recorder,
                flush=monitor.write,
            )
        return monitor.start()

    def step_log(self, env: TaskEnv) -> failures.StepLog | None:
        """Where global rank 0 reads which task failed first (see runtime/failures.py)."""
        return batch_step_log(env)

    def exit_without_result(self, status: int) -> None:
        """End this process at once, with no result for submitit (the job is coming back)."""
        leave_dataset_mount()
        os._exit(status)

    def start_tracker_sender(self, spec: JobSpec, env: TaskEnv) -> None:
        """``tracking.live``: global rank 0 starts the sender, a process of its own (runtime/tracker_relay.py),
        and tells it when the run ended for good (a requeue or a failure leaves it to the parent's death signal)."""
        self.sender = start_live_sender(spec, self.run_dir, is_main=env.is_main)

    def start_reaper(self) -> None:
        """Start the watcher that kills this task's leaked processes once it ends.

        A missing safety net is worth a warning, not a failed task.
        """
        from hpctrain.runtime.cleanup import ensure_task_token, start_reaper

        try:
            start_reaper(ensure_task_token())
        except (RuntimeError, OSError) as exc:
            print(f"hpctrain: warning: leaked processes will not be cleaned up: {exc}", file=sys.stderr)

    def record_failure(self, exc: BaseException) -> None:
        """Global rank 0 names the task that failed first in summary.json (see runtime/failures.py).

        A rank killed by a signal cannot say so itself; rank 0 sees only a broken
        collective, so it reads srun's report of the dead task.
        """
        env = getattr(self, "_env", None)
        if env is None or not env.is_main:
            return
        try:
            failure = failures.first_failure(exc, env.global_rank, env.hostname, getattr(self, "_step_log", None))
            failures.record_failure(Path(self.run_dir), failure, exc)
        except Exception as error:  # the original error matters more
            print(f"hpctrain: could not record the failure in summary.json: {error}", file=sys.stderr)
            return
        if failures.is_own_error(failure, exc, env.global_rank):  # no requeue helps: ended (expedite: not held)
            from hpctrain.runtime.requeue import keep_ended
            from hpctrain.runtime.slurm_relay import slurm_runner

            keep_ended(env, run=slurm_runner())

    def after_run(self, ctx: TaskContext, result: Any) -> None:
        """Requeue, wait for Slurm, or just finish, when the trainer stopped early.

        Runs on every rank with the process group still up: the ranks agree on
        the outcome. Returns only when the job should end normally; then rank 0
        keeps Slurm from starting it again (``requeue.keep_ended``).
        """
        from hpctrain.runtime.requeue import finish_after_stop, keep_ended
        from hpctrain.runtime.slurm_relay import slurm_runner

        # inside a container image, Slurm commands go out through the batch step's relay
        if isinstance(result, dict) and result.get("status") == "stopped":
            finish_after_stop(
                result["stop_reason"],
                ctx.env,
                ctx.spec.signals,
                ctx.stop,
                run=slurm_runner(),
                exit_process=self.exit_without_result,
            )
        keep_ended(ctx.env, run=slurm_runner())


def end_if_completed(
    run_dir: str, env: TaskEnv, exit_process: Callable[[int], object], *, this_start: int | None = None
) -> None:
    """A start of a job whose run this job already completed ends here, before anything costs
    (Slurm 24.05+ may start a finished job again: docs/preemption.md); it says so in its log.

    ``this_start``: a script job's restart number (``{restart}``). Its ranks run their scripts on their
    own, so global rank 0 may complete its script and write ``completed`` before a slower rank of the
    same start has begun (seen under load with ``--local`` sweeps): a summary that this very start (or
    a later one) wrote is no earlier completion, and that rank runs its script."""
    from hpctrain.runtime.requeue import completed_by, keep_ended
    from hpctrain.runtime.slurm_relay import slurm_runner

    summary = completed_by(Path(run_dir), env.job_aliases)
    if summary is None:
        return
    if this_start is not None and summary.restarts is not None and summary.restarts >= this_start:
        return
    print(
        f"hpctrain: rank {env.global_rank}: this job completed the run already (step {summary.global_step}); "
        "Slurm started it again: this start ends without training",
        file=sys.stderr,
        flush=True,
    )
    keep_ended(env, run=slurm_runner())
    exit_process(0)


def record_this_start(run_dir: str, env: TaskEnv, began: float) -> None:
    """Global rank 0: append this start's ``start`` line (``contract/starts.py``); never fails the task.

    Under torchrun, the node launcher's first line began this start (it hands it down in ``BEGAN_VAR``).
    """
    if env.source in ("torchrun", "slurm-torchrun"):
        began = began_from(os.environ, began)
    try:
        record_start(run_dir, began=began, job_id=env.job_id, step_before=step_reached(run_dir))
    except OSError as exc:
        print(f"hpctrain: warning: could not record this start in {run_dir}: {exc}", file=sys.stderr)


def listen_for_stop(run_dir: str, env: TaskEnv, timeout_signal: str) -> StopRequest:
    """This task's StopRequest, its handlers installed, holding every stop signal counted since the task began."""
    stop = StopRequest(cancel_markers=cancel_marker_paths(run_dir), job_ids=env.job_aliases)
    install_handlers(stop, timeout_signal)
    early = stop_signals.hand_over(stop, timeout_signal)
    if early:
        seen = ", ".join(f"SIG{name} x{count}" for name, count in sorted(early.items()))
        logging.getLogger("hpctrain").info("stop signals during set-up: %s", seen)
    return stop


def stop_before_start(ctx: TaskContext) -> StopReason | None:
    """The stop reason every rank agrees on before the entry point or trainer runs, or None. Collective.

    Global rank 0 also asks Slurm whether the job was preempted before its tasks existed: a
    preemption signals only the job's steps, so one sent during the batch script's set-up or
    while srun started the tasks reached no one (``requeue.slurm_stop_reason``).
    """
    if ctx.env.is_main and ctx.env.under_slurm:
        from hpctrain.runtime.requeue import slurm_stop_reason
        from hpctrain.runtime.slurm_relay import slurm_runner

        told = slurm_stop_reason(ctx.env, run=slurm_runner())
        if told is not None:
            ctx.stop.request(told)
    return ctx.stop.agreed()


def stopped_before_start(ctx: TaskContext, reason: StopReason) -> dict[str, Any]:
    """The result of a start that stops before training: nothing trained, nothing new to save.

    The built-in trainer's summary.json says "stopped" (``cancel`` reports it; the next start counts
    a restart from it, also where no checkpoint exists yet); an entry point's run keeps its own.
    """
    if ctx.is_main:
        print(f"stopping ({reason}) before training: the stop came during set-up; nothing new to save", flush=True)
        if ctx.spec.entrypoint is None:
            record_stop(ctx, reason)
    return {"status": "stopped", "stop_reason": reason, "before_start": True}


def record_stop(ctx: TaskContext, reason: StopReason) -> None:
    """summary.json: "stopped", with what an earlier start recorded kept; never raises."""
    fields = (read_summary(ctx.run_dir) or Summary()).fields()
    restarts = max(int(fields.get("restarts") or 0), ctx.env.restart_count)
    fields.update(status="stopped", stop_reason=reason, job_id=ctx.env.job_id, restarts=restarts)
    fields["updated_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    try:
        write_summary(ctx.run_dir, fields)
    except (OSError, HpctrainError) as exc:
        print(f"hpctrain: could not record the stop in summary.json: {exc}", file=sys.stderr)


def check_world_size(spec: JobSpec, env: TaskEnv) -> None:
    """A job submitted from the spec must have started as many tasks as the spec asked for."""
    if (env.under_slurm or env.source == "submitit-local") and env.world_size != spec.world_size:
        raise DistributedSetupError(
            f"the spec asks for {spec.world_size} tasks ({spec.resources.nodes} nodes x {spec.tasks_per_node}) "
            f"but {env.world_size} were started",
            hint="submit with `hpctrain submit` so the Slurm request matches the spec",
        )


def batch_step_log(env: TaskEnv) -> failures.StepLog | None:
    """Where srun reports failed tasks, for global rank 0 of a submitit job under Slurm; else None.

    Rank 0's stderr (submitit's ``<job>_0_log.err``) is also the batch step's,
    so srun's ``srun: error: NODE: task N: ...`` lines land there.
    """
    if not env.is_main or env.source != "slurm":
        return None
    try:
        import submitit

        return failures.StepLog(submitit.JobEnvironment().paths.stderr)
    except Exception:  # not started by submitit: nobody to ask
        return None


def load_user_code(
    entrypoint: str | None, code_root: str | None = None, kwargs: Mapping[str, Any] | None = None
) -> UserCode:
    """The function to run: ``package.module:function``, or the built-in trainer.

    With a code snapshot, the entry point is imported from the run's copy
    (first on ``sys.path``), never from the user's live tree. A function that
    cannot be called as ``function(ctx, **kwargs)`` is refused here, naming the
    entry point, before the process group forms (``contract/entrypoint.py``).
    """
    if entrypoint is None:
        from hpctrain.trainer.trainer import run_training

        return run_training
    if code_root is not None:
        if not Path(code_root).is_dir():
            raise HpctrainError(
                f"entrypoint {entrypoint!r}: the run's code snapshot {code_root} is missing",
                hint="it was copied at submit time; restore it, or submit again (--no-snapshot runs the live tree)",
            )
        if code_root not in sys.path:
            sys.path.insert(0, code_root)
    module_name, _, function_name = entrypoint.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = exc.name and (module_name == exc.name or module_name.startswith(exc.name + "."))
        problem = "is not importable" if missing else f"failed to import ({type(exc).__name__}: {exc})"
        raise HpctrainError(
            f"entrypoint {entrypoint!r}: module {module_name!r} {problem} on {socket.gethostname()}",
            hint="install the package in the job's environment (same venv on every node) or fix `entrypoint`",
        ) from exc
    function = getattr(module, function_name, None)
    if not callable(function):
        raise HpctrainError(
            f"entrypoint {entrypoint!r}: {module_name!r} has no function {function_name!r}",
            hint=f"define `def {function_name}(ctx, **kwargs)` in {module_name} or fix `entrypoint`",
        )
    problem = function_problem(function, kwargs or {})
    if problem is not None:
        raise HpctrainError(
            f"entrypoint {entrypoint!r}: hpctrain calls it as {call_text(function_name, kwargs or {})}, but {problem}",
            hint=f"define `def {function_name}(ctx, **kwargs)`: the task context first, then entrypoint_args "
            "as keywords (or fix entrypoint_args)",
        )
    return function


def report_failure(rank: str | int, exc: BaseException, stream: TextIO | None = None) -> None:
    """One line naming the rank and node, plus the traceback when it is not a user mistake."""
    stream = stream or sys.stderr
    print(f"hpctrain: rank {rank} on node {socket.gethostname()} failed: {type(exc).__name__}: {exc}", file=stream)
    if not isinstance(exc, HpctrainError):
        traceback.print_exception(exc, file=stream)
    stream.flush()
