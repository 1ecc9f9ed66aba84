"""``hpctrain doctor``'s questions to Slurm: will this cluster take this job? Torch-free.

:class:`ClusterView` asks the one Slurm client (``contract/slurm.py``) once
per question and remembers a failed question as its error; each check is a
pure function over what it answered:

* Slurm itself: client commands and their version, the controller, accounting;
* the spec against the cluster: its partition (up, MaxTime), nodes with the
  GPUs, CPUs and memory it asks for, account/QOS associations, what
  preemption does to it (requeue or cancel, the grace time to save), whether
  ``signals.signal_delay_s`` leaves time for a checkpoint;
* expedited requeue (Slurm 25.11+): whether the cluster has it, and whether the
  job uses it (``resources.expedited_requeue``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import TypeVar

from hpctrain.contract.slurm import Slurm
from hpctrain.contract.slurm_answers import (
    NodeNeeds,
    count_field,
    expedited_requeue_support,
    gres_gpus,
    node_fits,
    node_runs_jobs,
)
from hpctrain.diagnose.findings import Finding
from hpctrain.diagnose.preflight import check_partition
from hpctrain.errors import ClusterError
from hpctrain.jobscript.parameters import node_needs
from hpctrain.jobspec.lead_time import STOP_OVERHEAD_S, estimated_save_s, lead_time_warning
from hpctrain.jobspec.load import LoadedJob

T = TypeVar("T")
DOCTOR_TIMEOUT_S = 15.0


class ClusterView:
    """Slurm's answers (through the one client), asked once each; a failed question is remembered as its error."""

    def __init__(self, slurm: Slurm | None = None) -> None:
        self.slurm = slurm or Slurm()

    def missing_clients(self) -> list[str]:
        return self.slurm.missing_clients()

    @staticmethod
    def ask(question: Callable[[], T]) -> T | ClusterError:
        try:
            return question()
        except ClusterError as exc:
            return exc

    @cached_property
    def version(self) -> str | ClusterError:
        return self.ask(lambda: self.slurm.version_text(timeout_s=DOCTOR_TIMEOUT_S))

    @cached_property
    def ping(self) -> str | ClusterError:
        return self.ask(lambda: self.slurm.ping(timeout_s=DOCTOR_TIMEOUT_S))

    @cached_property
    def accounting(self) -> str | ClusterError:
        return self.ask(lambda: self.slurm.accounting(timeout_s=DOCTOR_TIMEOUT_S))

    @cached_property
    def config(self) -> dict[str, str]:
        answer = self.ask(lambda: self.slurm.config(timeout_s=DOCTOR_TIMEOUT_S))
        return {} if isinstance(answer, ClusterError) else answer

    @cached_property
    def partitions(self) -> dict[str, dict[str, str]] | ClusterError:
        return self.ask(lambda: self.slurm.partitions(timeout_s=DOCTOR_TIMEOUT_S))

    @cached_property
    def nodes(self) -> list[dict[str, str]]:
        answer = self.ask(lambda: self.slurm.nodes(timeout_s=DOCTOR_TIMEOUT_S))
        return [] if isinstance(answer, ClusterError) else answer

    @cached_property
    def associations(self) -> list[dict[str, str]] | None:
        return self.slurm.associations(timeout_s=DOCTOR_TIMEOUT_S)


def check_slurm(view: ClusterView) -> list[Finding]:
    missing = view.missing_clients()
    if "sbatch" in missing:
        return [
            Finding(
                "error",
                "slurm clients",
                f"{', '.join(missing)} not found on PATH",
                "run hpctrain on the cluster's login node (or 'module load slurm'); "
                "'hpctrain submit SPEC --local' runs a job on this machine",
            )
        ]
    version = view.version
    shown = version.strip() if isinstance(version, str) else "version unknown"
    checks = [
        Finding(
            "warning" if missing else "ok",
            "slurm clients",
            shown + (f"; missing: {', '.join(missing)}" * bool(missing)),
        )
    ]
    ping = view.ping
    if isinstance(ping, ClusterError) or " is UP" not in ping:
        said = ping.message if isinstance(ping, ClusterError) else ping.strip()
        checks.append(
            Finding(
                "error",
                "controller",
                f"slurmctld does not answer: {said.strip().splitlines()[0] if said.strip() else 'no reply'}",
                "nothing can be queued until it is back: try again in a minute, or ask the admins",
            )
        )
        return checks
    checks.append(Finding("ok", "controller", ping.strip().splitlines()[0]))
    accounting = view.accounting
    if isinstance(accounting, ClusterError):
        checks.append(
            Finding(
                "warning",
                "accounting",
                f"sacct does not answer: {accounting.message}",
                "status and requeue detection fall back to squeue, which forgets ended jobs within minutes; "
                "ask the admins to enable slurmdbd accounting",
            )
        )
    else:
        checks.append(Finding("ok", "accounting", "sacct answers"))
    return checks


