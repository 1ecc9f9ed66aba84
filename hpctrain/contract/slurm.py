"""Every Slurm command hpctrain runs, and what its answers mean.

One runner (:func:`run_slurm`) runs ``squeue``/``sacct``/``scontrol``/``scancel``
and turns each way they fail -- not installed, no answer, the controller
unreachable, a job id Slurm does not know, a refusal -- into a
:class:`SlurmCommandError` (a ``ClusterError`` with a hint). One state table
(:mod:`hpctrain.contract.slurm_states`) says what each job state means;
helper jobs (doctor's probe) go through :func:`submit_wrapped`. A run's
``sbatch`` goes through submitit's public executor API
(``hpctrain.launch.submission``); the ``--signal`` line it carries is written
here, from the spec, never from the submitting shell's ``SUBMITIT_PREEMPT_SIGNAL``.

Light on purpose: login-node commands (status, cancel, resume, rehearse,
submit --wait) and the runtime's requeue use it. Parsers are pure and tested
on recorded output; compute-node code passes a job id from ``TaskEnv`` and
never reads ``SLURM_*`` here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from hpctrain.contract.slurm_states import (  # noqa: F401  (re-exported: the client's vocabulary)
    ACTIVE_STATES,
    TERMINAL_STATES,
    is_final,
    is_pending,
    may_have_processes,
    normalise_state,
    succeeded,
    was_cancelled,
)
from hpctrain.errors import ClusterError

COMMAND_TIMEOUT_S = 30.0
# slurm.conf's default KillWait: seconds between SIGTERM and SIGKILL when a job ends.
DEFAULT_KILL_WAIT_S = 30.0
# slurm.conf's default MaxArraySize: array task ids run 0..1000.
DEFAULT_MAX_ARRAY_SIZE = 1001
# Slurm 22.05's slurmd refuses to start a job whose credential is not newer, in whole seconds, than the
# revocation of its previous start: a requeued job released within the second of its requeue fails at
# once ("Killing non-startable batch JobId=N: Job credential revoked", seen on the test cluster). Slurm's
# own hold of a requeued job (~120 s) never meets it; a release must wait this long after the requeue.
RELEASE_AFTER_REQUEUE_S = 1.0
# slurm.conf's default SlurmdPort.
DEFAULT_SLURMD_PORT = 6818

Runner = Callable[..., "subprocess.CompletedProcess[str]"]
FailureKind = Literal["missing", "timeout", "unreachable", "unknown-job", "refused"]

_UNREACHABLE = ("unable to contact slurm controller", "connection refused", "socket timed out", "zero bytes were")
_UNKNOWN_JOB = ("invalid job id", "job id not found", "no such job")
# A job id as hpctrain records one: 123, an array task 123_4, a het-job component 123+1. Anything else
# (``--user=me``, ``-1``, a list) would become an option or a wider target of scancel/scontrol/sacct.
_JOB_ID = re.compile(r"[0-9]{1,20}(_[0-9]{1,10})?(\+[0-9]{1,6})?")
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class SlurmCommandError(ClusterError):
    """A Slurm command failed; ``kind`` says how, so callers can decide to retry."""

    def __init__(self, message: str, kind: FailureKind, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.kind = kind


# ------------------------------------------------------------------ pure parts


def checked_job_id(job_id: object) -> str:
    """``job_id`` if it names one job (or array task, or het-job component); else a refusal.

    Job ids come from run.json, study.json and the registry, files anyone may
    edit: every command that names a job checks it here first.
    """
    text = str(job_id).strip()
    if not _JOB_ID.fullmatch(text):
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise SlurmCommandError(
            f"{shown!r} is not a Slurm job id",
            kind="unknown-job",
            hint="the run's run.json names its job as a number such as 48121 or 48121_3; was it edited?",
        )
    return text


def parse_sacct_states(output: str) -> dict[str, str]:
    """Lines of ``sacct -X -n -P -o JobID,State`` -> {job id: state}."""
    states = {}
    for line in output.splitlines():
        if "|" not in line:
            continue
        job_id, _, state = line.partition("|")
        states[job_id.strip()] = normalise_state(state)
    return states


def parse_job_record(text: str) -> dict[str, str]:
    """The ``Key=Value`` fields of one ``scontrol -o show job`` line we use."""
    fields = {}
    for key in ("JobState", "Restarts", "PreemptTime", "Requeue"):
        match = re.search(rf"(?:^|\s){key}=(\S+)", text)
        if match:
            fields[key] = match.group(1)
    return fields


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config`` -> {"KillWait": "30 sec", "PreemptMode": "REQUEUE", ...}. Pure."""
    return dict(re.findall(r"^\s*(\w+)\s*=\s*(.*?)\s*$", text, re.MULTILINE))


