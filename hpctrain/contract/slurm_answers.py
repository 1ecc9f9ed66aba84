"""What Slurm's commands answer, read: pure parsers, tested on each version's recorded output.

``contract/slurm.py`` (the one client) runs the commands; this reads what
they print -- ``sacct``'s states, ``scontrol``'s job, node, partition and
config records, ``sacctmgr``'s associations, a client's ``--version`` -- and
what ``sbatch``'s refusals mean for the spec. Nothing here runs anything.
``tests/unit/golden/slurm/V/`` holds each version's answers
(``tests/cluster/record-slurm-outputs``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from hpctrain.contract.slurm_states import normalise_state

# What a failed command's message says: the controller did not answer, or the job is not Slurm's.
UNREACHABLE = ("unable to contact slurm controller", "connection refused", "socket timed out", "zero bytes were")
UNKNOWN_JOB = ("invalid job id", "job id not found", "no such job")


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
    for key in ("JobState", "Restarts", "PreemptTime", "Requeue", "ExcNodeList"):
        match = re.search(rf"(?:^|\s){key}=(\S+)", text)
        if match:
            fields[key] = match.group(1)
    return fields


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config`` -> {"KillWait": "30 sec", "PreemptMode": "REQUEUE", ...}. Pure."""
    return dict(re.findall(r"^\s*(\w+)\s*=\s*(.*?)\s*$", text, re.MULTILINE))


def config_number(config: Mapping[str, str], key: str) -> int | None:
    """The whole number a parsed config's ``key`` starts with (``KillWait = 30 sec`` -> 30); None when absent."""
    match = re.match(r"\d+", config.get(key, ""))
    return int(match.group(0)) if match else None


def parse_kill_wait_s(config: str) -> float | None:
    """``KillWait = 30 sec`` from ``scontrol show config``; None when absent."""
    value = config_number(parse_config(config), "KillWait")
    return None if value is None else float(value)


def parse_max_array_size(config: str) -> int | None:
    """``MaxArraySize = 1001`` from ``scontrol show config``; None when absent."""
    return config_number(parse_config(config), "MaxArraySize")


def parse_slurmd_port(config: str) -> int | None:
    """``SlurmdPort = 6818`` from ``scontrol show config``; None when absent."""
    return config_number(parse_config(config), "SlurmdPort")


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


def parse_node_states(output: str) -> dict[str, str]:
    """``sinfo -h -N -n NODES -o "%N %T"`` -> {node: state}; lines that are not two words are skipped."""
    return dict(line.split(None, 1) for line in output.splitlines() if len(line.split()) == 2)


# sinfo %T node states (their base word, flags such as '*' or '~' stripped) that can never run a job until an
# administrator acts: a job requeued onto too few nodes in other states pends forever (Reason=BadConstraints).
# IDLE, MIXED, ALLOCATED, COMPLETING, RESERVED, MAINT, PLANNED and the power-saving states can run one later.
NEVER_RUNS_JOBS = ("down", "drain", "drained", "draining", "fail", "failing", "future", "inval", "unknown")
PARTITION_NODES_FORMAT = "%N|%P|%T|%f|%G|%c|%m"


def node_runs_jobs(state: str) -> bool:
    """Whether a node in this ``sinfo -o %T`` state may run a job (now or once its current jobs end). Pure.

    A trailing ``*`` (the node does not respond) counts as down; sinfo joins several states with ``+``."""
    state = state.strip().lower()
    if not state or state.endswith("*"):
        return False
    return not any(part.rstrip("~#$@%!^-") in NEVER_RUNS_JOBS for part in state.split("+"))


@dataclass(frozen=True)
class NodeNeeds:
    """What one node must offer to hold one node of a job: its features (``--constraint``), GPUs, CPUs and
    memory (0: any). ``jobscript.parameters.node_needs`` makes it from a spec. The one count of "nodes that fit"
    (``hpctrain doctor``'s, a requeue's room, a submit's bad-node ledger trim): counted without it, a node the
    job can never start on would pass for room."""

    features: tuple[str, ...] = ()
    gpus: int = 0  # --gpus-per-node / --gres=gpu:N: the node's GRES gpu count
    cpus: int = 0  # tasks per node x CPUs per task
    mem_mb: float = 0  # --mem

    def admits(self, *, features: set[str] | None, gpus: int | None, cpus: float | None, mem_mb: float | None) -> bool:
        """Whether a node offering these holds one node of the job; None: not known (never held against it)."""
        return (
            (features is None or all(feature in features for feature in self.features))
            and (gpus is None or gpus >= self.gpus)
            and (cpus is None or cpus >= self.cpus)
            and (mem_mb is None or mem_mb >= self.mem_mb)
        )


