"""The one Slurm client: every Slurm command hpctrain runs, through one injectable runner.

:class:`Slurm` runs ``sbatch``/``squeue``/``sacct``/``sacctmgr``/``scontrol``/
``scancel``/``sinfo`` -- the verbs' questions and actions, the doctor's view of
a cluster, the requeue logic and the healing supervisor's calls -- and turns
each way they fail (not installed, no answer, the controller unreachable, a
job id Slurm does not know, a refusal) into a :class:`SlurmCommandError` (a
``ClusterError`` with a hint and a ``kind`` callers act on; it, and the checks
of the ids that reach a command, live in :mod:`hpctrain.contract.slurm_errors`
and are imported from here). Its runner is ``subprocess.run`` or a stand-in
with the same signature: a test's recorded answers, or the relay out of a
container (``runtime/slurm_relay.py``), so nothing needs fake binaries on PATH. What the answers mean is
:mod:`hpctrain.contract.slurm_answers` (parsers) and
:mod:`hpctrain.contract.slurm_states` (the state table).

A run's own ``sbatch`` goes through submitit's public executor API
(``hpctrain.launch.submission``); its ``--signal`` line is written from the
spec, never from the submitting shell's ``SUBMITIT_PREEMPT_SIGNAL``. Helper
jobs (the doctor's probe, ``bench-data --slurm``) are ``sbatch --wrap`` lines
built here (:func:`sbatch_wrap_command`). No other module of hpctrain builds an
argv that starts with a Slurm command (``tests/unit/test_house_layering.py``).

Light on purpose: login-node commands and compute-node code both use it;
compute-node code passes a job id from ``TaskEnv`` and never reads ``SLURM_*`` here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from hpctrain.contract import slurm_answers as answers
from hpctrain.contract.slurm_errors import (  # the client's errors and checks: import them from here
    SlurmCommandError,
    WaitTimedOut,
    checked_job_id,
    checked_node_name,
    classify_failure,
    is_job_id,
    is_node_list,
    is_step_id,
)
from hpctrain.contract.slurm_states import is_final, may_have_processes, normalise_state
from hpctrain.errors import ClusterError

COMMAND_TIMEOUT_S = 30.0
# slurm.conf's defaults, for a cluster that does not say.
DEFAULT_KILL_WAIT_S = 30.0  # seconds between SIGTERM and SIGKILL when a job ends
DEFAULT_MAX_ARRAY_SIZE = 1001  # array task ids run 0..1000
DEFAULT_SLURMD_PORT = 6818
# Slurm 22.05's slurmd refuses to start a job whose credential is not newer, in whole seconds, than the
# revocation of its previous start: a requeued job released within the second of its requeue fails at
# once ("Killing non-startable batch JobId=N: Job credential revoked", seen on the test cluster). Slurm's
# own hold of a requeued job (~120 s) never meets it; a release must wait this long after the requeue.
RELEASE_AFTER_REQUEUE_S = 1.0
# The clients a login node needs: submit, follow, inspect, cancel.
CLIENTS = ("sbatch", "squeue", "sacct", "scontrol", "scancel")
VERSION_COMMAND = ("scontrol", "--version")

Runner = Callable[..., "subprocess.CompletedProcess[str]"]
Which = Callable[[str], "str | None"]

# ------------------------------------------------------------------ argv (pure)


def sbatch_wrap_command(
    *,
    job_name: str,
    wrap: str,
    output: Path,
    time_min: int,
    options: Sequence[tuple[str, str | int | None]] = (),
) -> list[str]:
    """``sbatch --wrap`` for a short one-task helper job that must not come back (the doctor's probe,
    ``bench-data --slurm``); ``options``: more ``--NAME=VALUE`` lines (a None value is left out). Pure."""
    args = ["sbatch", "--parsable", f"--job-name={job_name}", "--nodes=1", "--ntasks=1", f"--time={time_min}"]
    args += [f"--output={output}", "--no-requeue"]
    for name, value in options:
        if value is True:
            args.append(f"--{name}")
        elif value is not None and value is not False and value != "":
            args.append(f"--{name}={value}")
    return [*args, "--wrap", wrap]


def sacct_states_command(job_ids: list[str]) -> list[str]:
    """``sacct`` asked for the states of ``job_ids`` (checked ids), one line each: ``JobID|State``."""
    return ["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)]


def requeue_command(job_id: str) -> list[str]:
    return ["scontrol", "requeue", checked_job_id(job_id)]


def disable_requeue_command(job_id: str) -> list[str]:
    return ["scontrol", "update", f"JobId={checked_job_id(job_id)}", "Requeue=0"]


def show_job_command(job_id: str) -> list[str]:
    return ["scontrol", "--oneliner", "show", "job", checked_job_id(job_id)]


def sbatch_test_only_command(options: Sequence[tuple[str, str | int | bool | None]]) -> list[str]:
    """``sbatch --test-only`` of a job with ``options`` (``--NAME=VALUE`` each; True: a bare flag; None, False
    and "": left out): Slurm's scheduler says when it would start such a job, and queues nothing. Pure."""
    args = ["sbatch", "--test-only"]
    for name, value in options:
        if value is True:
            args.append(f"--{name}")
        elif value is not None and value is not False and value != "":
            args.append(f"--{name}={value}")
    return [*args, "--wrap", "true"]


