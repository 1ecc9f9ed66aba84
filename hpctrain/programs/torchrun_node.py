"""``launcher: torchrun``: one Slurm task per node starts torchrun, which starts that node's ranks.

``TorchrunNodeLauncher`` is what submitit runs on every node (``--ntasks-per-node=1``).
It starts ``python -m torch.distributed.run`` as its child with a c10d
rendezvous on the first node (``--rdzv-endpoint FIRSTHOST:PORT``, the port
derived from the job id like srun's master port) and ``--max-restarts 0``:
Slurm's requeue is the one restart mechanism, because it also gives the job
new nodes, a new attempt number (SLURM_RESTART_COUNT) and the exact resume
from the last checkpoint, while a torchrun restart would rerun the ranks on
the same nodes behind Slurm's back. torchrun runs
``python -m hpctrain.programs.torchrun_worker`` once per process; a worker is
an ordinary hpctrain task (TaskEnv from torchrun's variables plus the node
task's SLURM_*), so training, stop signals, the requeue decision (global rank
0, once per job), the exact resume and clean-up are those of srun tasks.

Signals. With proctrack/cgroup Slurm sends the time-limit warning, a
preemption's SIGCONT+SIGTERM and a cancel's SIGTERM only to its tasks -- here
the node tasks (``proctrack_p_signal`` signals "slurm tasks unless SIGKILL";
measured on the test cluster: torchrun's workers never saw a USR2). So the
node task passes each of them on to the workers, torchrun's children, which
handle them as srun tasks do. Not through torchrun: torchrun's own handling
(SIGTERM: SIGTERM the workers, SIGKILL them after a timeout, exit; USR1/USR2:
die) would cut the checkpoint-and-requeue protocol short. torchrun is started
with the stop signals held (blocked, so pending in torchrun for good: it
never unblocks them) and ``--signals-to-handle`` limited to
SIGINT,SIGHUP,SIGQUIT; its workers inherit the hold and listen first thing
(stop_signals.py). What the node task counted before torchrun started goes
to them in their environment; what comes later a ``stop_signals.Relay``
passes on, also to a worker that torchrun starts only after the signal came
(it imports torch first: seconds). With proctrack/linuxproc Slurm signals
every descendant as well, so a worker may see a signal twice; its stop flags
do not count duplicates twice in any way that matters (stop.py, requeue.py).

Burn-in. Before torchrun, the node tasks probe their nodes together
(``healing/script_burn_in.py``'s child: one process per node, its own gloo or
NCCL group on its own port, never torchrun's rendezvous), exactly as the
ranks do under srun: global node task 0's child scores, records, and requeues
the job without a flagged node, and then every node task ends without a
result; otherwise torchrun starts, and its ranks run no burn-in of their own
(``BURN_IN_VAR``). A stop during it lets it end first; torchrun then starts
with the signals counted, and its ranks stop before training as after any
early stop.

What comes back: a worker that returns leaves its result in a node-local
state folder; one that ends without a result (the job was requeued) leaves a
marker, and then the node task ends without a result too (requeue.py's exit
protocol). Which rank failed first: a thread of the node task
(:class:`WorkerWatch`) sees a worker end without a result, an exit marker or
a peer's-death marker, and at once writes it to the run's
``torchrun-failures.log`` in srun's words (failures.py), where global rank 0
looks, as it reads srun's report under srun. torchrun's own report comes only
after it has torn the node's other workers down (up to 30 s), too late for
rank 0; the node task still reads it (:func:`root_cause`) for its error
message, and fails so that srun ends the other nodes (``--kill-on-bad-exit``).

``tracking.live``: the node task whose torchrun started global rank 0 (the
rendezvous places the ranks, so the same thread sees it when that worker
starts) starts the run's one sender, beside torchrun, never under it
(torchrun ends a worker's whole process group); it ends when torchrun is done:
after the ranks returned (the run completed, or stopped for good) with up to
``LAST_SYNC_WAIT_S`` for its last sync, after a requeue or a failure at once
(runtime/tracker_relay.py).
Importing this module imports no torch.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from hpctrain.contract.cpu_share import omp_num_threads
from hpctrain.contract.file_writes import open_append, write_atomic
from hpctrain.contract.rundir import torchrun_failures_path
from hpctrain.contract.starts import BEGAN_VAR, process_began
from hpctrain.errors import DistributedSetupError, HpctrainError
from hpctrain.healing import script_burn_in
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.node_health import BURN_IN_VAR
from hpctrain.programs.launcher import ALLOW_LOOPBACK_MASTER_VAR, end_if_completed, report_failure
from hpctrain.runtime import node_dirs, stop_signals
from hpctrain.runtime.context import TaskEnv, configure_logging
from hpctrain.runtime.master import check_master_address, check_port_free
from hpctrain.runtime.task_env import LAUNCHER_VAR, derive_task_env, rank_hint
from hpctrain.runtime.tracker_relay import LAST_SYNC_WAIT_S, start_live_sender, stop_live_sender

WORKER_MODULE = "hpctrain.programs.torchrun_worker"
SPEC_FILE = "spec.json"
# torchrun waits this long for a failed node's other workers before SIGKILL (its default: 30 s).
SHUTDOWN_TIMEOUT_S = 5
# The signals torchrun may handle itself: none that Slurm uses to stop a job.
TORCHRUN_SIGNALS = "SIGINT,SIGHUP,SIGQUIT"
# A worker whose error looks like a peer's death exits with this and says so in
# its failure marker (torchrun_worker.py): it is nobody's first failure.
PEER_FAILURE_EXIT = 3
PEER_FAILURE = "peer"
WATCH_POLL_S = 0.2

_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):\s*\[\d+\]:.*?"
    r"rank\s*:\s*(?P<rank>\d+) \(local_rank: (?P<local_rank>\d+)\)\s*"
    r"exitcode\s*:\s*(?P<exitcode>-?\d+)(?:\s*\(pid: \d+\))?(?:[ \t]*\((?P<signal>SIG\w+)\))?",
    re.S,
)


@dataclass(frozen=True)
class WorkerFailure:
    """torchrun's "first observed failure" on this node."""

    rank: int
    local_rank: int
    exitcode: int
    signal_name: str

    @property
    def reason(self) -> str:
        """In srun's words ("Killed", "Exited with exit code 1")."""
        if self.exitcode < 0:
            return "Killed" if self.signal_name == "SIGKILL" else f"Killed by {self.signal_name or -self.exitcode}"
        return f"Exited with exit code {self.exitcode}"