def gres_gpus(gres: str) -> int | None:
    """A node's GRES (``sinfo -o %G``, ``scontrol show node``'s ``Gres=``) -> its GPUs: ``gpu:v100:4(S:0-1)``
    4, ``gpu:a:2,gpu:b:2`` 4, ``gpu`` 1, ``(null)`` or no gpu 0; None when a gpu entry's count cannot be read
    (then nothing is judged on it). Pure."""
    text = re.sub(r"\([^)]*\)", "", gres.strip())  # socket/index annotations: (S:0-1), (IDX:0,2)
    total = 0
    for item in text.split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu":
            continue
        if len(parts) == 1:
            total += 1
            continue
        count = parts[-1]
        if not count.isdigit():
            if len(parts) == 2:  # gpu:TYPE, one of it
                total += 1
                continue
            return None
        total += int(count)
    return total


def count_field(text: str) -> float | None:
    """A node's CPU or memory count as Slurm prints it (``4``, ``191000``); None for another shape (``4+``)."""
    text = text.strip()
    return float(text) if text.isdigit() else None


def node_fits(needs: NodeNeeds, offered: str | None, gres: str, cpus: str, mem_mb: str) -> bool:
    """Whether a node with these fields holds one node of the job: ``sinfo``'s ``%f``, ``%G``, ``%c``, ``%m``,
    or ``scontrol show node``'s ``AvailableFeatures``, ``Gres``, ``CPUTot``, ``RealMemory`` (``offered`` None:
    features not listed). A field in a shape we do not read counts as fitting: never fewer nodes than before."""
    return needs.admits(
        features=None if offered is None else {word.strip() for word in offered.split(",")},
        gpus=gres_gpus(gres),
        cpus=count_field(cpus),
        mem_mb=count_field(mem_mb),
    )


def parse_partition_nodes(output: str, needs: NodeNeeds = NodeNeeds()) -> dict[str, list[str]]:
    """``sinfo -h -N -o "%N|%P|%T|%f|%G|%c|%m"`` -> {partition: its nodes that may run a job and hold one node
    of the job (``needs``)}; the default partition's trailing ``*`` dropped, lines of another shape skipped. Pure."""
    found: dict[str, list[str]] = {}
    for line in output.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 7 or not parts[0] or not parts[1]:
            continue
        node, partition, state, offered, gres, cpus, mem_mb = parts
        if node_runs_jobs(state) and node_fits(needs, offered, gres, cpus, mem_mb):
            nodes = found.setdefault(partition.rstrip("*"), [])
            if node not in nodes:
                nodes.append(node)
    return found


def plain_features(constraint: str | None) -> tuple[str, ...] | None:
    """The features a ``--constraint`` of plain words joined by ``&`` (or ``,``) requires; None for anything
    else (``|``, counts, brackets, ``!``): then nodes are counted without it. Pure."""
    if not constraint:
        return ()
    words = re.split(r"[&,]", constraint)
    if not all(re.fullmatch(r"[A-Za-z0-9_.:-]+", word) for word in words):
        return None
    return tuple(words)


def parse_job_steps(output: str) -> list[tuple[str, str]]:
    """``squeue -h -s -j JOB -o "%i %j"`` -> [(step id such as ``12.0``, step name)]."""
    steps = []
    for line in output.splitlines():
        step_id, _, name = line.partition(" ")
        if step_id:
            steps.append((step_id, name.strip()))
    return steps


