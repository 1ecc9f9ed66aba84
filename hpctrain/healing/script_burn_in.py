"""The burn-in in a child process: a ``script:`` job's, and every ``launcher: torchrun`` job's.

A script's wrapper (``programs/script_launcher.py``) imports no torch and forms
no process group; the script brings its own. So each wrapper task of a
multi-node start (the first, each requeue, each relaunch after a lost node)
runs one short child before it starts the script,
``python -m hpctrain.healing.script_burn_in RUN_DIR PORT`` (the spec on its
stdin), which does what the trainer's task launcher does before its first
step: it derives the task's environment, joins a process group of the
wrapper tasks (gloo on CPUs, NCCL on GPUs: one member per rank, or per node
for ``per: node``) on a port of its own (``master.burn_in_port``, never the
script's ``{master_port}``), and runs ``burn_in.run_burn_in``: the same
probes (a fixed matrix product for the compute probe: a script has no model
of ours), scores, records and decider. Its exit status tells the wrapper the
verdict; its end frees what the probes held (a CUDA context lives as long as
its process, so none is left to the script). On CPUs (:func:`plain`) the
child imports no torch: its group is plain TCP (``plain_group.py``), its
compute probe a hash workload and its link probe a pair's exchange
(``plain_probes.py``): no torch import (2.2-2.7 s of a start), and a wrapper without torch
gets a burn-in too.

A CPU job with several wrapper tasks on a node runs one child per node
(:func:`node_prober`): the node's first task's, one member per node; the
node's other tasks wait for the verdict it leaves in the run directory
(:func:`follow`) and act on it as their own.

* nothing flagged, or a flagged node kept: the script starts;
* a healing job: the wrapper exits with ``BURN_IN_EXIT`` and the supervisor
  decides (swap, drop, requeue without it, keep);
* any other job: rank 0 requeued it without the node; the wrapper leaves
  without a result, as the trainer's ranks do.

A stop before the burn-in skips it; a stop while it runs lets it end (it is
bounded by ``budget_s``, as the trainer's, which also probes through a stop;
its verdict counts: rank 0 may have requeued the job without a node, which
itself signals every task), or kills it ``budget_s`` + 10 s after the stop
(a peer that saw the stop first never joined). Then the start ends as any
stop before the script started: the script is not started, the job requeues
where the trainer's would. The child starts with the stop signals ignored, as the
script does: under ``proctrack/linuxproc`` Slurm signals every process.
Torch missing in the wrapper's Python: no burn-in on GPUs, one line in the log.
A burn-in that cannot run (a peer's child killed, a port taken) is said and
skipped: the script starts, and whatever is broken shows there.

Under ``launcher: torchrun`` (the trainer's jobs and a script's) the ranks
start inside torchrun's agent, whose ``env://`` rendezvous owns the master
port: there the node task (``programs/torchrun_node.py``, one per node) runs
this same child before it starts torchrun (one member per node, which probes
every GPU of the node), acts on the verdict with its own exit (a requeued
job: no result, as above) and tells its ranks that the start's burn-in is
done (``BURN_IN_VAR``). The compute probe is the run's model for a trainer
job (``probes.compute_workload``).

Torch-free at import; the child imports torch unless :func:`plain`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, Protocol

from hpctrain.contract.file_writes import write_atomic
from hpctrain.contract.rundir import burn_in_verdict_path
from hpctrain.contract.runfiles import RunFileError, read_bounded
from hpctrain.errors import HpctrainError
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.node_health import BURN_IN_EXIT, BURN_IN_VAR, STEP_ID_VAR, burn_in_applies
from hpctrain.runtime.context import TaskEnv, configure_logging
from hpctrain.runtime.master import burn_in_port
from hpctrain.runtime.script.child import launch_argv
from hpctrain.runtime.stop import StopRequest
from hpctrain.runtime.task_env import derive_task_env, thread_env

MODULE = "hpctrain.healing.script_burn_in"
REQUEUED_EXIT = 76  # the child's status when rank 0 requeued the job without a flagged node
POLL_S = 0.05
MAX_SPEC_BYTES = 4 << 20
STOP_MARGIN_S = 10.0

NODE_ARG = "node"  # the child's third word: one member per node (node_prober)

Outcome = Literal["train", "supervisor", "requeued", "failed", "stopped"]
OUTCOMES: tuple[Outcome, ...] = ("train", "supervisor", "requeued", "failed", "stopped")


def due(spec: JobSpec, env: TaskEnv, environ: Mapping[str, str]) -> bool:
    """Whether this start of a script job runs the burn-in: a multi-node Slurm step under srun, with
    ``health.burn_in`` on and not turned off by the supervisor (it kept a flagged node). Pure."""
    return env.under_slurm and burn_in_applies(spec, env.num_nodes) and environ.get(BURN_IN_VAR) != "off"


def outcome(returncode: int) -> Outcome:
    """What the child's exit status means for the wrapper. Pure."""
    return {0: "train", BURN_IN_EXIT: "supervisor", REQUEUED_EXIT: "requeued"}.get(returncode, "failed")