def torchrun_command(
    env: TaskEnv,
    spec: JobSpec,
    state_dir: Path,
    python: str = sys.executable,
    *,
    worker_module: str = WORKER_MODULE,
    options: tuple[str, ...] = (),
) -> list[str]:
    """The torchrun command of the node task ``env`` (a Slurm task, one per node). Pure.

    The rendezvous store lives on the first node (``is_host`` says so rather
    than torchrun guessing from host names); joining may take as long as the
    spec's collective timeout. ``worker_module`` is each rank's program and
    ``options`` are torchrun options more (a script job's ranks: programs/script_torchrun.py).
    """
    is_host = 1 if env.node_rank == 0 else 0
    return [
        python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={env.num_nodes}",
        f"--nproc-per-node={spec.tasks_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={env.master_addr}:{env.master_port}",
        f"--rdzv-id={env.job_id}",
        f"--rdzv-conf=is_host={is_host},join_timeout={spec.distributed.timeout_s}",
        "--max-restarts=0",
        f"--signals-to-handle={TORCHRUN_SIGNALS}",
        f"--shutdown-timeout={SHUTDOWN_TIMEOUT_S}",
        f"--log-dir={state_dir / 'torchrun-logs'}",
        *options,
        "-m",
        worker_module,
        str(state_dir),
    ]


def worker_environ(environ: dict[str, str], tasks_per_node: int) -> dict[str, str]:
    """torchrun's environment: the node task's, marked, with each worker's share of the CPUs. Pure."""
    child = dict(environ)
    child[LAUNCHER_VAR] = "torchrun"
    child[BURN_IN_VAR] = "off"  # the node tasks ran this start's burn-in (TorchrunNodeLauncher.burn_in)
    threads = omp_num_threads(environ, sharers=tasks_per_node)  # no cpu_count: only Slurm's share is divided
    if threads is not None:
        child["OMP_NUM_THREADS"] = threads
    return child


def root_cause(text: str) -> WorkerFailure | None:
    """The first failed worker in torchrun's ``ChildFailedError`` report, or None. Pure."""
    matches = list(_ROOT_CAUSE.finditer(text))
    if not matches:
        return None
    found = matches[-1]  # the report of this attempt comes last in an appended log
    return WorkerFailure(
        int(found.group("rank")),
        int(found.group("local_rank")),
        int(found.group("exitcode")),
        found.group("signal") or "",
    )


