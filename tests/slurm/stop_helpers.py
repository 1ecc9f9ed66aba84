"""Helpers for the stop/resume/clean-up tests: a small deterministic training run and ways to poke it.

The run is the CPU smoke job on 2 nodes x 1 task (a rank on each node; ``TWO_PER_NODE`` for a test about
two ranks sharing a node), made long enough to interrupt (3 epochs of 6 steps, a checkpoint every 2 steps)
and deterministic, so an interrupted run can be compared bit for bit with an uninterrupted one. Every wait
is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hpctrain.contract.rundir import checkpoints_dir, metrics_path, submitit_dir, summary_path

from .hpctrain_cli import cli_env, hpctrain, make_dataset, task_logs
from .reference_store import reference_key, stored_weights

if TYPE_CHECKING:
    from .conftest import SlurmCluster

T = TypeVar("T")

SMOKE_SPEC = "jobs/smoke_2x2_cpu.yaml"
# One task per node: what these tests check (a stop, a requeue, a resume, a kill, a lost node, nothing left
# behind) happens per node and per rank, and a second rank on each node doubled every start's CPU (a task's
# imports are ~6.5 CPU-s, more than this job's training; CI's matrix is CPU-bound: docs/testing.md, "Where
# CI's CPU goes"). A test about two ranks sharing a node adds TWO_PER_NODE (torchrun's, the uneven heal's).
NODES = 2
TASKS_PER_NODE = 1
WORLD_SIZE = NODES * TASKS_PER_NODE
LAST_RANK = WORLD_SIZE - 1  # on the second node
TWO_PER_NODE = "resources.tasks_per_node=2"
WORLD_SIZE_TWO_PER_NODE = NODES * 2  # the world of a run submitted with TWO_PER_NODE
STEPS_PER_EPOCH = 6
EPOCHS = 3
# 64 train images / (2 ranks x batch 2) = 16 batches per epoch, 6 of them used.
TRAIN_SETS = (
    f"resources.tasks_per_node={TASKS_PER_NODE}",
    "trainer.deterministic=true",
    f"trainer.epochs={EPOCHS}",
    f"trainer.max_steps_per_epoch={STEPS_PER_EPOCH}",
    "trainer.batch_size=2",
    "checkpoint.every_steps=2",
    "health.ledger_days=0",  # a node these tests kill must not be excluded from the next test's job
    # No burn-in: its probes take 4-6 s of every start on both nodes (the CI log's "burn-in in 4.3 s"), ~1 of
    # every 4 CPU-seconds of a short stop-and-resume test, and none of these tests is about it. The
    # requeue-and-preemption and first-seconds contract tests turn it back on (BURN_IN): signals during it, and
    # weights equal to this reference's across three starts with it; its own tests are test_node_health_e2e.py
    # and test_node_loss_e2e.py's burn-in tests.
    "health.burn_in.enabled=false",
)
BURN_IN = "health.burn_in.enabled=true"  # a test that starts with the burn-in, as a user's job does
# For a run that a test cancels and never resumes: it must still be training when the cancel lands. The
# 18-step run ends 10-20 s after its first checkpoint, and on a loaded 2-core machine `hpctrain cancel` took
# 16 s and found the run completed (the srun twin, two at a time on 22.05: "run status: completed").
UNTIL_CANCELLED = f"trainer.epochs={EPOCHS * 30}"


@dataclass
class Workspace:
    """A private hpctrain state dir, a tiny dataset, and where runs go."""

    env: dict[str, str]
    data: Path
    runs: Path

    def set_items(self, *extra: str) -> list[str]:
        """The training run's ``KEY=VALUE`` overrides, plus ``extra``."""
        return [f"data.root={self.data}", f"output_dir={self.runs}", *TRAIN_SETS, *extra]

    def sets(self, *extra: str) -> list[str]:
        """``--set`` arguments for the training run, plus ``extra``."""
        return [arg for item in self.set_items(*extra) for arg in ("--set", item)]