def _config_number(config: str, key: str) -> int | None:
    match = re.match(r"\d+", parse_config(config).get(key, ""))
    return int(match.group(0)) if match else None


def parse_kill_wait_s(config: str) -> float | None:
    """``KillWait = 30 sec`` from ``scontrol show config``; None when absent."""
    value = _config_number(config, "KillWait")
    return None if value is None else float(value)


def parse_max_array_size(config: str) -> int | None:
    """``MaxArraySize = 1001`` from ``scontrol show config``; None when absent."""
    return _config_number(config, "MaxArraySize")


def parse_slurmd_port(config: str) -> int | None:
    """``SlurmdPort = 6818`` from ``scontrol show config``; None when absent."""
    return _config_number(config, "SlurmdPort")


def parse_nodes(output: str) -> list[dict[str, str]]:
    """``scontrol -o show node`` -> one {"NodeName": ..., "Gres": ..., ...} per node. Pure."""
    return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in output.splitlines() if "NodeName=" in line]


def parse_associations(output: str) -> list[dict[str, str]]:
    """``sacctmgr -n -P show assoc format=Account,Partition,QOS`` -> [{"account", "partition", "qos"}]. Pure."""
    rows = []
    for line in output.splitlines():
        account, _, rest = line.partition("|")
        partition, _, qos = rest.partition("|")
        rows.append({"account": account, "partition": partition, "qos": qos})
    return rows


def parse_version(text: str) -> tuple[int, int] | None:
    """``slurm 24.11.5`` (any client's ``--version``; Debian says ``slurm-wlm``) -> (24, 11); None if absent."""
    match = re.search(r"(?:^|\s)(\d{2})\.(\d{2})(?:\.\d+)?", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def parse_partitions(output: str) -> dict[str, dict[str, str]]:
    """``scontrol -o show partition`` -> {name: {"MaxTime": ..., "Default": ..., "State": ...}}."""
    partitions = {}
    for line in output.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "PartitionName" in fields:
            partitions[fields["PartitionName"]] = fields
    return partitions


# sbatch's refusals ("sbatch: error: Batch job submission failed: ...") -> what to change.
SBATCH_FAILURES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (
        _UNREACHABLE,
        "the Slurm controller did not answer",
        "slurmctld may be down or restarting: try again in a minute, or ask the admins; nothing was queued",
    ),
    (
        ("invalid partition",),
        "the partition does not exist",
        "set resources.partition (or the profile's partition) to one that 'sinfo -s' lists",
    ),
    (
        ("invalid account", "invalid qos", "association", "account/partition"),
        "the account or QOS is not valid for you on this partition",
        "set resources.account / resources.qos to one 'sacctmgr show assoc user=$USER' lists",
    ),
    (
        ("time limit",),
        "the time limit exceeds what the partition allows",
        "lower resources.time to the partition's MaxTime ('sinfo -o \"%P %l\"'); resume continues longer runs",
    ),
    (
        (
            "requested node configuration is not available",
            "node count specification invalid",
            "more processors requested than permitted",
            "invalid generic resource",
            "memory required by task is not available",
            "requested partition configuration not available",
        ),
        "no node can ever satisfy the request",
        "ask for fewer resources.nodes, gpus_per_node, cpus_per_task or mem_gb (see 'sinfo -N -l'), "
        "or another partition",
    ),
)


def classify_sbatch_failure(text: str) -> tuple[str, str]:
    """What a refused submission means and what to change. Pure."""
    lowered = text.lower()
    for needles, meaning, hint in SBATCH_FAILURES:
        if any(needle in lowered for needle in needles):
            return meaning, hint
    return "Slurm refused the job", "check partition/account/qos/time against 'sinfo' and 'sacctmgr show assoc'"


def sbatch_wrap_command(
    *,
    job_name: str,
    wrap: str,
    output: Path,
    time_min: int,
    partition: str | None = None,
    gres: str | None = None,
    account: str | None = None,
    qos: str | None = None,
) -> list[str]:
    """``sbatch --wrap`` for a short one-task helper job that must not come back (doctor's probe). Pure."""
    args = ["sbatch", "--parsable", f"--job-name={job_name}", "--nodes=1", "--ntasks=1", f"--time={time_min}"]
    args += [f"--output={output}", "--no-requeue"]
    for option, value in (("partition", partition), ("gres", gres), ("account", account), ("qos", qos)):
        if value:
            args.append(f"--{option}={value}")
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