def stop_wait_s(spec: JobSpec) -> float:
    """How long a burn-in may go on after a stop: its budget and a margin. Past it, a peer never joined
    (its wrapper saw the stop first and started no burn-in), and the child is killed."""
    return spec.health.burn_in.budget_s + STOP_MARGIN_S


def child_argv(python: str, run_dir: str, port: int, ignored: list[str], *, per_node: bool = False) -> list[str]:
    """The child's command line, started with ``ignored`` signals ignored (``script/child.py: launch_argv``);
    ``per_node``: the node's one member (:func:`node_prober`). Pure."""
    return launch_argv([python, "-m", MODULE, run_dir, str(port), *([NODE_ARG] if per_node else [])], ignored)


class StopFlag(Protocol):
    """What the burn-in's wait asks about a stop: a wrapper's ``StopRequest``, or a torchrun node task's count."""

    @property
    def local_reason(self) -> str | None: ...


def plain(spec: JobSpec) -> bool:
    """Whether this burn-in runs without torch (``plain_group.py``, ``plain_probes.py``): a CPU script's, whose
    compute probe is a fixed workload anyway and whose collectives are a few numbers. A GPU job's probes need
    CUDA (and NCCL's links); a trainer job's (under torchrun) its model. Pure."""
    return spec.script is not None and not spec.uses_gpus


def attempt_key(env: TaskEnv, environ: Mapping[str, str]) -> str:
    """This start of the step, the same on every task: the supervisor's step id, else the job id and restart
    count. Its burn-in port and verdict files are derived from it, and a plain group's members say it. Pure."""
    return environ.get(STEP_ID_VAR) or f"{env.job_id}.{env.restart_count}"


def node_prober(spec: JobSpec, env: TaskEnv) -> bool:
    """Whether one child per node probes for every wrapper task of the node: a CPU job with several tasks on a
    node (``per: rank``). Its first task's child joins a group of one member per node and its verdict goes to
    the node's other tasks (:func:`follow`): their own children would each import torch on the node's cores
    at once, for the same numbers (a node is its slowest rank; a CPU quota slows all of them alike). A GPU job
    keeps one child per rank: a task may see only its own GPU. Pure."""
    return env.local_world_size > 1 and not spec.uses_gpus