def _gpus_of(node: dict[str, str]) -> int | None:
    """GPUs in a node's ``Gres=gpu:v100:4(S:0-1),gpu:a100:2`` field (None: a count it cannot read)."""
    return gres_gpus(node.get("Gres", ""))


def _node_fits(needs: NodeNeeds, node: dict[str, str]) -> bool:
    """``scontrol show node``'s record judged as sinfo's answers are (``slurm_answers.node_fits``: one count)."""
    features = node.get("AvailableFeatures") or node.get("Features")
    return node_fits(needs, features, node.get("Gres", ""), node.get("CPUTot", ""), node.get("RealMemory", ""))


def _partition_name(job: LoadedJob, partitions: dict[str, dict[str, str]]) -> str | None:
    name = job.spec.resources.partition
    if name is None:
        name = next((p for p, fields in partitions.items() if fields.get("Default") == "YES"), None)
    return name if name in partitions else None


def check_spec_on_cluster(job: LoadedJob, view: ClusterView) -> list[Finding]:
    """Partition, nodes, associations and preemption for the spec."""
    partitions = view.partitions
    if isinstance(partitions, ClusterError):
        return [Finding("warning", "partition", f"could not list partitions: {partitions.message}")]
    checks = [Finding(f.level, f.key, f.message, "fix the spec") for f in check_partition(job.spec, partitions)]
    name = _partition_name(job, partitions)
    if name is None:
        return checks or [Finding("error", "resources.partition", "no partition given and the cluster has no default")]
    if not checks:
        fields = partitions[name]
        checks.append(
            Finding("ok", "resources.partition", f"{name}: {fields.get('State')}, MaxTime {fields.get('MaxTime')}")
        )
    checks += check_nodes(job, name, view.nodes)
    checks += check_associations(job, name, view.associations)
    checks += check_preemption(job, view.config, partitions[name])
    return checks


def check_nodes(job: LoadedJob, partition: str, nodes: list[dict[str, str]]) -> list[Finding]:
    res = job.spec.resources
    members = [n for n in nodes if partition in n.get("Partitions", "").split(",")]
    if not members:
        return []  # scontrol show node did not answer: sbatch decides
    needs = node_needs(job.spec)
    gpus, cpus = needs.gpus, needs.cpus
    fitting = [n for n in members if _node_fits(needs, n)]
    most_gpus = max(_gpus_of(n) or 0 for n in members)
    most_cpus = max(int(count_field(n.get("CPUTot", "")) or 0) for n in members)
    if len(fitting) >= res.nodes:
        found = [
            Finding("ok", "resources", f"{len(fitting)} of {len(members)} nodes in {partition} fit one node's share")
        ]
        usable = [n for n in fitting if node_runs_jobs(n.get("State", ""))]  # a down node gives no room
        return found + check_room_to_leave_out(job, partition, len(usable))
    what = []
    if gpus > most_gpus:
        what.append(f"{gpus} GPUs per node (its nodes have at most {most_gpus})")
    if cpus > most_cpus:
        what.append(f"{cpus} CPUs per node (tasks_per_node x cpus_per_task; at most {most_cpus})")
    if not what:
        what.append(f"{res.nodes} nodes that fit (only {len(fitting)} of its {len(members)} do)")
    return [
        Finding(
            "error",
            "resources",
            f"partition {partition} can never give {', '.join(what)}",
            "lower resources.nodes / gpus_per_node / cpus_per_task / mem_gb, or pick another partition ('sinfo -N -l')",
        )
    ]


def check_room_to_leave_out(job: LoadedJob, partition: str, fitting: int) -> list[Finding]:
    """Whether a requeue could leave a sick node out: a job that needs every fitting node of its partition
    keeps a node its burn-in flags, and fails on losing one it cannot replace (healing/decide.py's Room)."""
    res, needs = job.spec.resources, job.spec.resources.allocated_nodes
    if needs < 2 or not (job.spec.health.burn_in.enabled or res.heals):
        return []
    room = fitting - needs
    if room > 0:
        detail = f"a requeue can leave up to {room} sick or lost node{'s' * (room != 1)} of {partition} out"
        return [Finding("ok", "node health", detail)]
    return [
        Finding(
            "warning",
            "node health",
            f"the job needs all {fitting} usable nodes of {partition} that fit it: a node its burn-in flags is kept "
            "(training starts on it), and a lost node that stays down fails the run rather than leave the job "
            "pending forever",
            "ask for fewer nodes (or spare_nodes) than the partition has, or pick a larger partition "
            "(docs/node-health.md)",
        )
    ]