def make_workspace(cluster: SlurmCluster, tmp: Path, as_user: bool = False) -> Workspace:
    """With ``as_user``, in a folder of the cluster's unprivileged test user, who submits, cancels and resumes."""
    if as_user:
        tmp = cluster.user_dir(tmp.name)
    env = cli_env(cluster, tmp / "state", as_user=as_user)
    return Workspace(env=env, data=make_dataset(env, tmp / "data"), runs=tmp / "runs")


@dataclass
class Run:
    job_id: str
    run_dir: Path

    def summary(self) -> dict[str, Any]:
        return json.loads(summary_path(self.run_dir).read_text())


def submit(ws: Workspace, *extra_sets: str, timeout: float = 60) -> Run:
    """``hpctrain submit`` the training run without waiting."""
    done = hpctrain(ws.env, "submit", SMOKE_SPEC, "--json", *ws.sets(*extra_sets), timeout=timeout)
    assert done.returncode == 0, done
    report = done.json()
    return Run(report["job_id"], Path(report["run_dir"]))


# A wait on a run's progress does not count the time its job spends in the queue: two test files share the
# cluster (two at a time), and the other file's job may hold the nodes for its whole run (a resume waited 116 s
# behind one in rehearsal 31, on a slow machine). At most this much queue time is added to a wait.
QUEUE_ALLOWANCE_S = 300.0
QUEUE_CHECK_S = 5.0  # how often a wait asks squeue whether the run's job is pending
# Nor the time its tasks are visibly working (their logs or the run's metrics grew since the last look): a wait
# bounds a hang, not the machine's speed. On a machine 2-4x slower than usual, busy to 100 % with CI's three
# streams, a resumed job's start-up (imports, burn-in, DDP) and two steps took more than a 90 s wait while every
# rank was logging (rehearsal 32). A hung run writes nothing, and fails after `timeout` as before.
PROGRESS_ALLOWANCE_S = 300.0


def run_output_size(run_dir: Path) -> int:
    """How much the run's tasks have written: their submitit logs and the run's metrics, in bytes."""
    paths = [*submitit_dir(run_dir).glob("*_log.*"), metrics_path(run_dir)]
    total = 0
    for path in paths:
        try:
            total += path.stat().st_size
        except OSError:
            continue
    return total


def wait_for(
    probe: Callable[[], T | None], what: str, timeout: float, run: Run | None = None, poll_s: float = 0.1
) -> T:
    """Poll ``probe`` until it returns something truthy; return that. Fail after ``timeout`` seconds, not
    counting (with ``run``) the time its job was seen pending, up to ``QUEUE_ALLOWANCE_S``, nor the time its
    tasks were seen writing, up to ``PROGRESS_ALLOWANCE_S``."""
    deadline = time.monotonic() + timeout
    checked, queued, working = time.monotonic(), 0.0, 0.0
    written = run_output_size(run.run_dir) if run is not None else 0
    while True:
        value = probe()
        if value:
            return value
        now = time.monotonic()
        if run is not None and now - checked >= QUEUE_CHECK_S:
            interval, size = now - checked, run_output_size(run.run_dir)
            if queued < QUEUE_ALLOWANCE_S and job_pending(run.job_id):
                extra = min(interval, QUEUE_ALLOWANCE_S - queued)
                queued, deadline = queued + extra, deadline + extra
            elif working < PROGRESS_ALLOWANCE_S and size != written:
                extra = min(interval, PROGRESS_ALLOWANCE_S - working)
                working, deadline = working + extra, deadline + extra
            written, checked = size, now
        if now >= deadline:
            break
        time.sleep(poll_s)
    logs = task_logs(run.run_dir) if run is not None else ""
    waited = f" (and {queued:.0f} s while its job was pending)" if queued else ""
    waited += f" (and {working:.0f} s while its tasks were writing)" if working else ""
    raise AssertionError(f"timed out after {timeout:.0f} s{waited} waiting for {what}\n{logs}")


