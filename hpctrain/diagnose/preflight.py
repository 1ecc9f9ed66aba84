"""Cheap checks before ``hpctrain submit`` queues anything: problems that would
certainly kill the job after its queue wait, caught on the login node.

What the login node sees decides how sure a finding is. A ``data.root`` that is
missing while its parent folder exists is certain (the same file system, seen
from here); one whose parent is missing too may be mounted only on compute
nodes, so it is a warning. Partitions come from one ``scontrol show
partition`` (``hpctrain.contract.slurm``); when that does not answer, the partition
checks are skipped with a warning and sbatch has the last word.

Pure over its inputs except :func:`run_preflight`, which asks Slurm once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.dataset import squashfs
from hpctrain.diagnose import filesystems
from hpctrain.diagnose.findings import Finding
from hpctrain.errors import ClusterError, SpecError, SpecProblem
from hpctrain.jobspec.load import LoadedJob
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.slurm_time import parse_time_limit

if TYPE_CHECKING:
    from hpctrain.contract.slurm import Slurm

SKIP_HINT = "fix it, or pass --no-preflight to submit anyway"


def check_data_root(spec: JobSpec) -> list[Finding]:
    """The built-in trainer reads data.root/train_dir and data.root/val_dir."""
    if not spec.runs_trainer or spec.data.root is None:
        return []
    root = Path(spec.data.root)
    if root.is_dir():
        missing = [name for name in (spec.data.train_dir, spec.data.val_dir) if not (root / name).is_dir()]
        if missing:
            return [
                Finding(
                    "error",
                    "data.root",
                    f"{root} has no {' or '.join(missing)} folder; an ImageFolder root holds "
                    f"{spec.data.train_dir}/<class>/ and {spec.data.val_dir}/<class>/ (or set data.train_dir/val_dir)",
                )
            ]
        return []
    if root.exists():
        return check_data_image(root, spec.data.train_dir, spec.data.val_dir)
    if root.parent.is_dir():
        return [Finding("error", "data.root", f"{root} does not exist (its folder {root.parent} does)")]
    return [
        Finding(
            "warning",
            "data.root",
            f"{root} is not visible from this machine; the job fails at start unless the compute nodes mount it",
        )
    ]


def check_entrypoint(spec: JobSpec, search_path: Sequence[str] | None = None) -> list[Finding]:
    """An entry point whose source, found from here, cannot be called as ``function(ctx, **entrypoint_args)``
    (read with ``ast``: nothing is imported; ``contract/entrypoint.py`` says what is judged where)."""
    if spec.entrypoint is None:
        return []
    from hpctrain.contract.entrypoint import default_search_path, source_problem

    paths = default_search_path() if search_path is None else search_path
    problem = source_problem(spec.entrypoint, spec.entrypoint_args, paths)
    if problem is None:
        return []
    function = spec.entrypoint.partition(":")[2]
    return [
        Finding(
            "error",
            "entrypoint",
            f"{problem}; hpctrain calls it with the task context first and entrypoint_args as keywords: "
            f"define `def {function}(ctx, **kwargs)` (or fix entrypoint_args)",
        )
    ]


def check_data_image(image: Path, train_dir: str, val_dir: str) -> list[Finding]:
    """A packed image as data.root: SquashFS, complete, holding both splits; and what mounting needs.

    What this machine lacks to mount it (squashfuse, /dev/fuse) is a warning:
    the compute nodes may have it where the login node does not.
    """
    if not image.is_file():
        return [Finding("error", "data.root", f"{image} is neither a dataset folder nor a SquashFS image file")]
    problems = squashfs.check_image(image, (train_dir, val_dir))
    findings = [Finding("error", "data.root", f"{p.message}; {p.hint}") for p in problems]
    if not problems:
        findings += [
            Finding("warning", "data.root", f"cannot mount {image} from this machine: {p.message}; {p.hint}")
            for p in squashfs.mount_problems()
        ]
    return findings


def check_partition(spec: JobSpec, partitions: Mapping[str, Mapping[str, str]]) -> list[Finding]:
    """The spec's partition (or the cluster's default) exists, is up and allows the time limit."""
    name = spec.resources.partition
    if name is None:
        name = next((p for p, fields in partitions.items() if fields.get("Default") == "YES"), None)
        if name is None:
            return []  # no default partition: sbatch will say so
    if name not in partitions:
        known = ", ".join(sorted(partitions)) or "none"
        return [Finding("error", "resources.partition", f"no partition {name!r} on this cluster; it has: {known}")]
    fields, findings = partitions[name], []
    max_time = fields.get("MaxTime", "UNLIMITED")
    if max_time not in ("UNLIMITED", "INFINITE", "") and spec.resources.time_s > _seconds(max_time):
        findings.append(
            Finding(
                "error",
                "resources.time",
                f"{spec.resources.time} exceeds partition {name!r}'s MaxTime {max_time}; lower it (resume continues "
                "a longer run: docs/preemption.md)",
            )
        )
    findings += _check_node_count(spec, name, fields)
    state = fields.get("State", "UP")
    if state != "UP":
        findings.append(Finding("warning", "resources.partition", f"partition {name!r} is {state}; the job may wait"))
    return findings


def check_output_dir(spec: JobSpec, mounts_text: str | None = None) -> list[Finding]:
    """Run directories on tmpfs live in this machine's memory: no compute node ever sees them."""
    mount = filesystems.mount_of(spec.output_dir, mounts_text)
    if mount is None or mount.sharing != "memory":
        return []
    return [
        Finding(
            "error",
            "output_dir",
            f"{spec.output_dir} is on {mount.fstype} ({mount.point}), this machine's memory; the job's ranks could "
            "not write their logs, checkpoints or summary there: set output_dir on the cluster's shared file system",
        )
    ]