def before_script(
    spec: JobSpec,
    env: TaskEnv,
    run_dir: str,
    stop: StopFlag,
    *,
    exit_process: Callable[[int], object],
    say: Callable[[str], None],
    start: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
    starts: str = "the script",
    after_stop: str = "the script is not started",
) -> Outcome | None:
    """Run the burn-in of this start when it is due (the module docstring); None when it is not, or cannot
    run here. Returns when the script (``starts``: what follows the burn-in, in its lines; ``after_stop``:
    what a stop during it means) may start (or the start is ending: ``stop`` says so); ends the process
    when the verdict takes the node out."""
    if not due(spec, env, os.environ):
        return None
    if not plain(spec) and importlib.util.find_spec("torch") is None:
        say(f"no burn-in: torch is not installed in {sys.executable}; {starts} starts without one")
        return None
    attempt = attempt_key(env, os.environ)
    verdict = burn_in_verdict_path(run_dir, attempt, env.node_rank) if node_prober(spec, env) else None
    if verdict is not None and env.local_rank != 0:
        found, code = follow(verdict, spec, stop, say=say, after_stop=after_stop), None
    else:
        found, code = _probe(spec, env, run_dir, attempt, stop, start, say, starts, after_stop, verdict is not None)
        if verdict is not None:
            _tell(verdict, found)
    if found == "supervisor":
        exit_process(BURN_IN_EXIT)  # the supervisor reads the record and decides
    elif found == "requeued":
        exit_process(0)  # no result: the job comes back without the node
    elif found == "failed" and code is not None:
        say(f"the burn-in failed (exit status {code}; its lines above say why); {starts} starts without it")
    elif found == "failed" and verdict is not None and env.local_rank != 0:
        say(f"the burn-in failed (the node's first task's lines say why); {starts} starts without it")
    return found


def _probe(
    spec: JobSpec,
    env: TaskEnv,
    run_dir: str,
    attempt: str,
    stop: StopFlag,
    start: Callable[..., subprocess.Popen[bytes]],
    say: Callable[[str], None],
    starts: str,
    after_stop: str,
    per_node: bool,
) -> tuple[Outcome, int | None]:
    """Run this task's child to its end: (the outcome, its exit status; None when it never ran or was killed)."""
    port = burn_in_port(env.master_port, attempt)
    script = spec.script
    ignored = [spec.signals.timeout_signal, "TERM", "INT"]
    if script is not None and script.stop_signal not in ignored:
        ignored.append(script.stop_signal)
    threads = thread_env(os.environ, os.cpu_count())
    if per_node and threads:  # the node's member computes with its tasks' share, all of them
        threads = {name: str(int(value) * env.local_world_size) for name, value in threads.items()}
    child_env = {**os.environ, **threads, "PYTHONUNBUFFERED": "1"}
    try:
        process = start(
            child_argv(sys.executable, run_dir, port, ignored, per_node=per_node),
            env=child_env,
            stdin=subprocess.PIPE,
            close_fds=True,
        )
    except OSError as exc:
        say(f"the burn-in could not start ({exc}); {starts} starts without it")
        return "failed", None
    try:
        assert process.stdin is not None
        process.stdin.write(json.dumps(spec.model_dump(mode="json")).encode())
        process.stdin.close()
    except OSError:
        pass  # the child ended before it read the spec: its status says so
    stop_deadline: float | None = None
    while (code := process.poll()) is None:
        stop_deadline = _stop_deadline(stop_deadline, spec, stop, say, after_stop)
        if stop_deadline is not None and time.monotonic() >= stop_deadline:
            say("the burn-in did not end in time after the stop: ended")
            process.kill()
            process.wait()
            return "stopped", None
        time.sleep(POLL_S)
    return outcome(code), code


def _stop_deadline(
    deadline: float | None, spec: JobSpec, stop: StopFlag, say: Callable[[str], None], after_stop: str
) -> float | None:
    """The moment a stop's wait ends: set (and said) once a stop is seen."""
    if stop.local_reason is None or deadline is not None:
        return deadline
    wait_s = stop_wait_s(spec)
    say(f"stop ({stop.local_reason}) during the burn-in: it ends first (within {wait_s:.0f} s); {after_stop}")
    return time.monotonic() + wait_s


