"""``hpctrain doctor``'s questions to the file systems: can the job's nodes read and write where it says? Torch-free.

* what the job runs: a ``script:``'s file or module, an entry point whose
  source must take ``ctx`` (what ``validate`` and ``submit`` refuse, reported
  here as checks: :func:`check_program`);
* paths: ``output_dir``, ``data.root`` and the Python environment exist, have
  the permissions the job needs and sit on a file system compute nodes share;
  ``data.root`` looks like an ImageFolder (a sample, never a full scan);
* how fast ``data.root`` serves files (measured here for a local cluster, or
  by ``--probe`` on a compute node: ``diagnose/probe.py``) against the
  images/s the job will ask for (:func:`check_file_rate`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.diagnose import filesystems
from hpctrain.diagnose.data_bench import gpu_type, spec_demand
from hpctrain.diagnose.filesystems import FileRate
from hpctrain.diagnose.findings import Finding, Level
from hpctrain.diagnose.preflight import check_data_root, check_entrypoint
from hpctrain.jobspec.load import LoadedJob
from hpctrain.jobspec.script_checks import program_problems

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp"})
SAMPLE_CLASSES = 5
SAMPLE_FILES = 20
FAR_BELOW = 4  # the tree serves under a quarter of what the job asks: its GPUs would mostly wait
SLOW_STAGE_MIN = 10.0  # data.stage: node spending longer than this opening files deserves a pack


def check_paths(job: LoadedJob, *, slurm_backend: bool, mounts_text: str | None = None) -> list[Finding]:
    spec = job.spec
    checks = [*check_program(job), check_output_dir(spec.output_dir, slurm_backend, mounts_text)]
    checks.append(sharing_check("python", sys.prefix, slurm_backend, mounts_text, "the job's Python environment"))
    data_findings = [f for trial in job.trials for f in check_data_root(trial)]
    if spec.runs_trainer and spec.data.root is not None:
        is_image = Path(spec.data.root).is_file()
        if data_findings:
            checks += [Finding(f.level, f.key, f.message, "make the dataset, or fix data.root") for f in data_findings]
        if is_image and not any(f.level == "error" for f in data_findings):
            checks.append(sharing_check("data.root", spec.data.root, slurm_backend, mounts_text, "the dataset"))
            where = f"{spec.data.train_dir}/ and {spec.data.val_dir}/"
            checks.append(Finding("ok", "dataset", f"a SquashFS image holding {where} (each node mounts it)"))
        elif not data_findings:
            checks.append(sharing_check("data.root", spec.data.root, slurm_backend, mounts_text, "the dataset"))
            checks.append(check_image_folder(Path(spec.data.root), spec.data.train_dir, spec.data.val_dir))
    return checks


def check_program(job: LoadedJob) -> list[Finding]:
    """The script's file or module is here (``script:``), and each trial's entry point can take ``ctx``:
    what ``validate`` and ``submit`` refuse, as checks of the report (so doctor loads the spec as they do
    and still shows every other check)."""
    spec = job.spec
    if spec.script is not None:
        problems = program_problems(spec)
        fix = "fix the path, or run hpctrain where it is relative to"
        if problems:
            return [Finding("error", p.key, p.message, fix) for p in problems]
        return [Finding("ok", "script", f"{spec.script.program} is there to be submitted")]
    checks: list[Finding] = []
    for trial in job.trials:
        checks += [f for f in check_entrypoint(trial) if f not in checks]
    return checks


def check_output_dir(output_dir: str, slurm_backend: bool, mounts_text: str | None = None) -> Finding:
    existing = filesystems.existing_ancestor(output_dir)
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return Finding(
            "error", "output_dir", f"{existing} is not a writable folder", "set output_dir to a folder of yours"
        )
    return sharing_check("output_dir", output_dir, slurm_backend, mounts_text, "run directories")


def sharing_check(name: str, path: str, slurm_backend: bool, mounts_text: str | None, what: str) -> Finding:
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
    if not job.spec.runs_trainer or data.root is None or Path(os.path.expanduser(data.root)).is_file():
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