def job_pending(job_id: str) -> bool:
    """Whether squeue shows the job (any of its array tasks) pending on this session's cluster."""
    from .conftest import current_cluster

    cluster = current_cluster()
    if cluster is None:
        return False
    try:
        shown = cluster.run("squeue", "-h", "-j", str(job_id), "-o", "%T", check=False, timeout=30)
    except subprocess.TimeoutExpired:
        return False
    return "PENDING" in shown.stdout.split()


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Global steps of the complete checkpoints (``step-N/`` with its meta.json), ascending."""
    steps = []
    for meta in checkpoints_dir(run_dir).glob("step-*/meta.json"):
        try:
            steps.append(int(meta.parent.name.split("-", 1)[1]))
        except ValueError:
            continue
    return sorted(steps)


def latest_step(run_dir: Path) -> int:
    steps = checkpoint_steps(run_dir)
    return steps[-1] if steps else -1


def temp_checkpoint_dirs(run_dir: Path, step: int | None = None) -> list[Path]:
    """Checkpoint directories still being written (or left half-written), of ``step`` if given."""
    pattern = ".tmp-step-*" if step is None else f".tmp-step-{step:08d}-*"
    return sorted(checkpoints_dir(run_dir).glob(pattern))


def a_step_logged(run_dir: Path) -> bool:
    """Whether metrics.jsonl has a ``train_step`` line yet (while the run writes it: never raises)."""
    try:
        return '"kind": "train_step"' in metrics_path(run_dir).read_text()
    except OSError:
        return False


def train_steps_logged(run_dir: Path) -> list[int]:
    """The global step of every ``train_step`` line of metrics.jsonl, in file order (one per step here)."""
    steps = []
    for line in metrics_path(run_dir).read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if record.get("kind") == "train_step":
                steps.append(int(record["global_step"]))
    return steps


def resume_points(run_dir: Path) -> list[int]:
    """The checkpoints later attempts resumed from, where they went back: a logged step that does not follow on."""
    points, previous = [], 0
    for step in train_steps_logged(run_dir):
        if step != previous + 1:
            points.append(step - 1)
        previous = step
    return points


def job_record(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    """``scontrol -o show job``'s Key=Value fields (empty once the job has left slurmctld)."""
    shown = cluster.run("scontrol", "-o", "show", "job", job_id, check=False)
    fields = {}
    for word in shown.stdout.split():
        key, sep, value = word.partition("=")
        if sep:
            fields.setdefault(key, value)
    return fields


def wait_requeued(
    cluster: SlurmCluster, job_id: str, restarts: int, timeout: float = 60, run: Run | None = None
) -> float:
    """Wait until the job is PENDING again after its ``restarts``-th requeue; return the seconds waited.

    ``run``: its logs (the tasks', the supervisor's and the guardian's) go into the failure message. A job
    that ended instead (COMPLETED, CANCELLED: never requeued now) fails it at once, with its logs."""
    started = time.monotonic()

    def requeued() -> bool:
        record = job_record(cluster, job_id)
        if record.get("JobState") in ("COMPLETED", "CANCELLED"):
            logs = task_logs(run.run_dir) if run is not None else ""
            raise AssertionError(f"job {job_id} ended {record['JobState']} instead of its requeue {restarts}\n{logs}")
        return record.get("JobState") == "PENDING" and int(record.get("Restarts", "0")) >= restarts

    wait_for(requeued, f"job {job_id} to be requeued (restart {restarts})", timeout, run, poll_s=0.2)
    return time.monotonic() - started


def requeue_then_preempt(cluster: SlurmCluster, run: Run, tmp: Path, start_timeout: float) -> tuple[int, int]:
    """The time-limit signal (USR2), then a job of the high-priority partition taking both nodes.

    Each requeued attempt is released at once. Returns the steps at which the
    first and the second attempt stopped.
    """
    wait_for(lambda: latest_step(run.run_dir) >= 2 or None, "the first checkpoint", start_timeout, run)
    cluster.run("scancel", "--signal=USR2", run.job_id)
    wait_requeued(cluster, run.job_id, restarts=1, run=run)
    first_stop = latest_step(run.run_dir)
    cluster.release(run.job_id)

    wait_for(lambda: latest_step(run.run_dir) > first_stop or None, "a checkpoint of attempt 2", start_timeout, run)
    preemptor = preempt(cluster, tmp)
    wait_requeued(cluster, run.job_id, restarts=2, timeout=90, run=run)
    second_stop = latest_step(run.run_dir)
    cluster.release(run.job_id)
    assert cluster.wait_state(preemptor, timeout=60) == "COMPLETED"
    return first_stop, second_stop