def run_slurm(
    command: list[str], *, timeout_s: float = COMMAND_TIMEOUT_S, runner: Runner = subprocess.run, stderr: bool = False
) -> str:
    """Run one Slurm command; its stdout (``stderr``: and then its stderr), or a :class:`SlurmCommandError`."""
    try:
        done = runner(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise SlurmCommandError(
            f"'{command[0]}' is not on this machine", "missing", hint="run this on a Slurm login node"
        ) from None
    except OSError as exc:  # not executable, too many processes...
        raise SlurmCommandError(f"could not run '{command[0]}': {exc}", "missing") from None
    except subprocess.TimeoutExpired:
        raise SlurmCommandError(
            f"'{' '.join(command)}' did not answer in {timeout_s:.0f} s",
            "timeout",
            hint="slurmctld may be busy; try again",
        ) from None
    if done.returncode != 0:
        raise classify_failure(command, done.returncode, done.stderr or done.stdout or "")
    return (done.stdout or "") + ((done.stderr or "") if stderr else "")


# ------------------------------------------------------------------ the client


# What a client made without arguments uses: the machine's own Slurm. A test may put recorded answers
# here for every client the library makes (tests/fake_slurm.py), so both faces talk to the same fake.
default_runner: Runner = subprocess.run
default_which: Which = shutil.which


class Slurm:
    """Slurm as hpctrain asks it: one runner (:data:`default_runner` unless a test or a container gives
    another), ``which`` for what is installed, ``sleep``/``clock`` for the waits."""

    def __init__(
        self,
        runner: Runner | None = None,
        *,
        which: Which | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runner = runner if runner is not None else default_runner
        self.which = which if which is not None else default_which
        self.sleep, self.clock = sleep, clock
        self._config: dict[str, str] | None = None

    def run(self, *command: str, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
        return run_slurm(list(command), timeout_s=timeout_s, runner=self.runner)

    # -------------------------------------------------------------- is it here?

    def available(self) -> bool:
        """Whether this machine can submit and follow jobs: ``sbatch``, and ``sacct`` or ``squeue``."""
        return self.which("sbatch") is not None and (
            self.which("sacct") is not None or self.which("squeue") is not None
        )

    def missing_clients(self) -> list[str]:
        """Which of :data:`CLIENTS` are not on PATH."""
        return [name for name in CLIENTS if self.which(name) is None]

    # -------------------------------------------------------------- jobs

    def job_state(self, job_id: str, *, source: Literal["sacct", "squeue"] = "sacct") -> str:
        """The job's Slurm state (array task ids like 12_3 work too); ``status --watch`` polls this.

        ``sacct`` asks slurmdbd, not the controller; ``squeue`` is for clusters
        without accounting. A job sacct does not list under its own id -- not yet
        (slurmdbd catches up a few seconds after submit), or an array listed by
        its tasks -- is looked up in ``squeue``, which still lists an array's
        unfinished tasks; then sacct's first line answers. So is a job sacct
        calls PREEMPTED: that is final, unless slurmctld is requeueing the job
        (squeue then lists it COMPLETING or PENDING). "UNKNOWN" when neither
        lists it (squeue forgets a finished job) or, asking sacct, when this
        machine has no squeue. Raises SlurmCommandError.
        """
        job_id = checked_job_id(job_id)
        states: dict[str, str] = {}
        if source == "sacct":
            states = answers.parse_sacct_states(self.run(*sacct_states_command([job_id])))
            if job_id in states and states[job_id] != "PREEMPTED":
                return states[job_id]
        try:
            lines = self.run("squeue", "-h", "-o", "%T", "-j", job_id).split()
        except SlurmCommandError as exc:
            if exc.kind not in ("unknown-job", "missing") or source == "squeue":
                raise
            lines = []
        if lines:
            return normalise_state(lines[0])
        return states.get(job_id) or next(iter(states.values()), "UNKNOWN")

    def job_states(self, job_ids: Sequence[str]) -> dict[str, str]:
        """States of several jobs in one ``sacct`` call ({} when Slurm cannot say); for listings."""
        wanted = [job_id for job_id in job_ids if is_job_id(str(job_id))]  # others: not Slurm's
        if not wanted or not self.available():
            return {}
        try:
            return answers.parse_sacct_states(self.run(*sacct_states_command(wanted)))
        except ClusterError:
            return {}

    def wait_for(
        self,
        job_id: str,
        until: Callable[[str], bool] = is_final,
        timeout_s: float | None = None,
        *,
        poll_s: float = 2.0,
    ) -> str:
        """Ask the job's state until ``until(state)`` holds (by default: the job ended); that state.

        Raises :class:`WaitTimedOut` (with the last state) after ``timeout_s``.
        """
        deadline = None if timeout_s is None else self.clock() + timeout_s
        while True:
            state = self.job_state(job_id)
            if until(state):
                return state
            if deadline is not None and self.clock() >= deadline:
                raise WaitTimedOut(job_id, state, timeout_s or 0.0)
            self.sleep(poll_s)

    def processes_may_run(self, job_id: str) -> bool:
        """Whether any process of the job may still be alive (``squeue`` says so, or cannot say)."""
        job_id = checked_job_id(job_id)
        try:
            output = self.run("squeue", "-h", "-t", "all", "-o", "%T", "-j", job_id)
        except SlurmCommandError as exc:
            return exc.kind != "unknown-job"  # forgotten by Slurm: long gone
        return any(may_have_processes(line) for line in output.splitlines() if line.strip())

    def show_job(self, job_id: str, *, timeout_s: float = COMMAND_TIMEOUT_S) -> dict[str, str]:
        """The job's record from slurmctld (``scontrol show job``); raises SlurmCommandError."""
        return answers.parse_job_record(self.run(*show_job_command(job_id), timeout_s=timeout_s))

    def job_times(self, job_id: str) -> answers.JobTimes | None:
        """The job's state, (expected) start and end, and time left, from ``squeue``; None once squeue has
        forgotten it. A pending job's start is the scheduler's own estimate (None until it has one).
        Raises SlurmCommandError."""
        command = ["squeue", "-h", "-t", "all", "-o", answers.JOB_TIMES_FORMAT, "-j", checked_job_id(job_id)]
        try:
            return answers.parse_job_times(self.run(*command))
        except SlurmCommandError as exc:
            if exc.kind == "unknown-job":
                return None
            raise

    def job_steps(self, job_id: str) -> list[tuple[str, str]]:
        """The job's running steps, (step id, name) each; raises SlurmCommandError."""
        return answers.parse_job_steps(self.run("squeue", "-h", "-s", "-j", checked_job_id(job_id), "-o", "%i %j"))

    # -------------------------------------------------------------- the cluster

    def client_version(self) -> tuple[int, int] | None:
        """This machine's Slurm release, (major, minor), from ``scontrol --version``; None when unknown."""
        try:
            return answers.parse_version(self.run(*VERSION_COMMAND, timeout_s=10.0))
        except ClusterError:
            return None

    def version_text(self, *, timeout_s: float = 15.0) -> str:
        """What ``sbatch --version`` says; raises SlurmCommandError."""
        return self.run("sbatch", "--version", timeout_s=timeout_s)

    def ping(self, *, timeout_s: float = 15.0) -> str:
        """What ``scontrol ping`` says about the controller; raises SlurmCommandError."""
        return self.run("scontrol", "ping", timeout_s=timeout_s)

    def accounting(self, *, timeout_s: float = 15.0) -> str:
        """The last hour's jobs from ``sacct`` (whether accounting answers at all); raises SlurmCommandError."""
        return self.run("sacct", "-n", "-X", "-P", "-S", "now-1hours", "-o", "JobID", timeout_s=timeout_s)

    def config(self, *, timeout_s: float = COMMAND_TIMEOUT_S) -> dict[str, str]:
        """``scontrol show config``, asked once per client; raises SlurmCommandError."""
        if self._config is None:
            self._config = answers.parse_config(self.run("scontrol", "show", "config", timeout_s=timeout_s))
        return self._config

    def _config_number(self, key: str, default: int, timeout_s: float = COMMAND_TIMEOUT_S) -> int:
        try:
            value = answers.config_number(self.config(timeout_s=timeout_s), key)
        except ClusterError:
            value = None
        return default if value is None else value

    def kill_wait_s(self) -> float:
        """Slurm's KillWait (SIGTERM -> SIGKILL when a job ends); the default when unknown."""
        return float(self._config_number("KillWait", int(DEFAULT_KILL_WAIT_S)))

    def slurmd_port(self) -> int:
        """The port every node's slurmd listens on; Slurm's default when unknown."""
        return self._config_number("SlurmdPort", DEFAULT_SLURMD_PORT)

    def max_array_size(self) -> int:
        """Slurm's MaxArraySize (an array may have at most this many tasks); 1001, its default, when unknown."""
        if self.which("scontrol") is None:
            return DEFAULT_MAX_ARRAY_SIZE
        return self._config_number("MaxArraySize", DEFAULT_MAX_ARRAY_SIZE, timeout_s=5.0)

    def requeue_hold_s(self, *, timeout_s: float = 10.0) -> int:
        """How long a requeued job is held before it may start again (Slurm's cred_expire); never raises:
        Slurm's default, 120 s, when the controller does not answer."""
        try:
            return answers.requeue_hold_s(self.config(timeout_s=timeout_s))
        except ClusterError:
            return answers.DEFAULT_REQUEUE_HOLD_S

    def expedited_requeue(self, *, timeout_s: float = 10.0) -> answers.ExpeditedRequeue:
        """Whether the cluster takes ``sbatch --requeue=expedite`` (Slurm 25.11+ with
        ``SlurmctldParameters=enable_expedited_requeue``); never raises: a controller that does not
        answer is "not available", with why."""
        try:
            config = self.config(timeout_s=timeout_s)
        except ClusterError as exc:
            return answers.ExpeditedRequeue(False, f"scontrol show config did not answer ({exc})")
        return answers.expedited_requeue_support(config)

    def partitions(self, *, timeout_s: float = 10.0) -> dict[str, dict[str, str]]:
        """Every partition's record, from one ``scontrol show partition``; raises SlurmCommandError."""
        return answers.parse_partitions(self.run("scontrol", "--oneliner", "show", "partition", timeout_s=timeout_s))

    def nodes(self, *, timeout_s: float = 15.0) -> list[dict[str, str]]:
        """Every node's record, from one ``scontrol show node``; raises SlurmCommandError."""
        return answers.parse_nodes(self.run("scontrol", "--oneliner", "show", "node", timeout_s=timeout_s))

    def node_states(self, nodes: Sequence[str]) -> dict[str, str]:
        """``sinfo``'s state of each of ``nodes``; raises SlurmCommandError."""
        names = [node for node in nodes if is_node_list(node)]
        if not names:
            return {}
        return answers.parse_node_states(self.run("sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N %T"))

    def associations(self, user: str | None = None, *, timeout_s: float = 15.0) -> list[dict[str, str]] | None:
        """``user``'s (default: this one's) account/partition/QOS associations; None when sacctmgr does not
        answer here."""
        if self.which("sacctmgr") is None:
            return None
        user = user if user is not None else _user_name()
        try:
            output = self.run(
                "sacctmgr", "-n", "-P", "show", "assoc", f"user={user}", "format=Account,Partition,QOS",
                timeout_s=timeout_s,
            )  # fmt: skip
        except ClusterError:
            return None
        return answers.parse_associations(output)

    def test_only(
        self, options: Sequence[tuple[str, str | int | bool | None]], *, timeout_s: float = COMMAND_TIMEOUT_S
    ) -> answers.StartAnswer:
        """When the scheduler would start a job with ``options`` now (:func:`sbatch_test_only_command`; nothing is
        queued). Raises SlurmCommandError: ``refused`` with what the refusal means and what to change (the
        job can never run so, a partition or account that is not there), or an answer that names no start."""
        command = sbatch_test_only_command(options)
        try:
            said = run_slurm(command, timeout_s=timeout_s, runner=self.runner, stderr=True)
        except SlurmCommandError as exc:
            if exc.kind != "refused":
                raise
            meaning, hint = answers.classify_sbatch_failure(exc.output)
            first = " / ".join(exc.output.strip().splitlines()[:2])
            raise SlurmCommandError(f"sbatch --test-only: {meaning}: {first}", "refused", hint, exc.output) from None
        found = answers.parse_test_only(said)
        if found is None:
            shown = " / ".join(said.strip().splitlines()[:2]) or "nothing"
            raise SlurmCommandError(f"sbatch --test-only named no start time (it said: {shown[:200]})", "refused")
        return found

    # -------------------------------------------------------------- actions

    def submit_wrapped(self, command: list[str]) -> str:
        """Submit an :func:`sbatch_wrap_command`; the new job's id (``--parsable`` prints ``ID[;CLUSTER]``).

        A refusal says what it means for the job and what to change (``slurm_answers.SBATCH_FAILURES``).
        """
        try:
            answer = self.run(*command)
        except SlurmCommandError as exc:
            if exc.kind != "refused":
                raise
            meaning, hint = answers.classify_sbatch_failure(exc.output)
            said = " / ".join(exc.output.strip().splitlines()[:3])
            raise SlurmCommandError(f"sbatch: {meaning}: {said}", "refused", hint=hint, output=exc.output) from None
        return checked_job_id(answer.strip().split(";")[0])

    def cancel_job(self, job_id: str) -> None:
        self.run("scancel", checked_job_id(job_id))

    def signal_job(self, job_id: str, signal_name: str) -> None:
        """Send ``signal_name`` to every task of the job, as Slurm does before the time limit."""
        self.run("scancel", f"--signal={signal_name}", checked_job_id(job_id))

    def kill_step(self, step_id: str) -> None:
        """SIGKILL every task of one job step (``12.0``): a step waiting for a lost node never ends otherwise."""
        if not is_step_id(step_id):
            raise SlurmCommandError(f"{step_id[:40]!r} is not a Slurm job step id", kind="unknown-job")
        self.run("scancel", "--signal=KILL", step_id)

    def release_job(self, job_id: str) -> None:
        """Start a requeued job (held until its begin time) now, :data:`RELEASE_AFTER_REQUEUE_S` after the
        caller saw it pending, so after its requeue."""
        self.sleep(RELEASE_AFTER_REQUEUE_S)
        self.run("scontrol", "update", f"JobId={checked_job_id(job_id)}", "StartTime=now")

    def set_dependency(self, job_id: str, dependency: str) -> None:
        """Point a pending job's dependency elsewhere (``afterany:JOB``): a chain's upstream got a new job."""
        self.run("scontrol", "update", f"JobId={checked_job_id(job_id)}", f"Dependency={dependency}")

    def requeue_job(self, job_id: str, *, timeout_s: float = COMMAND_TIMEOUT_S) -> None:
        self.run(*requeue_command(job_id), timeout_s=timeout_s)

    def disable_requeue(self, job_id: str, *, timeout_s: float = COMMAND_TIMEOUT_S) -> None:
        """Take the job's ``Requeue`` flag away: nothing may requeue it any more, Slurm included.

        Slurm 24.05+ requeues a job that ends while it holds a preemption's flag
        (``GRACE_PREEMPT``), only if the job is requeueable; the flag itself cannot be
        cleared or seen (docs/preemption.md). A job's owner may change it while it runs.
        """
        self.run(*disable_requeue_command(job_id), timeout_s=timeout_s)

    def exclude_nodes(self, job_id: str, nodes: Sequence[str]) -> None:
        """Keep ``nodes`` out of the (pending) job's next start (``ExcNodeList``); nothing for no nodes."""
        if nodes:
            self.run(*exclude_nodes_command(job_id, nodes))

    def partition_nodes(
        self, partition: str | None, *, needs: answers.NodeNeeds | None = None, timeout_s: float = 10.0
    ) -> list[str]:
        """The nodes of ``partition`` (every partition for None) that may run a job (not down, drained, failed)
        and offer what one node of it ``needs`` (features, GPUs, CPUs)."""
        found = self.usable_nodes(partition, needs=needs, timeout_s=timeout_s)
        return list(dict.fromkeys(node for nodes in found.values() for node in nodes))

    def usable_nodes(
        self, partitions: str | None, *, needs: answers.NodeNeeds | None = None, timeout_s: float = 10.0
    ) -> dict[str, list[str]]:
        """Each of ``partitions``' (a comma list; every partition for None) nodes that may run a job
        (``slurm_answers.node_runs_jobs``) and offer what one node of it ``needs`` (``slurm_answers.NodeNeeds``:
        features, GRES GPUs, CPUs); raises SlurmCommandError."""
        command = ["sinfo", "-h", "-N", "-o", answers.PARTITION_NODES_FORMAT]
        if partitions:
            command += ["-p", partitions]
        return answers.parse_partition_nodes(self.run(*command, timeout_s=timeout_s), needs or answers.NodeNeeds())


def exclude_nodes_command(job_id: str, nodes: Sequence[str]) -> list[str]:
    """``scontrol update`` of a pending job's ``ExcNodeList`` (node names checked: no option, no list trick)."""
    for node in nodes:
        checked_node_name(node)
    return ["scontrol", "update", f"JobId={checked_job_id(job_id)}", f"ExcNodeList={','.join(nodes)}"]


def _user_name() -> str:
    return os.environ.get("USER") or os.environ.get("LOGNAME") or ""
