"""``hpctrain doctor``: will this cluster run this job? Every check, with its fix. Torch-free.

Checks fall in three groups, each a pure function over what Slurm or the
file system answered (:class:`ClusterView` asks, once per question):

* Slurm itself: client commands and their version, the controller, accounting;
* the spec against the cluster: its partition (up, MaxTime), nodes with the
  GPUs, CPUs and memory it asks for, account/QOS associations, what
  preemption does to it (requeue or cancel, the grace time to save), whether
  ``signals.signal_delay_s`` leaves time for a checkpoint;
* paths: ``output_dir``, ``data.root`` and the Python environment exist, have
  the permissions the job needs and sit on a file system compute nodes share;
  ``data.root`` looks like an ImageFolder (a sample, never a full scan).

``--probe`` (``hpctrain/diagnose/probe.py``) runs a short job on the spec's
partition that reports what a compute node really sees, including how many
files per second ``data.root`` serves it; :func:`check_file_rate` weighs that
against the images/s the job will ask for. For a local cluster the job runs
here, so the same measurement runs here.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

from hpctrain.contract.slurm import Slurm
from hpctrain.diagnose import filesystems
from hpctrain.diagnose.data_bench import gpu_type, spec_demand
from hpctrain.diagnose.filesystems import FileRate
from hpctrain.diagnose.findings import Finding, Level
from hpctrain.diagnose.preflight import check_data_root, check_partition
from hpctrain.errors import ClusterError
from hpctrain.jobspec.lead_time import STOP_OVERHEAD_S, estimated_save_s, lead_time_warning
from hpctrain.jobspec.load import LoadedJob

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp"})
SAMPLE_CLASSES = 5
SAMPLE_FILES = 20
FAR_BELOW = 4  # the tree serves under a quarter of what the job asks: its GPUs would mostly wait
SLOW_STAGE_MIN = 10.0  # data.stage: node spending longer than this opening files deserves a pack


Check = Finding  # doctor's name for a finding (every check yields some)


# ------------------------------------------------------------------ what Slurm says


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


# ------------------------------------------------------------------ Slurm checks (pure over the view)


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


def _gpus_of(gres: str) -> int:
    """GPUs in a node's ``Gres=gpu:v100:4(S:0-1),gpu:a100:2`` field."""
    total = 0
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] == "gpu" and parts[-1].isdigit():
            total += int(parts[-1])
    return total


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
    gpus, cpus = res.gpus_per_node or 0, job.spec.tasks_per_node * (res.cpus_per_task or 1)
    mem_mb = res.mem_gb * 1024 if res.mem_gb else 0

    def fits(node: dict[str, str]) -> bool:
        return (
            _gpus_of(node.get("Gres", "")) >= gpus
            and int(node.get("CPUTot", "0") or 0) >= cpus
            and float(node.get("RealMemory", "0") or 0) >= mem_mb
        )

    fitting = [n for n in members if fits(n)]
    most_gpus = max(_gpus_of(n.get("Gres", "")) for n in members)
    most_cpus = max(int(n.get("CPUTot", "0") or 0) for n in members)
    if len(fitting) >= res.nodes:
        return [
            Finding("ok", "resources", f"{len(fitting)} of {len(members)} nodes in {partition} fit one node's share")
        ]
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
    if job.spec.entrypoint is None and grace < needed:
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


# ------------------------------------------------------------------ paths


def check_paths(job: LoadedJob, *, slurm_backend: bool, mounts_text: str | None = None) -> list[Finding]:
    spec = job.spec
    checks = [check_output_dir(spec.output_dir, slurm_backend, mounts_text)]
    checks.append(_sharing_check("python", sys.prefix, slurm_backend, mounts_text, "the job's Python environment"))
    data_findings = [f for trial in job.trials for f in check_data_root(trial)]
    if spec.entrypoint is None and spec.data.root is not None:
        is_image = Path(spec.data.root).is_file()
        if data_findings:
            checks += [Finding(f.level, f.key, f.message, "make the dataset, or fix data.root") for f in data_findings]
        if is_image and not any(f.level == "error" for f in data_findings):
            checks.append(_sharing_check("data.root", spec.data.root, slurm_backend, mounts_text, "the dataset"))
            where = f"{spec.data.train_dir}/ and {spec.data.val_dir}/"
            checks.append(Finding("ok", "dataset", f"a SquashFS image holding {where} (each node mounts it)"))
        elif not data_findings:
            checks.append(_sharing_check("data.root", spec.data.root, slurm_backend, mounts_text, "the dataset"))
            checks.append(check_image_folder(Path(spec.data.root), spec.data.train_dir, spec.data.val_dir))
    return checks