def parse_version(text: str) -> tuple[int, int] | None:
    """``slurm 24.11.5`` (any client's ``--version``; Debian says ``slurm-wlm``) -> (24, 11); None if absent."""
    match = re.search(r"(?:^|\s)(\d{2})\.(\d{2})(?:\.\d+)?", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


# Expedited requeue (``sbatch --requeue=expedite``): Slurm 25.11+, and only where slurm.conf says
# ``SlurmctldParameters=enable_expedited_requeue`` (else slurmctld refuses the job: "not supported").
EXPEDITED_REQUEUE_FROM = (25, 11)
EXPEDITED_REQUEUE_SWITCH = "enable_expedited_requeue"


@dataclass(frozen=True)
class ExpeditedRequeue:
    """Whether this cluster takes ``--requeue=expedite``; ``why``: what says so, for ``doctor`` and errors."""

    available: bool
    why: str


DEFAULT_REQUEUE_HOLD_S = 120  # Slurm's cred_expire default


def requeue_hold_s(config: Mapping[str, str]) -> int:
    """How long Slurm holds a job after a requeue before it may start again (``Reason=BeginTime``): the
    job credential's lifetime, ``cred_expire`` in ``AuthInfo`` (or a ``CredExpire`` line), 120 s unless
    set. A job submitted with ``--requeue=expedite`` is not held. Pure."""
    match = re.search(r"cred_expire=(\d+)", config.get("AuthInfo", ""))
    if match:
        return int(match.group(1))
    value = config_number(config, "CredExpire")
    return DEFAULT_REQUEUE_HOLD_S if value is None else value


def expedited_requeue_support(config: Mapping[str, str]) -> ExpeditedRequeue:
    """From a parsed ``scontrol show config``: Slurm's version and ``SlurmctldParameters``. Pure.

    slurmctld looks for the switch as a substring of ``SlurmctldParameters`` (``job_mgr.c``,
    ``_expedited_requeue_enabled``); so does this."""
    version = parse_version(config.get("SLURM_VERSION", ""))
    if version is None:
        return ExpeditedRequeue(False, "Slurm did not say its version (scontrol show config: SLURM_VERSION)")
    shown = f"{version[0]}.{version[1]:02d}"
    if version < EXPEDITED_REQUEUE_FROM:
        return ExpeditedRequeue(False, f"Slurm {shown} has none (it came with 25.11)")
    if EXPEDITED_REQUEUE_SWITCH not in config.get("SlurmctldParameters", ""):
        return ExpeditedRequeue(
            False, f"Slurm {shown}, but slurm.conf lacks SlurmctldParameters={EXPEDITED_REQUEUE_SWITCH}"
        )
    return ExpeditedRequeue(True, f"Slurm {shown} with SlurmctldParameters={EXPEDITED_REQUEUE_SWITCH}")


def parse_partitions(output: str) -> dict[str, dict[str, str]]:
    """``scontrol -o show partition`` -> {name: {"MaxTime": ..., "Default": ..., "State": ...}}."""
    partitions = {}
    for line in output.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "PartitionName" in fields:
            partitions[fields["PartitionName"]] = fields
    return partitions


@dataclass(frozen=True)
class StartAnswer:
    """What ``sbatch --test-only`` says of a job it did not queue: when the scheduler would start it, where."""

    start: datetime  # naive: slurmctld's local time, as Slurm prints it
    processors: int
    nodes: str
    partition: str


# 26.05 prints a stray word after the time ("to start at 2026-11-29T00:57:09 a using 1 processors"): allowed.
_TEST_ONLY = re.compile(
    r"Job \d+ to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?: \S+)? using (\d+) processors on nodes (\S+) "
    r"in partition (\S+)"
)


def parse_test_only(text: str) -> StartAnswer | None:
    """``sbatch: Job 3 to start at 2026-11-29T00:20:00 using 2 processors on nodes n1 in partition debug``
    (sbatch prints it on stderr) -> :class:`StartAnswer`; None when the text says no such thing. Pure."""
    match = _TEST_ONLY.search(text)
    if match is None:
        return None
    try:
        start = datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    return StartAnswer(start, int(match.group(2)), match.group(3), match.group(4))


@dataclass(frozen=True)
class JobTimes:
    """What ``squeue -o %T|%S|%e|%l|%L|%M`` says of one job: its state, (expected) start and end, its time
    limit, the time it has left and has used (seconds; None where Slurm prints none)."""

    state: str
    start: datetime | None  # a pending job: Slurm's expected start, when the scheduler has one
    end: datetime | None
    time_limit_s: int | None
    time_left_s: int | None
    time_used_s: int | None


JOB_TIMES_FORMAT = "%T|%S|%e|%l|%L|%M"


def parse_job_times(text: str) -> JobTimes | None:
    """``RUNNING|2026-11-29T00:13:16|2026-11-29T00:23:16|10:00|9:57|0:03`` -> :class:`JobTimes`; None for
    anything else. Pure."""
    fields = text.strip().splitlines()[0].split("|") if text.strip() else []
    if len(fields) != 6:
        return None
    state, start, end, limit, left, used = fields
    return JobTimes(
        normalise_state(state),
        _when(start),
        _when(end),
        slurm_duration_s(limit),
        slurm_duration_s(left),
        slurm_duration_s(used),
    )


def slurm_duration_s(text: str) -> int | None:
    """Slurm's printed duration (``9:57``, ``1:02:03``, ``2-01:02:03``) in seconds; None for ``UNLIMITED``,
    ``INVALID``, ``N/A`` or anything else. Pure."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d\d)", text.strip())
    if match is None:
        return None
    days, hours, minutes, seconds = (int(group) if group else 0 for group in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def _when(text: str) -> datetime | None:
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S")
    except ValueError:  # N/A, Unknown, None
        return None


# sbatch's refusals ("sbatch: error: Batch job submission failed: ...") -> what to change.
SBATCH_FAILURES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (
        UNREACHABLE,
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