def uninterrupted_weights(cluster: SlurmCluster, ws: Workspace, run_timeout: float, *shape: str) -> str:
    """``weights_sha256`` of the run trained without interruption, launched by srun (``shape``: sets that change
    what is trained, e.g. TWO_PER_NODE): trained once per code version and read from the store by every
    session and module after (tests/slurm/reference_store.py). The torchrun tests compare with the 2 x 2 one:
    torchrun's ranks are srun's, and the launcher changes no arithmetic."""

    def train() -> str:
        started = time.monotonic()
        run = submit(ws, "name=uninterrupted", *shape)
        state = cluster.wait_state(run.job_id, timeout=run_timeout)
        assert state == "COMPLETED", task_logs(run.run_dir)
        summary = run.summary()
        done = (summary["status"], summary["global_step"], summary["restarts"])
        assert done == ("completed", EPOCHS * STEPS_PER_EPOCH, 0), summary
        report_timing("uninterrupted reference run", time.monotonic() - started)
        return str(summary["weights_sha256"])

    return stored_weights(reference_key(SMOKE_SPEC, ws.set_items(*shape), ws.data), train)


def assert_completed_exactly(run: Run, restarts: int, reference_weights: str) -> dict[str, Any]:
    """The run completed every step once, after ``restarts`` requeues, with the uninterrupted run's weights."""
    total = EPOCHS * STEPS_PER_EPOCH
    summary = run.summary()
    assert (summary["status"], summary["global_step"], summary["restarts"]) == ("completed", total, restarts), summary
    assert train_steps_logged(run.run_dir) == list(range(1, total + 1)), "no step repeated or skipped"
    assert summary["weights_sha256"] == reference_weights, (
        "an interrupted deterministic run must end with the same weights as an uninterrupted one\n"
        f"{task_logs(run.run_dir)}"
    )
    return summary


def cancel_leaves_nothing(cluster: SlurmCluster, ws: Workspace, run: Run, what: str, start_timeout: float) -> None:
    """``hpctrain cancel`` after the first checkpoint: no process of the job on any node, stopped at a checkpoint.

    ``run`` must not end by itself first (:data:`UNTIL_CANCELLED`)."""
    wait_for(lambda: latest_step(run.run_dir) >= 2 or None, "the first checkpoint", start_timeout, run)
    started = time.monotonic()
    cancelled = hpctrain(ws.env, "cancel", str(run.run_dir), timeout=120)
    assert cancelled.returncode == 0, cancelled
    left, _ = wait_no_processes(cluster, run.job_id, timeout=30)
    report_timing(f"{what}: hpctrain cancel -> no process of the job on any node", time.monotonic() - started)
    assert left == [], f"left behind by job {run.job_id}:\n{describe(left)}"
    assert cluster.wait_state(run.job_id) == "CANCELLED"
    summary = run.summary()
    assert (summary.get("status"), summary.get("stop_reason")) == ("stopped", "cancelled"), summary
    assert latest_step(run.run_dir) == summary["global_step"]


def environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def cmdline_of(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def parent_of(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def rank_pid(cluster: SlurmCluster, job_id: str, rank: int) -> int | None:
    """The main process of global rank ``rank`` (not its data-loader workers, not the batch step)."""
    pids = set(cluster.processes_with_env("SLURM_JOB_ID", job_id))
    found = [
        pid
        for pid in pids
        if environ_of(pid).get("SLURM_PROCID") == str(rank)
        and "submitit.core._submit" in cmdline_of(pid)
        and "hpctrain.healing.supervisor" not in cmdline_of(pid)  # a healing job's batch step names it too
        and parent_of(pid) not in pids
    ]
    return found[0] if len(found) == 1 else None


def escapees(cluster: SlurmCluster, job_id: str) -> list[int]:
    """The job's ``sleep 1000`` processes that init adopted (see stop_entrypoints.spawn_escapee)."""
    return [
        pid
        for pid in cluster.processes_with_env("SLURM_JOB_ID", job_id)
        if cmdline_of(pid) == ["sleep", "1000"] and parent_of(pid) == 1
    ]


def wait_no_processes(cluster: SlurmCluster, job_id: str, timeout: float) -> tuple[list[int], float]:
    """(PIDs of the job still alive after ``timeout`` s -- empty as soon as none are left, seconds waited)."""
    started = time.monotonic()
    deadline = started + timeout
    pids = cluster.processes_with_env("SLURM_JOB_ID", job_id)
    while pids and time.monotonic() < deadline:
        time.sleep(0.2)
        pids = cluster.processes_with_env("SLURM_JOB_ID", job_id)
    return pids, time.monotonic() - started


def describe(pids: list[int]) -> str:
    return "\n".join(f"  {pid} (parent {parent_of(pid)}): {' '.join(cmdline_of(pid))}" for pid in pids)


def report_timing(label: str, seconds: float) -> None:
    """One greppable line per measured interval (shown with ``pytest -s``)."""
    print(f"\n[timing] {label}: {seconds:.1f} s", flush=True)


def preempt(cluster: SlurmCluster, tmp: Path, seconds: int = 5) -> str:
    """A job of the high-priority partition that needs both nodes: Slurm preempts whatever runs there."""
    out = str(tmp / "urgent-%j.out")
    return cluster.sbatch("-p", "urgent", "-N2", "--exclusive", "-o", out, "--wrap", f"sleep {seconds}")


def wait_files(folder: Path, prefix: str, count: int, what: str, timeout: float, run: Run | None = None) -> list[Path]:
    """Wait until ``count`` files ``FOLDER/PREFIX*`` exist (one per rank of a held start); return them."""

    def found() -> list[Path] | None:
        files = sorted(folder.glob(f"{prefix}*"))
        return files if len(files) >= count else None

    return wait_for(found, what, timeout, run)


def stop_lines(run: Run) -> list[str]:
    """Rank 0's 'stopping (...)' lines, every start's, in order."""
    out = (run.run_dir / "submitit" / f"{run.job_id}_0_log.out").read_text()
    return [line for line in out.splitlines() if line.startswith("stopping (")]


def node_processes(node: str) -> list[int]:
    """Every process in ``node``'s network namespace (slurmd, slurmstepd, srun clients, the ranks)."""
    netns = os.stat(f"/run/netns/hpctrain-{node}")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ns = os.stat(entry / "ns" / "net")
        except OSError:
            continue
        if (ns.st_dev, ns.st_ino) == (netns.st_dev, netns.st_ino):
            found.append(int(entry.name))
    return found


def kill_node(node: str) -> list[int]:
    """A power loss of ``node``: every process in its network namespace stops at once (SIGSTOP, until none is
    left running), then all are SIGKILLed, every process before its parent.

    Killed one by one in pid order while running, the later ones could act on the earlier ones' deaths (once in
    rehearsal 24 and likely CI #52, the guardian's step on the other node was cancelled in the second the batch
    node was killed, 41 s before slurmctld knew of it). Stopped first, but still killed in pid order, they woke
    again: the batch step's slurmstepd died first, which orphaned the process group of the batch script (the
    supervisor and its srun clients), all stopped, and the kernel sends such a group SIGHUP and SIGCONT (POSIX's
    orphaned process group rule; seen in a signal trace: ``sig=1 code=128`` from the dying slurmstepd). srun
    answers SIGHUP with "forcing job termination", a SIGKILL to its step's tasks: the guardian on the other
    node died with them, and nothing requeued the job (CI #55: "srun: forcing job termination", "srun: got
    SIGCONT" in the batch log). Children first, no stopped process is left in a group that loses its link."""
    for _ in range(5):  # a process forked while the others were being stopped is stopped in the next round
        stopped = node_processes(node)
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        if set(node_processes(node)) <= set(stopped):
            break
    killed = []
    for pid in sorted(node_processes(node), key=process_depth, reverse=True):  # the deepest first
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    assert killed, f"nothing ran in {node}'s namespace"
    return killed


def process_depth(pid: int) -> int:
    """How many ancestors ``pid`` has (0 for one already gone): a child is always deeper than its parent."""
    depth = 0
    while pid > 1 and depth < 1000:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        depth += 1
    return depth