def _check_node_count(spec: JobSpec, name: str, fields: Mapping[str, str]) -> list[Finding]:
    """More nodes than the partition has (or lets one job take) would pend forever or be refused."""
    nodes = spec.resources.nodes
    for field, what in (("TotalNodes", "has"), ("MaxNodes", "allows one job")):
        limit = fields.get(field, "")
        if limit.isdigit() and nodes > int(limit):
            return [
                Finding(
                    "error",
                    "resources.nodes",
                    f"{nodes} nodes, but partition {name!r} {what} {limit}; ask for at most {limit} "
                    "(or another partition)",
                )
            ]
    return []


def _seconds(slurm_time: str) -> int:
    try:
        return parse_time_limit(slurm_time)
    except ValueError:
        return 2**62  # a form we do not read: let sbatch decide


def preflight(job: LoadedJob, partitions: Mapping[str, Mapping[str, str]] | None) -> list[Finding]:
    """Every finding for every trial (each trial may sweep data.root), errors first. Pure."""
    findings: list[Finding] = []
    for spec in job.trials:  # each trial may sweep data.root or entrypoint_args
        findings += [f for f in check_data_root(spec) + check_entrypoint(spec) if f not in findings]
    if partitions is not None:
        findings += check_partition(job.spec, partitions)
    return sorted(findings, key=lambda f: f.level != "error")


def run_preflight(job: LoadedJob, *, slurm_backend: bool, slurm: Slurm | None = None) -> list[Finding]:
    """Ask Slurm once (for a Slurm submission) and return the findings."""
    partitions = None
    extra: list[Finding] = []
    if slurm_backend:
        extra += check_output_dir(job.spec)
        from hpctrain.contract.slurm import Slurm

        try:
            partitions = (slurm or Slurm()).partitions()
        except ClusterError as exc:
            extra.append(Finding("warning", "resources.partition", f"could not check partitions: {exc.message}"))
    return preflight(job, partitions) + extra


def study_findings(per_point: Sequence[tuple[str, list[Finding]]]) -> list[Finding]:
    """The findings of a study's points, each once, naming the points it concerns unless it is all. Pure."""
    labels: dict[Finding, list[str]] = {}
    for label, findings in per_point:
        for finding in findings:
            labels.setdefault(finding, []).append(label)
    merged = []
    for finding, points in labels.items():
        if len(points) < len(per_point):
            many = "s" if len(points) > 1 else ""
            finding = replace(finding, message=f"{finding.message} (study point{many} {', '.join(points)})")
        merged.append(finding)
    return sorted(merged, key=lambda f: f.level != "error")


def raise_for_errors(job: LoadedJob, findings: list[Finding]) -> None:
    errors = [SpecProblem(f.key, f.message) for f in findings if f.level == "error"]
    if errors:
        raise SpecError(str(job.source), errors, hint=SKIP_HINT)