def follow(verdict: Path, spec: JobSpec, stop: StopFlag, *, say: Callable[[str], None], after_stop: str) -> Outcome:
    """A node's other task: wait for its first task's verdict (:func:`node_prober`). Bounded as that task's
    child is (the group's timeout and the budget), and after a stop as the child is."""
    limit = time.monotonic() + spec.distributed.timeout_s + spec.health.burn_in.budget_s + STOP_MARGIN_S
    stop_deadline: float | None = None
    while True:
        try:  # a regular file of a few bytes: anything else is no verdict (a link, a fifo, a planted blob)
            told = read_bounded(verdict, 64, within=verdict.parent).decode("utf-8", errors="replace").strip()
        except (OSError, RunFileError):
            told = ""
        if told:
            return next((one for one in OUTCOMES if one == told), "failed")
        stop_deadline = _stop_deadline(stop_deadline, spec, stop, say, after_stop)
        if stop_deadline is not None and time.monotonic() >= stop_deadline:
            say("the burn-in did not end in time after the stop")
            return "stopped"
        if time.monotonic() >= limit:
            return "failed"
        time.sleep(POLL_S)


def _tell(verdict: Path, found: Outcome) -> None:
    """The node's first task: its verdict for the node's other tasks, before it acts on it."""
    try:
        verdict.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(verdict, found)
    except OSError:
        pass  # the others wait out their bound, then start without a verdict (srun ends them first if this leaves)


# -- the child ----------------------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    """The burn-in of this wrapper task: join the wrapper tasks' process group, probe, act. Collective."""
    if len(argv) not in (2, 3) or not argv[1].isdigit() or argv[2:] not in ([], [NODE_ARG]):
        print(f"usage: python -m {MODULE} RUN_DIR PORT [{NODE_ARG}] < spec.json", file=sys.stderr)
        return 2
    run_dir, port = Path(argv[0]), int(argv[1])
    spec = JobSpec.model_validate(json.loads(sys.stdin.buffer.read(MAX_SPEC_BYTES)))
    env = replace(derive_task_env(os.environ, spec_master_port=spec.distributed.master_port), master_port=port)
    if argv[2:]:
        env = node_member(env)
    configure_logging(env)
    began = time.time()
    from hpctrain.healing.burn_in import run_burn_in
    from hpctrain.runtime.context import TaskContext

    laps = [began, time.time()]
    try:
        if plain(spec):
            from hpctrain.healing.plain_group import CPU, joined

            with joined(env, port, attempt_key(env, os.environ), spec.distributed.timeout_s) as group:
                laps.append(time.time())
                ctx = TaskContext(env=env, spec=spec, run_dir=run_dir, device=CPU, stop=StopRequest())  # type: ignore[arg-type]
                run_burn_in(ctx, exit_process=_leave, plain=group)
        else:
            from hpctrain.runtime.process_group import process_group

            with process_group(env, spec.distributed, use_cuda=spec.uses_gpus) as device:
                laps.append(time.time())
                ctx = TaskContext(env=env, spec=spec, run_dir=run_dir, device=device, stop=StopRequest())
                run_burn_in(ctx, exit_process=_leave)
    except HpctrainError as exc:  # a port taken, a peer unreachable: said in one line, the wrapper goes on
        print(f"hpctrain: rank {env.global_rank}: burn-in: {exc}", file=sys.stderr, flush=True)
        return 1
    if len(laps) == 3:  # where a start's seconds went (benchmarks/script_overhead.py reads it)
        laps.append(time.time())
        (imports, join, probes) = (later - earlier for earlier, later in zip(laps, laps[1:]))
        say = f"imports {imports:.1f} s, group {join:.1f} s, probes {probes:.1f} s (from {began:.3f})"
        print(f"hpctrain: rank {env.global_rank}: burn-in: {say}", file=sys.stderr, flush=True)
    return 0


def node_member(env: TaskEnv) -> TaskEnv:
    """A node's one member in a group of one per node (:func:`node_prober`): its node's rank. Pure."""
    return replace(env, global_rank=env.node_rank, world_size=env.num_nodes, local_rank=0, local_world_size=1)


def _leave(status: int) -> Any:
    """``run_burn_in``'s exit: the supervisor's status as it is; its "requeued, no result" (0) as ours."""
    _exit_now(REQUEUED_EXIT if status == 0 else status)


def _exit_now(status: int) -> None:
    """End without the interpreter's clean-up: torch's takes seconds on a loaded node, while the script waits."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(status)


if __name__ == "__main__":
    _exit_now(main(sys.argv[1:]))