def check_output_dir(output_dir: str, slurm_backend: bool, mounts_text: str | None = None) -> Finding:
    existing = filesystems.existing_ancestor(output_dir)
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return Finding(
            "error", "output_dir", f"{existing} is not a writable folder", "set output_dir to a folder of yours"
        )
    return _sharing_check("output_dir", output_dir, slurm_backend, mounts_text, "run directories")


def _sharing_check(name: str, path: str, slurm_backend: bool, mounts_text: str | None, what: str) -> Finding:
    mount = filesystems.mount_of(path, mounts_text)
    if mount is None or not slurm_backend:
        return Finding("ok", name, f"{path}" + (f" ({mount.fstype})" if mount else ""))
    where = f"{path} is on {mount.fstype} ({mount.point})"
    if mount.sharing == "memory":
        return Finding(
            "error",
            name,
            f"{where}: memory of this machine only; compute nodes never see {what} there",
            f"put {name} on the cluster's shared file system (home, project or scratch)",
        )
    if mount.sharing == "local":
        return Finding(
            "warning",
            name,
            f"{where}, a local file system; compute nodes see it only if they share this disk",
            "'hpctrain doctor SPEC --probe' checks from a compute node",
        )
    return Finding("ok", name, f"{where}, shared")


def check_image_folder(root: Path, train_dir: str, val_dir: str) -> Finding:
    """A sample of ``root``: class folders in both splits, and image files in a few of them."""
    counts, problems = {}, []
    for split in (train_dir, val_dir):
        try:
            classes = sorted(e.name for e in os.scandir(root / split) if filesystems.entry_kind(e) == "dir")
        except OSError as exc:
            return Finding("error", "dataset", f"cannot list {root / split}: {exc.strerror}", "fix its permissions")
        counts[split] = len(classes)
        if not classes:
            problems.append(f"{split}/ has no class folders")
        for name in classes[:SAMPLE_CLASSES]:
            if not _has_image(root / split / name):
                problems.append(f"{split}/{name}/ has no image file among its first {SAMPLE_FILES} entries")
    if counts.get(train_dir) and counts.get(val_dir) and counts[train_dir] != counts[val_dir]:
        problems.append(f"{train_dir}/ has {counts[train_dir]} classes but {val_dir}/ has {counts[val_dir]}")
    if problems:
        return Finding("error", "dataset", "; ".join(problems), "an ImageFolder is SPLIT/CLASS/IMAGE.jpg")
    sampled = min(SAMPLE_CLASSES, counts[train_dir])
    return Finding("ok", "dataset", f"an ImageFolder: {counts[train_dir]} classes; {sampled} sampled hold images")


def _has_image(folder: Path) -> bool:
    try:
        with os.scandir(folder) as entries:
            for index, entry in enumerate(entries):
                if index >= SAMPLE_FILES:
                    return False
                if filesystems.entry_kind(entry) == "file" and Path(entry.name).suffix.lower() in IMAGE_SUFFIXES:
                    return True
    except OSError:
        return False
    return False


# ------------------------------------------------------------------ how fast data.root serves files


@dataclass(frozen=True)
class MeasureBounds:
    """Bounds of one file-rate measurement (``doctor --measure-files/--measure-seconds``)."""

    max_files: int = 2000
    max_s: float = 10.0


def measure_threads(job: LoadedJob) -> int:
    """Threads standing in for one node's loader workers (tasks x data.workers, 1 to 32)."""
    return max(1, min(32, job.spec.data.workers * job.spec.tasks_per_node))


def measured_split(job: LoadedJob) -> Path | None:
    """The training split a measurement reads, when the job reads an ImageFolder folder at all.

    None for a packed image (a file): each node reads that one file, not the tree's files.
    """
    data = job.spec.data
    if job.spec.entrypoint is not None or data.root is None or Path(os.path.expanduser(data.root)).is_file():
        return None
    return Path(os.path.expanduser(data.root)) / data.train_dir


def file_rate_level(served_per_node: float, asked_per_node: float | None) -> Level:
    """ok when one node's measured samples/s covers one node's demand; error when far below. Pure."""
    if asked_per_node is None or served_per_node >= asked_per_node:
        return "ok"
    return "warning" if served_per_node * FAR_BELOW >= asked_per_node else "error"