def check_associations(job: LoadedJob, partition: str, rows: list[dict[str, str]] | None) -> list[Finding]:
    res = job.spec.resources
    if rows is None:
        return [Finding("ok", "account/qos", "not checked: sacctmgr does not answer here")]
    usable = [r for r in rows if r["partition"] in ("", partition)]
    problems = []
    if res.account and res.account not in {r["account"] for r in usable}:
        problems.append(f"account {res.account!r} is not yours on {partition}")
    if res.qos and not any(
        res.qos in r["qos"].split(",") for r in usable if not res.account or r["account"] == res.account
    ):
        problems.append(f"QOS {res.qos!r} is not allowed for you on {partition}")
    if problems:
        accounts = ", ".join(sorted({r["account"] for r in usable})) or "none"
        return [
            Finding(
                "error",
                "account/qos",
                "; ".join(problems),
                f"set resources.account / resources.qos to one of yours (accounts: {accounts}; "
                "'sacctmgr show assoc user=$USER')",
            )
        ]
    return [Finding("ok", "account/qos", f"{len(usable)} association(s) usable on {partition}")]


def check_preemption(job: LoadedJob, config: dict[str, str], partition: dict[str, str]) -> list[Finding]:
    """What preemption does to this job, and whether it can save before it is killed."""
    preempt_type = config.get("PreemptType", "preempt/none")
    mode = partition.get("PreemptMode", config.get("PreemptMode", "OFF")).upper()
    if preempt_type == "preempt/none" or mode.startswith("OFF"):
        return [Finding("ok", "preemption", f"jobs in {partition.get('PartitionName')} are not preempted")]
    grace = _grace_s(partition.get("GraceTime", "0"))
    save_s, how = estimated_save_s(job.spec)
    needed = save_s + STOP_OVERHEAD_S
    signals = job.spec.signals
    if "REQUEUE" in mode:
        meaning = "preempted jobs are requeued by Slurm"
    elif "CANCEL" in mode:
        meaning = "preempted jobs are cancelled; hpctrain requeues itself on SIGTERM" + (
            "" if signals.requeue_on_preemption else ", but signals.requeue_on_preemption is false"
        )
    elif "SUSPEND" in mode:
        return [
            Finding(
                "warning",
                "preemption",
                f"PreemptMode={mode}: a suspended job keeps its GPU memory and its peers time out in collectives",
                "raise distributed.timeout_s, or ask for a partition that requeues",
            )
        ]
    else:
        meaning = f"PreemptMode={mode}"
    detail = f"{meaning}; GraceTime {grace:.0f} s between SIGTERM and SIGKILL"
    if job.spec.runs_trainer and grace < needed:
        return [
            Finding(
                "warning",
                "preemption",
                f"{detail}, but a stop checkpoint needs ~{needed:.0f} s ({how}, plus stopping)",
                "a preempted attempt resumes from its last periodic checkpoint: set checkpoint.every_steps "
                "so little is lost",
            )
        ]
    if "CANCEL" in mode and not signals.requeue_on_preemption:
        return [Finding("warning", "preemption", detail, "set signals.requeue_on_preemption: true to come back")]
    return [Finding("ok", "preemption", detail)]


def check_expedited_requeue(job: LoadedJob | None, config: dict[str, str]) -> list[Finding]:
    """Whether the cluster has expedited requeue (``launch/expedite.py``), and whether this job uses it."""
    name = "expedited requeue"
    if not config:
        return [Finding("warning", name, "unknown: scontrol show config did not answer")]
    support = expedited_requeue_support(config)
    setting = job.spec.resources.expedited_requeue if job is not None else None
    said = f"{'available' if support.available else 'not available'} ({support.why})"
    if job is None:
        used = "; a spec uses it with resources.expedited_requeue: auto or true" if support.available else ""
        return [Finding("ok", name, said + used)]
    if not job.spec.requeues:
        return [Finding("ok", name, f"{said}; not used: this job is never requeued")]
    if setting is True and not support.available:
        return [
            Finding(
                "error",
                "resources.expedited_requeue",
                f"true, but this cluster has no expedited requeue: {support.why}",
                "set resources.expedited_requeue: auto (use it where the cluster has it) or false",
            )
        ]
    if not support.available:
        return [Finding("ok", name, f"{said}; this job is submitted with plain --requeue")]
    if setting is False:
        fix = "set resources.expedited_requeue: auto: after a node failure the job starts again at once, first in line"
        return [Finding("ok", name, f"{said}; not used: resources.expedited_requeue is false", fix)]
    return [Finding("ok", name, f"{said}; this job is submitted with --requeue=expedite")]


def _grace_s(value: str) -> float:
    from hpctrain.jobspec.slurm_time import parse_time_limit

    if value.isdigit():
        return float(value)  # scontrol prints GraceTime in seconds
    try:
        return float(parse_time_limit(value))
    except ValueError:
        return 0.0


def check_lead_time(job: LoadedJob) -> list[Finding]:
    warning = lead_time_warning(job.spec)
    if warning:
        return [Finding("warning", "signals.signal_delay_s", warning, "raise signals.signal_delay_s")]
    return [Finding("ok", "signals.signal_delay_s", f"{job.spec.signals.signal_delay_s} s before the limit is enough")]