def classify_failure(command: list[str], returncode: int, output: str) -> SlurmCommandError:
    """A non-zero exit of a Slurm command as the project's error. Pure."""
    shown, text = " ".join(command), output.strip() or "no output"
    lowered = text.lower()
    if any(needle in lowered for needle in _UNREACHABLE):
        return SlurmCommandError(
            f"'{shown}' could not reach the Slurm controller: {text}",
            "unreachable",
            hint="slurmctld may be down or restarting; try again in a minute, or ask the admins",
        )
    if any(needle in lowered for needle in _UNKNOWN_JOB):
        return SlurmCommandError(
            f"'{shown}': Slurm does not know this job ({text})",
            "unknown-job",
            hint="Slurm forgets finished jobs after MinJobAge; 'hpctrain status RUN_DIR' still shows the run",
        )
    return SlurmCommandError(f"'{shown}' failed (exit {returncode}): {text}", "refused")


# ------------------------------------------------------------------ the runner


def run_slurm(command: list[str], *, timeout_s: float = COMMAND_TIMEOUT_S, runner: Runner = subprocess.run) -> str:
    """Run one Slurm command; its stdout, or a :class:`SlurmCommandError`."""
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
    return done.stdout or ""


def available() -> bool:
    """Whether this machine has Slurm's client commands."""
    return shutil.which("sacct") is not None or shutil.which("squeue") is not None


# ------------------------------------------------------------------ questions


def job_states(job_ids: list[str], *, runner: Runner = subprocess.run) -> dict[str, str]:
    """States of several jobs in one ``sacct`` call ({} when Slurm cannot say); for listings."""
    job_ids = [job_id for job_id in job_ids if _JOB_ID.fullmatch(str(job_id).strip())]  # others: not Slurm's
    if not job_ids or (runner is subprocess.run and not available()):
        return {}
    try:
        output = run_slurm(sacct_states_command(job_ids), runner=runner)
    except ClusterError:
        return {}
    return parse_sacct_states(output)


def job_state(job_id: str, *, source: Literal["sacct", "squeue"] = "sacct", runner: Runner = subprocess.run) -> str:
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
        states = parse_sacct_states(run_slurm(sacct_states_command([job_id]), runner=runner))
        if job_id in states and states[job_id] != "PREEMPTED":
            return states[job_id]
    try:
        lines = run_slurm(["squeue", "-h", "-o", "%T", "-j", job_id], runner=runner).split()
    except SlurmCommandError as exc:
        if exc.kind not in ("unknown-job", "missing") or source == "squeue":
            raise
        lines = []
    if lines:
        return normalise_state(lines[0])
    return states.get(job_id) or next(iter(states.values()), "UNKNOWN")


def wait_until_done(job_id: str, *, poll_s: float = 2.0, timeout_s: float | None = None) -> str:
    """Block until the job reaches a terminal state; return it."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        state = job_state(job_id)
        if is_final(state):
            return state
        if deadline is not None and time.monotonic() > deadline:
            raise ClusterError(f"job {job_id} is still {state} after {timeout_s:.0f} s")
        time.sleep(poll_s)


def processes_may_run(job_id: str, *, runner: Runner = subprocess.run) -> bool:
    """Whether any process of the job may still be alive (``squeue`` says so, or cannot say)."""
    job_id = checked_job_id(job_id)
    try:
        output = run_slurm(["squeue", "-h", "-t", "all", "-o", "%T", "-j", job_id], runner=runner)
    except SlurmCommandError as exc:
        return exc.kind != "unknown-job"  # forgotten by Slurm: long gone
    return any(may_have_processes(line) for line in output.splitlines() if line.strip())


def show_job(job_id: str, *, runner: Runner = subprocess.run, timeout_s: float = COMMAND_TIMEOUT_S) -> dict[str, str]:
    """The job's record from slurmctld (``scontrol show job``); raises SlurmCommandError."""
    return parse_job_record(run_slurm(show_job_command(job_id), timeout_s=timeout_s, runner=runner))


def client_version(*, runner: Runner = subprocess.run) -> tuple[int, int] | None:
    """This machine's Slurm release, (major, minor), from ``scontrol --version``; None when unknown."""
    try:
        return parse_version(run_slurm(["scontrol", "--version"], timeout_s=10.0, runner=runner))
    except ClusterError:
        return None


def kill_wait_s() -> float:
    """Slurm's KillWait (SIGTERM -> SIGKILL when a job ends); the default when unknown."""
    try:
        value = parse_kill_wait_s(run_slurm(["scontrol", "show", "config"]))
    except ClusterError:
        value = None
    return DEFAULT_KILL_WAIT_S if value is None else value


def slurmd_port() -> int:
    """The port every node's slurmd listens on; Slurm's default when unknown."""
    try:
        value = parse_slurmd_port(run_slurm(["scontrol", "show", "config"]))
    except ClusterError:
        value = None
    return DEFAULT_SLURMD_PORT if value is None else value