def node_demand(job: LoadedJob) -> tuple[float | None, str]:
    """Images/s one node of the job asks for (each one stat and one open per epoch), and where it comes from."""
    spec = job.spec
    gpus = spec.resources.gpus_per_node or 0
    if not gpus:
        return None, "a CPU job: no GPU rate to compare with"
    gpu = gpu_type(spec, job.profile)
    if gpu is None:
        return None, "GPU model unknown: name it in the profile's gpu_gres (gpu:v100:{gpus}) or resources.constraint"
    demand = spec_demand(spec, gpu)
    if demand.img_s_per_gpu is None:
        return None, f"no table rate for {spec.trainer.arch} on {gpu} ('hpctrain bench-data SPEC --measure-gpu')"
    return demand.img_s_per_gpu * gpus, f"{demand.img_s_per_gpu:,.0f} img/s per GPU x {gpus} GPUs ({demand.source})"


def check_file_rate(job: LoadedJob, rate: FileRate, where: str) -> Finding:
    """The measured rate against the job's demand (or, with data.stage: node, against staging's file count)."""
    spec, nodes = job.spec, job.spec.resources.nodes
    served = rate.samples_per_s
    asked, how = node_demand(job)
    numbers = {"measured": where, **rate.as_json(), "node_demand_img_s": asked, "nodes": nodes, "demand": how}
    numbers["job_demand_img_s"] = None if asked is None else round(asked * nodes, 1)

    def row(level: Level, detail: str, fix: str = "") -> Finding:
        return Finding(level, "data.root rate", detail, fix, numbers)

    measured = f"{where}: {rate.describe()}"
    if rate.stats + rate.opens < 50:
        measured += f" (only {rate.stats + rate.opens} files: rough)"
    if served <= 0:
        return row("warning", f"{measured}: no file could be read", "check data.root's permissions")
    pack = f"pack it: 'hpctrain pack {spec.data.root} IMAGE.sqsh', then set data.root to IMAGE.sqsh (docs/data.md)"
    if spec.data.stage == "node":
        minutes = rate.files_estimate / served / 60
        numbers["stage_minutes"] = round(minutes, 1)
        detail = (
            f"{measured}; data.stage: node opens its ~{rate.files_estimate:,} training files once per node: "
            f"~{minutes:,.1f} min at this rate, longer while {nodes} node(s) share the metadata server"
        )
        return row("warning" if minutes > SLOW_STAGE_MIN else "ok", detail, pack)
    if asked is None:
        return row("ok", f"{measured}; one node fetches ~{served:,.0f} samples/s; demand unknown: {how}")
    detail = (
        f"{measured}; the job asks ~{asked * nodes:,.0f} opens/s and as many stats/s ({how}, x {nodes} node(s)); "
        f"one node gets ~{served:,.0f} samples/s, {nodes} node(s) ~{served * nodes:,.0f} only if the metadata "
        "server scales (an estimate: it is shared); random files, yet caches may flatter a repeated run"
    )
    level = file_rate_level(served, asked)
    return row(level, detail, f"the tree serves ~{served:,.0f} samples/s per node, the job asks ~{asked:,.0f}; {pack}")


def file_rate_checks(job: LoadedJob, reported: Any, where: str) -> list[Finding]:
    """The row for a probe's ``file_rate`` report (a dict, an error text, or nothing)."""
    if reported is None:
        return []
    rate = FileRate.from_json(reported)
    if rate is None:
        said = reported.get("error") if isinstance(reported, dict) else None
        shown = str(said)[:300] if said else "an unreadable report"
        return [
            Finding("warning", "data.root rate", f"{where}: not measured: {shown}", "check data.root's permissions")
        ]
    return [check_file_rate(job, rate, where)]


def measure_here(job: LoadedJob, bounds: MeasureBounds) -> list[Finding]:
    """For a local cluster: the job runs on this machine, so measure data.root here."""
    split = measured_split(job)
    if split is None or not split.is_dir():
        return []
    try:
        rate = filesystems.measure_file_rate(
            split, max_files=bounds.max_files, max_s=bounds.max_s, threads=measure_threads(job)
        )
    except OSError as exc:
        return file_rate_checks(job, {"error": exc.strerror or str(exc)}, "on this machine")
    return [check_file_rate(job, rate, "on this machine")]


# ------------------------------------------------------------------ all together