def failure_line(node: str, rank: int, reason: str) -> str:
    """One line of ``torchrun-failures.log``, parsed like srun's report (failures.py)."""
    return f"torchrun: error: {node}: task {rank}: {' '.join(reason.split())}\n"


def death_reason(state_dir: Path, rank: int) -> str | None:
    """Why worker ``rank``, now gone, ended; None when it is no one's first failure.

    A result or an exit marker: it finished. A failure marker says what it
    raised, or "peer" when that was the echo of another rank's death. No word
    at all: it was killed (the OOM killer, ``kill -9``) or exited abruptly.
    """
    if (state_dir / f"result-{rank}.pkl").exists() or (state_dir / f"exit-{rank}").exists():
        return None
    try:
        said = (state_dir / f"failed-{rank}").read_text().strip()
    except OSError:
        return "Killed (ended without a result or an error)"
    return None if said == PEER_FAILURE else said or "Failed"


class WorkerWatch:
    """Reports the first worker of this node that ends without finishing, as it happens; ``started`` hears
    the global rank of each worker it sees start."""

    def __init__(
        self,
        torchrun_pid: int,
        state_dir: Path,
        report: Callable[[int, str], None],
        poll_s: float = WATCH_POLL_S,
        started: Callable[[int], None] = lambda rank: None,
    ) -> None:
        self.torchrun_pid, self.state_dir, self.report, self.poll_s = torchrun_pid, state_dir, report, poll_s
        self.started = started
        self.reported = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hpctrain-worker-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        known: dict[int, int] = {}  # pid -> global rank
        stopping = False
        while not stopping:
            stopping = self._stop.wait(self.poll_s)  # one last look after stop(): torchrun is gone by then
            alive = set(worker_pids(self.torchrun_pid, running=True))
            for pid in alive - known.keys():
                rank = _rank_of(pid)
                if rank is not None:
                    known[pid] = rank
                    self.started(rank)
            for pid in [pid for pid in known if pid not in alive]:
                rank = known.pop(pid)
                reason = death_reason(self.state_dir, rank)
                if reason is not None:
                    self.report(rank, reason)
                    self.reported = True
                    return  # the first failure is what rank 0 needs


def _rank_of(pid: int) -> int | None:
    try:
        rank = psutil.Process(pid).environ().get("RANK", "")
    except psutil.Error:
        return None
    return int(rank) if rank.isdigit() else None