def max_array_size(*, runner: Runner = subprocess.run) -> int:
    """Slurm's MaxArraySize (an array may have at most this many tasks); 1001, its default, when unknown."""
    if runner is subprocess.run and shutil.which("scontrol") is None:
        return DEFAULT_MAX_ARRAY_SIZE
    try:
        value = parse_max_array_size(run_slurm(["scontrol", "show", "config"], timeout_s=5.0, runner=runner))
    except ClusterError:
        value = None
    return DEFAULT_MAX_ARRAY_SIZE if value is None else value


def partitions(*, runner: Runner = subprocess.run) -> dict[str, dict[str, str]]:
    """Every partition's record, from one ``scontrol show partition``; raises SlurmCommandError."""
    return parse_partitions(run_slurm(["scontrol", "--oneliner", "show", "partition"], timeout_s=10.0, runner=runner))


# ------------------------------------------------------------------ actions


def submit_wrapped(command: list[str], *, runner: Runner = subprocess.run) -> str:
    """Submit an :func:`sbatch_wrap_command`; the new job's id (``--parsable`` prints ``ID[;CLUSTER]``)."""
    return checked_job_id(run_slurm(command, runner=runner).strip().split(";")[0])


def cancel_job(job_id: str) -> None:
    run_slurm(["scancel", checked_job_id(job_id)])


def signal_job(job_id: str, signal_name: str) -> None:
    """Send ``signal_name`` to every task of the job, as Slurm does before the time limit."""
    run_slurm(["scancel", f"--signal={signal_name}", checked_job_id(job_id)])


def release_job(job_id: str, *, sleep: Callable[[float], None] = time.sleep) -> None:
    """Start a requeued job (held until its begin time) now, :data:`RELEASE_AFTER_REQUEUE_S` after the
    caller saw it pending, so after its requeue."""
    sleep(RELEASE_AFTER_REQUEUE_S)
    run_slurm(["scontrol", "update", f"JobId={checked_job_id(job_id)}", "StartTime=now"])


def requeue_job(job_id: str, *, runner: Runner = subprocess.run, timeout_s: float = COMMAND_TIMEOUT_S) -> None:
    run_slurm(requeue_command(job_id), timeout_s=timeout_s, runner=runner)


def exclude_nodes_command(job_id: str, nodes: list[str] | tuple[str, ...]) -> list[str]:
    """``scontrol update`` of a pending job's ``ExcNodeList`` (node names checked: no option, no list trick)."""
    for node in nodes:
        checked_node_name(node)
    return ["scontrol", "update", f"JobId={checked_job_id(job_id)}", f"ExcNodeList={','.join(nodes)}"]


def exclude_nodes(job_id: str, nodes: list[str] | tuple[str, ...], *, runner: Runner = subprocess.run) -> None:
    """Keep ``nodes`` out of a requeued (pending) job's next start; nothing for no nodes."""
    if nodes:
        run_slurm(exclude_nodes_command(job_id, nodes), runner=runner)


def checked_node_name(node: object) -> str:
    """``node`` if it is one Slurm node name (letters, digits, ``-_.``), else a refusal: node names come
    from run files and the user's ledger and end up in ``--exclude`` and ``ExcNodeList``."""
    text = str(node)
    if not _NODE_NAME.fullmatch(text):
        raise SlurmCommandError(
            f"{text[:40]!r} is not a Slurm node name", kind="refused", hint="node names are letters, digits, - _ ."
        )
    return text


def partition_nodes(partition: str | None, *, runner: Runner = subprocess.run) -> list[str]:
    """The nodes of ``partition`` (the default partition for None) that are not down or drained."""
    command = ["sinfo", "-h", "-N", "-o", "%N %T", "--responding"]
    if partition:
        command += ["-p", partition]
    nodes = []
    for line in run_slurm(command, timeout_s=10.0, runner=runner).splitlines():
        parts = line.split()
        if len(parts) == 2 and not parts[1].rstrip("*~#$@%!^-").lower().startswith(("down", "drain", "fail")):
            nodes.append(parts[0])
    return list(dict.fromkeys(nodes))


def disable_requeue(job_id: str, *, runner: Runner = subprocess.run, timeout_s: float = COMMAND_TIMEOUT_S) -> None:
    """Take the job's ``Requeue`` flag away: nothing may requeue it any more, Slurm included.

    Slurm 24.05+ requeues a job that ends while it holds a preemption's flag
    (``GRACE_PREEMPT``), only if the job is requeueable; the flag itself cannot be
    cleared or seen (docs/preemption.md). A job's owner may change it while it runs.
    """
    run_slurm(disable_requeue_command(job_id), timeout_s=timeout_s, runner=runner)