def run_checks(
    job: LoadedJob | None,
    *,
    slurm_backend: bool,
    view: ClusterView | None = None,
    bounds: MeasureBounds | None = None,
) -> list[Finding]:
    """Every check; for a local cluster also the file rate of data.root (the job will run here)."""
    view = view or ClusterView()
    checks: list[Finding] = []
    if slurm_backend:
        checks += check_slurm(view)
        reachable = not any(c.level == "error" for c in checks)
        if job is not None and reachable:
            checks += check_spec_on_cluster(job, view)
    if job is not None:
        if job.spec.entrypoint is None:
            checks += check_lead_time(job)
        checks += check_paths(job, slurm_backend=slurm_backend)
        if not slurm_backend:
            checks += measure_here(job, bounds or MeasureBounds())
    else:
        checks.append(_sharing_check("python", sys.prefix, slurm_backend, None, "the job's Python environment"))
    return checks


def summary(checks: list[Finding]) -> dict[str, Any]:
    return {
        "ok": not any(c.level == "error" for c in checks),
        "errors": sum(c.level == "error" for c in checks),
        "warnings": sum(c.level == "warning" for c in checks),
        "checks": [c.as_json() for c in checks],
    }


@dataclass(frozen=True)
class DoctorReport:
    """Every check, each ok / warning / error with its fix; ``probe``: what the probe job reported
    (``--probe``), else None. ``ok``: no check is an error."""

    checks: tuple[Finding, ...]
    probe: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not any(check.level == "error" for check in self.checks)

    def as_json(self) -> dict[str, Any]:
        """What ``hpctrain doctor --json`` prints."""
        document = summary(list(self.checks))
        return {**document, "probe": self.probe} if self.probe is not None else document


def doctor(
    job: LoadedJob | None,
    *,
    probe: bool = False,
    probe_timeout_s: float = 300.0,
    bounds: MeasureBounds | None = None,
    slurm: Slurm | None = None,
) -> DoctorReport:
    """The doctor verb's one sequence (``hpctrain doctor``): every check for ``job`` (or for the cluster
    alone), then, with ``probe``, a short job that reports what a compute node sees."""
    bounds = bounds or MeasureBounds()
    slurm_backend = job is None or job.profile.scheduler == "slurm"
    checks = run_checks(job, slurm_backend=slurm_backend, view=ClusterView(slurm), bounds=bounds)
    found = None
    if probe:
        checks, found = with_probe(job, checks, timeout_s=probe_timeout_s, bounds=bounds, slurm=slurm)
    return DoctorReport(tuple(checks), found)


def with_probe(
    job: LoadedJob | None,
    checks: list[Finding],
    *,
    timeout_s: float,
    bounds: MeasureBounds,
    slurm: Slurm | None = None,
) -> tuple[list[Finding], dict | None]:
    """Run the probe job where the checks so far allow it; add what it found."""
    from hpctrain.diagnose.probe import Measure, probe_findings, run_probe

    if any(c.level == "error" and c.key in ("slurm clients", "controller") for c in checks):
        return [*checks, Finding("error", "probe", "not run: Slurm does not answer")], None
    if job is None or job.profile.scheduler != "slurm":
        return [*checks, Finding("warning", "probe", "not run: give a spec for a Slurm cluster")], None
    spec = job.spec
    gpus = spec.resources.gpus_per_node or 0
    gres = (
        job.profile.gpu_gres.format(gpus=gpus) if gpus and job.profile.gpu_gres else (f"gpu:{gpus}" if gpus else None)
    )
    split = measured_split(job)
    measure = None if split is None else Measure(str(split), bounds.max_files, bounds.max_s, measure_threads(job))
    try:
        found = run_probe(
            output_dir=spec.output_dir,
            data_root=spec.data.root if spec.entrypoint is None else None,
            partition=spec.resources.partition,
            gres=gres,
            account=spec.resources.account,
            qos=spec.resources.qos,
            timeout_s=timeout_s,
            measure=measure,
            slurm=slurm,
        )
    except ClusterError as exc:
        return [*checks, Finding("error", "probe", f"the probe job was refused: {exc.message}", exc.hint or "")], None
    added = probe_findings(found, wants_gpus=gpus)
    if not added:
        gpus_seen = ", ".join(found.get("gpus", [])) or "no GPUs"
        added.append(
            Finding(
                "ok",
                "probe",
                f"{found['hostname']}: Python {found['python_version']}, torch {found.get('torch')}, "
                f"CUDA {found.get('cuda')}, NCCL {found.get('nccl', '-')}, {gpus_seen}",
            )
        )
    added += file_rate_checks(job, found.get("file_rate"), f"from {found.get('hostname', 'the node')}")
    return [*checks, *added], found