class TorchrunNodeLauncher:
    """The callable submitit runs once per node; returns the results of the node's ranks."""

    worker_module = WORKER_MODULE  # each rank's program
    torchrun_options: tuple[str, ...] = ()
    sender: subprocess.Popen | None = None  # tracking.live's, on the node of global rank 0

    def __init__(self, spec_data: dict[str, Any], run_dir: str, code_root: str | None = None) -> None:
        self.spec_data = spec_data
        self.run_dir = run_dir
        self.code_root = code_root  # the run's copy of the entry point's code, for the workers

    def __call__(self) -> list[dict[str, Any]]:
        stop_signals.listen()  # first: the node task started with them held (cleanup.py)
        os.environ[BEGAN_VAR] = f"{process_began(time.time()):.3f}"  # this start began: rank 0's worker records it
        try:
            spec = JobSpec.model_validate(self.spec_data)
            os.environ.update(spec.env)
            env = node_env(spec)
            configure_logging(env)
            end_if_completed(self.run_dir, env, _exit_at_once)
            return self.run(spec, env)
        except BaseException as exc:
            if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
                report_failure(f"node task {rank_hint(os.environ)}", exc)
            raise

    def run(self, spec: JobSpec, env: TaskEnv) -> list[dict[str, Any]]:
        check_master_address(env, allow_loopback=os.environ.get(ALLOW_LOOPBACK_MASTER_VAR) == "1")
        if env.node_rank == 0:
            check_port_free(env.master_port)
        relayed = relayed_signals(spec.signals.timeout_signal)
        signal.signal(signal.SIGCONT, signal.SIG_IGN)  # torchrun inherits "ignored" (see the module docstring)
        self.sweep_state_dirs(env.hostname)
        state_dir = node_dirs.planned("torchrun")  # named first: the reaper removes it after a SIGKILL
        self.start_reaper(remove_dirs=(state_dir,))
        self.burn_in(spec, env)
        make_state_dir(state_dir)
        try:
            write_atomic(state_dir / SPEC_FILE, json.dumps(self.worker_payload()))
            log_start = _own_stderr_size()
            command = torchrun_command(
                env, spec, state_dir, worker_module=self.worker_module, options=self.torchrun_options
            )
            print(f"hpctrain: node {env.hostname}: {' '.join(command)}", file=sys.stderr, flush=True)
            stop_signals.hold()  # torchrun and its workers start with them held; what came so far goes along
            environ = worker_environ(dict(os.environ), spec.tasks_per_node)
            environ = stop_signals.child_environ(environ, stop_signals.recorded())
            torchrun = subprocess.Popen(command, env=environ)
            relay = stop_signals.Relay(lambda: worker_pids(torchrun.pid, running=True), relayed).start()
            stop_signals.listen()  # unblocks the other USR signal too (nobody's)
            watch = WorkerWatch(
                torchrun.pid,
                state_dir,
                lambda rank, why: self.report(env.hostname, rank, why),
                started=lambda rank: self.worker_started(spec, rank),
            )
            watch.start()
            code = torchrun.wait()
            watch.stop()
            relay.stop()
            ended = code == 0 and not any(state_dir.glob("exit-*"))  # every rank returned: the run is not back
            stop_live_sender(self.sender, wait_s=LAST_SYNC_WAIT_S if ended else 0.0, ended=ended)
            if code == 0 and not ended:
                _end_without_result(state_dir)
            if code != 0:
                error, failure = self.failed(env, code, _own_stderr_since(log_start))
                if failure is not None and not watch.reported and failure.exitcode != PEER_FAILURE_EXIT:
                    self.report(env.hostname, failure.rank, failure.reason)  # died before the watch saw it
                raise error
            results = [pickle.loads(path.read_bytes()) for path in state_dir.glob("result-*.pkl")]
            return sorted(results, key=lambda result: result["rank"])
        finally:
            shutil.rmtree(state_dir, ignore_errors=True)

    def burn_in(self, spec: JobSpec, env: TaskEnv) -> None:
        """Probe the nodes before torchrun starts (the module docstring); may end this process."""
        stop = RecordedStop(spec.signals.timeout_signal)
        if stop.local_reason is not None:
            return  # stopping already: torchrun's ranks stop before training
        script_burn_in.before_script(
            spec, env, self.run_dir, stop, exit_process=_exit_at_once, say=_say_for(env.hostname),
            starts="torchrun", after_stop="torchrun starts after it, and its ranks stop before training",
        )  # fmt: skip

    def worker_started(self, spec: JobSpec, rank: int) -> None:
        """A worker of this node started: if it is global rank 0, this node sends the run to its trackers."""
        if rank == 0 and self.sender is None:
            self.sender = start_live_sender(spec, self.run_dir, is_main=True)

    def worker_payload(self) -> dict[str, Any]:
        """What each rank's program reads from ``STATE_DIR/spec.json``."""
        return {"spec": self.spec_data, "run_dir": self.run_dir, "code_root": getattr(self, "code_root", None)}

    def failed(self, env: TaskEnv, code: int, log_text: str) -> tuple[HpctrainError, WorkerFailure | None]:
        """The error to raise for torchrun's failure, and its first failed worker, from its own report."""
        failure = root_cause(log_text)
        if failure is None:
            return HpctrainError(f"torchrun on node {env.hostname} exited with status {code}"), None
        error = HpctrainError(
            f"torchrun on node {env.hostname} failed: rank {failure.rank} "
            f"(local rank {failure.local_rank}): {failure.reason}",
            hint="the rank's own error is above in this log",
        )
        return error, failure

    def report(self, node: str, rank: int, reason: str) -> None:
        """Tell global rank 0 that ``rank`` failed (torchrun-failures.log, srun's words)."""
        path = torchrun_failures_path(self.run_dir)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = open_append(path)
            try:
                os.write(fd, failure_line(node, rank, reason).encode())
            finally:
                os.close(fd)
        except OSError as exc:
            print(f"hpctrain: could not report the failure of rank {rank}: {exc}", file=sys.stderr)

    def sweep_state_dirs(self, node: str) -> None:
        """Remove the state folders this user's node tasks on this node left when they were killed with their
        reaper (proctrack/cgroup's last SIGKILL ends both: node_dirs.py)."""
        swept = node_dirs.sweep("torchrun")
        if swept:
            _say_for(node)(f"removed {len(swept)} state folder(s) of ended node tasks, e.g. {swept[0]}")

    def start_reaper(self, remove_dirs: Sequence[Path] = ()) -> None:
        """The node's reaper: torchrun and the workers carry this task's token (cleanup.py); after this
        task it also removes ``remove_dirs`` (the state folder, which a killed task leaves: node_dirs.py)."""
        from hpctrain.runtime.cleanup import ensure_task_token, start_reaper

        try:
            start_reaper(ensure_task_token(), remove_dirs=remove_dirs)
        except (RuntimeError, OSError) as exc:
            print(f"hpctrain: warning: leaked processes will not be cleaned up: {exc}", file=sys.stderr)


class RecordedStop:
    """The node task's stop flag: what its counting handlers (``stop_signals.listen``) saw so far."""

    def __init__(self, timeout_signal: str) -> None:
        self.timeout_signal = timeout_signal

    @property
    def local_reason(self) -> str | None:
        counts = stop_signals.recorded()
        if counts.get("TERM"):
            return "preempted"  # or a cancel, or a requeue: torchrun's ranks tell them apart
        return "timeout" if counts.get(self.timeout_signal) else None


def _say_for(node: str) -> Callable[[str], None]:
    return lambda line: print(f"hpctrain: node {node}: {line}", file=sys.stderr, flush=True)


def node_env(spec: JobSpec) -> TaskEnv:
    """This node task's TaskEnv (one Slurm task per node); a clear error anywhere else."""
    env = derive_task_env(os.environ, spec_master_port=spec.distributed.master_port)
    if env.source != "slurm":
        raise DistributedSetupError(
            f"launcher: torchrun runs in a Slurm job, but this task was started by {env.source}",
            hint="submit with `hpctrain submit` to a Slurm cluster, or use --local (which starts the ranks itself)",
        )
    if env.local_world_size != 1:
        raise DistributedSetupError(
            f"launcher: torchrun needs one Slurm task per node, but this node runs {env.local_world_size}",
            hint="submit with `hpctrain submit` so the Slurm request matches the spec",
        )
    return env


def relayed_signals(timeout_signal: str) -> tuple[signal.Signals, ...]:
    """What Slurm sends the node task to stop or warn the ranks, passed on to the workers (docs/preemption.md).

    The node task itself only passes them on: it waits for torchrun whatever comes,
    and Slurm ends it, if ever needed, with SIGKILL after KillWait.
    """
    return (signal.SIGTERM, signal.SIGCONT, signal.Signals[f"SIG{timeout_signal}"])


def worker_pids(torchrun_pid: int, *, running: bool = False) -> list[int]:
    """torchrun's children: one worker per local rank (empty once torchrun is gone).

    ``running``: without the dead ones torchrun has not reaped yet.
    """
    try:
        children = psutil.Process(torchrun_pid).children()
    except psutil.Error:
        return []
    pids = []
    for child in children:
        try:
            if not running or child.status() != psutil.STATUS_ZOMBIE:
                pids.append(child.pid)
        except psutil.Error:
            continue
    return pids


def _own_stderr_size() -> int:
    path = _own_stderr()
    try:
        return path.stat().st_size if path else 0
    except OSError:
        return 0


def _own_stderr_since(offset: int) -> str:
    """What this node task's log (torchrun's and the workers' stderr) got since ``offset``."""
    path = _own_stderr()
    if path is None:
        return ""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def _own_stderr() -> Path | None:
    try:
        import submitit

        return Path(submitit.JobEnvironment().paths.stderr)
    except Exception:  # not started by submitit
        return None


def make_state_dir(path: Path) -> None:
    """The node-local state folder the reaper was told of (``node_dirs.planned``): ours alone, or an error."""
    try:
        node_dirs.create(path)
    except OSError as exc:
        raise HpctrainError(
            f"the node task could not make its state folder {path}: {exc.strerror}",
            hint="set TMPDIR (in the spec's env: section) to a node-local folder this user may write",
        ) from None


def _end_without_result(state_dir: Path) -> None:
    """The ranks ended for a requeue: no result file, like an srun task (requeue.py)."""
    shutil.rmtree(state_dir, ignore_errors=True)
    _exit_at_once(0)


def _exit_at_once(status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)


def write_failure(state_dir: Path, what: str) -> None:
    """A rank's last word for :func:`death_reason` (``failed-RANK``), before it exits; best effort."""
    rank = os.environ.get("RANK", str(os.getpid()))
    try:
        write_atomic(state_dir / f"failed-{rank}", what)
    except OSError:
        pass


def write_result(state_dir: Path, result: dict[str, Any]) -> None:
    """A rank's result for the node task (``result-RANK.pkl``), installed whole by a rename."""
    path = state_dir / f"result-{result['rank']}.pkl"
    write_atomic(path, pickle.dumps(result))
