"""``hpctrain bench-data``: will the input pipeline keep the job's GPUs busy?

Three measurements and one demand figure make the verdict:

* read MB/s from ``data.root`` (and a stage directory), with each file
  dropped from the page cache first so a second run is not flattered;
* decode + augment images/s per CPU core for the spec's decoder (measured by
  ``hpctrain.trainer.data.pipeline_rates``, which imports torch; this module does not);
* the CPU cores the job gives each GPU (``resources.cpus_per_task`` over the
  GPUs of one task, or the cores this process may use);
* the images/s one GPU asks for: measured (``--measure-gpu``) or looked up in
  ``GPU_DEMAND``, scaled by FLOPs for other architectures and image sizes.

-> "data keeps up: yes/no; cores needed per GPU: N". Everything here is pure
except ``read_throughput``, so the verdict is unit-tested with plain numbers.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.contract.cpu_share import cpu_share, slurm_cpus_per_task
from hpctrain.diagnose.filesystems import entry_kind
from hpctrain.errors import UsageError
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.profiles import ClusterProfile

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".JPEG", ".JPG", ".PNG")
# Training images/s of one GPU at 224 px, by (gpu, arch, precision class, channels_last).
# h100: benchmarks/precision_throughput.py on one H100 80GB HBM3 (benchmarks/README.md), batch 128.
# v100, a100: NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5 README, "Training performance" tables
# (pytorch-21.03 NGC container, 1 GPU of a DGX-1 16GB / DGX A100 80GB; mixed precision there is AMP
# with channels-last, FP32 on A100 means TF32):
# https://github.com/NVIDIA/DeepLearningExamples/tree/master/PyTorch/Classification/ConvNets/resnet50v1.5
GPU_DEMAND: dict[tuple[str, str, str, bool], float] = {
    ("h100", "resnet50", "fp16", True): 3826.3,
    ("h100", "resnet50", "fp16", False): 2539.8,
    ("h100", "resnet50", "bf16", True): 3755.4,
    ("h100", "resnet50", "bf16", False): 2154.7,
    ("h100", "resnet50", "fp32", True): 2448.7,
    ("h100", "resnet50", "fp32", False): 1804.8,
    ("a100", "resnet50", "mixed", True): 2470.0,
    ("a100", "resnet50", "fp32", True): 938.0,
    ("v100", "resnet50", "mixed", True): 1200.0,
    ("v100", "resnet50", "fp32", True): 367.0,
}
# Forward GFLOPs at 224 px (torchvision's model docs), to scale ResNet-50's rate to other models.
# An estimate: small models use a GPU less efficiently, so they are slower than FLOPs say.
GFLOPS_224 = {
    "resnet18": 1.81,
    "resnet34": 3.66,
    "resnet50": 4.09,
    "resnet101": 7.80,
    "resnet152": 11.51,
    "wide_resnet50_2": 11.40,
    "resnext50_32x4d": 4.23,
    "mobilenet_v2": 0.30,
    "mobilenet_v3_large": 0.22,
    "mobilenet_v3_small": 0.06,
    "efficientnet_b0": 0.39,
    "vgg16": 15.47,
    "densenet121": 2.83,
}
_MIXED = {"fp16": "mixed", "bf16": "mixed", "O1": "mixed", "O2": "mixed", "O3": "mixed"}


@dataclass
class ReadResult:
    path: str
    files: int
    bytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_file_kb(self) -> float:
        return self.bytes / 1e3 / self.files if self.files else 0.0


@dataclass
class Demand:
    img_s_per_gpu: float | None
    source: str  # how it was obtained, for the report


@dataclass
class BenchReport:
    """Everything bench-data prints; ``as_dict`` is the --json document."""

    spec: str
    decoder: str
    read: ReadResult
    stage_read: ReadResult | None
    decode_img_s_per_core: float
    decode_note: str
    cores_per_gpu: int
    cores_source: str
    gpus_per_node: int
    gpu: str
    demand: Demand
    gpu_decode_img_s: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def cores_needed_per_gpu(self) -> int | None:
        return cores_needed(self.demand.img_s_per_gpu, self.decode_img_s_per_core)

    @property
    def read_needed_mb_s(self) -> float | None:
        """MB/s one node must read to feed its GPUs (each image read once per epoch)."""
        if self.demand.img_s_per_gpu is None:
            return None
        return self.demand.img_s_per_gpu * max(1, self.gpus_per_node) * self.read.mean_file_kb / 1e3

    @property
    def keeps_up(self) -> bool | None:
        needed = self.cores_needed_per_gpu
        if needed is None:
            return None
        source = self.stage_read or self.read
        reads_enough = self.read_needed_mb_s is None or source.mb_per_s >= self.read_needed_mb_s
        decodes_enough = self.gpu_decode_img_s is None or self.gpu_decode_img_s >= (self.demand.img_s_per_gpu or 0)
        return needed <= self.cores_per_gpu and reads_enough and decodes_enough

    def verdict(self) -> str:
        keeps = {True: "yes", False: "no", None: "unknown"}[self.keeps_up]
        needed = self.cores_needed_per_gpu
        return f"data keeps up: {keeps}; cores needed per GPU: {needed if needed is not None else 'unknown'}"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["read"]["mb_per_s"] = round(self.read.mb_per_s, 1)
        out["read"]["mean_file_kb"] = round(self.read.mean_file_kb, 1)
        if self.stage_read is not None:
            out["stage_read"]["mb_per_s"] = round(self.stage_read.mb_per_s, 1)
        out.update(
            cores_needed_per_gpu=self.cores_needed_per_gpu,
            read_needed_mb_s=None if self.read_needed_mb_s is None else round(self.read_needed_mb_s, 1),
            keeps_up=self.keeps_up,
            verdict=self.verdict(),
        )
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchReport:
        """A report back from its :meth:`as_dict` (``bench-data --slurm`` reads the node's); raises KeyError,
        TypeError or ValueError for one that is not."""

        def read_result(raw: dict[str, Any]) -> ReadResult:
            return ReadResult(str(raw["path"]), int(raw["files"]), int(raw["bytes"]), float(raw["seconds"]))

        demand = data["demand"]
        return cls(
            spec=str(data["spec"]),
            decoder=str(data["decoder"]),
            read=read_result(data["read"]),
            stage_read=read_result(data["stage_read"]) if data.get("stage_read") is not None else None,
            decode_img_s_per_core=float(data["decode_img_s_per_core"]),
            decode_note=str(data["decode_note"]),
            cores_per_gpu=int(data["cores_per_gpu"]),
            cores_source=str(data["cores_source"]),
            gpus_per_node=int(data["gpus_per_node"]),
            gpu=str(data["gpu"]),
            demand=Demand(
                None if demand["img_s_per_gpu"] is None else float(demand["img_s_per_gpu"]), str(demand["source"])
            ),
            gpu_decode_img_s=None if data.get("gpu_decode_img_s") is None else float(data["gpu_decode_img_s"]),
            notes=[str(note) for note in data.get("notes") or []],
        )

    def rows(self) -> list[tuple[str, str]]:
        """(what, value) lines shared by the plain and the rich output."""
        rows = [("read from data.root", _read_line(self.read))]
        if self.stage_read is not None:
            rows.append(("read from stage dir", _read_line(self.stage_read)))
        rows.append((f"decode+augment ({self.decoder})", f"{self.decode_img_s_per_core:.0f} img/s per core"))
        if self.decode_note:
            rows.append(("", self.decode_note))
        if self.gpu_decode_img_s is not None:
            rows.append(("GPU decode", f"{self.gpu_decode_img_s:.0f} img/s per GPU"))
        rows.append(("cores per GPU", f"{self.cores_per_gpu} ({self.cores_source})"))
        demand = self.demand.img_s_per_gpu
        rows.append(
            ("GPU demand", f"{demand:.0f} img/s per GPU ({self.demand.source})" if demand else self.demand.source)
        )
        if self.read_needed_mb_s is not None:
            rows.append(
                ("read needed per node", f"{self.read_needed_mb_s:.1f} MB/s for {max(1, self.gpus_per_node)} GPU(s)")
            )
        return rows


def _read_line(read: ReadResult) -> str:
    return f"{read.mb_per_s:.1f} MB/s ({read.files} files, {read.mean_file_kb:.0f} kB each, {read.path})"


def cores_needed(demand_img_s: float | None, img_s_per_core: float) -> int | None:
    """Worker cores one GPU needs, plus the training process's own core."""
    if demand_img_s is None or img_s_per_core <= 0:
        return None
    return math.ceil(demand_img_s / img_s_per_core) + 1


def precision_class(precision: str) -> str:
    return _MIXED.get(precision, "fp32")


def table_demand(gpu: str, arch: str, precision: str, channels_last: bool, image_size: int = 224) -> Demand:
    """One GPU's training images/s from GPU_DEMAND; other models and sizes scaled by FLOPs."""
    gpu = gpu.lower()
    candidates = [(precision, channels_last), (precision_class(precision), True), (precision_class(precision), False)]
    for prec, cl in candidates:
        for name in (arch, "resnet50"):
            rate = GPU_DEMAND.get((gpu, name, prec, cl))
            if rate is None:
                continue
            if name != arch and arch not in GFLOPS_224:
                break
            scale = (GFLOPS_224["resnet50"] / GFLOPS_224[arch] if name != arch else 1.0) * (224 / image_size) ** 2
            how = "table" if name == arch and image_size == 224 else "table, scaled by FLOPs from ResNet-50 at 224 px"
            return Demand(rate * scale, f"{how}: {gpu} {name} {prec}{' channels-last' if cl else ''}")
    known = sorted({key[0] for key in GPU_DEMAND})
    return Demand(
        None,
        f"no table entry for {gpu} {arch} {precision}: run with --measure-gpu on a GPU node, "
        f"pass --demand IMG_S, or --gpu one of {', '.join(known)}",
    )


def spec_demand(spec: JobSpec, gpu: str) -> Demand:
    """One ``gpu``'s training images/s for the spec's model, precision, memory format and image size:
    the one figure bench-data and doctor compare the data path with."""
    trainer = spec.trainer
    return table_demand(gpu, trainer.arch, trainer.precision, trainer.channels_last, spec.data.image_size)


def gpu_type(spec: JobSpec, profile: ClusterProfile) -> str | None:
    """The GPU model named by the profile's GRES ('gpu:v100:{gpus}') or the spec's constraint."""
    known = {key[0] for key in GPU_DEMAND}
    words = []
    if profile.gpu_gres:
        words += profile.gpu_gres.lower().split(":")
    if spec.resources.constraint:
        words += spec.resources.constraint.lower().replace("&", " ").replace("|", " ").split()
    return next((word for word in words if word in known), None)


def gpu_type_from_name(device_name: str) -> str | None:
    """'NVIDIA H100 80GB HBM3' -> 'h100'."""
    lowered = device_name.lower()
    return next((gpu for gpu in sorted({key[0] for key in GPU_DEMAND}) if gpu in lowered), None)


def cores_per_gpu(spec: JobSpec, environ: Mapping[str, str], affinity: int) -> tuple[int, str]:
    """CPU cores the job gives each GPU: SLURM_CPUS_PER_TASK inside a job, else the spec's
    cpus_per_task, else the cores this process may use; divided by the GPUs one task drives."""
    gpus = spec.resources.gpus_per_node or 0
    gpus_per_task = max(1, gpus // max(1, spec.tasks_per_node)) if gpus else 1
    slurm_cpus = slurm_cpus_per_task(environ)
    if slurm_cpus is not None:
        cpus, source = slurm_cpus, "SLURM_CPUS_PER_TASK"
    elif spec.resources.cpus_per_task is not None:
        cpus, source = spec.resources.cpus_per_task, "resources.cpus_per_task"
    else:
        cpus, source = affinity, "cores this process may use; set resources.cpus_per_task"
    per_gpu = cpu_share(cpus, gpus_per_task)
    if gpus_per_task > 1:
        source += f" / {gpus_per_task} GPUs per task"
    return per_gpu, source


def image_files(root: Path, limit: int) -> Iterator[Path]:
    """Up to ``limit`` image files spread over the class folders (a few from each, round robin)
    without listing a million-file tree first."""
    if not root.is_dir():
        return
    classes = sorted(entry.path for entry in os.scandir(root) if entry_kind(entry) == "dir")
    iterators = [_files_in(Path(path)) for path in classes] or [_files_in(root)]
    taken = 0
    while iterators and taken < limit:
        alive = []
        for files in iterators:
            path = next(files, None)
            if path is None:
                continue
            alive.append(files)
            yield path
            taken += 1
            if taken >= limit:
                return
        iterators = alive


def _files_in(directory: Path) -> Iterator[Path]:
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry_kind(entry) == "file" and entry.name.endswith(IMAGE_SUFFIXES):
                yield Path(entry.path)


def read_throughput(root: Path, *, max_files: int = 2000, max_s: float = 10.0, threads: int = 8) -> ReadResult:
    """MB/s reading whole files with ``threads`` readers, each file evicted from the page cache first.

    POSIX_FADV_DONTNEED needs no privileges; on network file systems the
    client cache may ignore it, which the report cannot tell.
    """
    files = list(image_files(root, max_files))
    if not files:
        raise UsageError(
            f"data.root: no image files under {root}",
            hint="point data.root at an ImageFolder (ROOT/train/<class>/*.jpg) or make one with hpctrain make-dataset",
        )
    deadline = time.monotonic() + max_s

    def read(path: Path) -> int:
        if time.monotonic() > deadline:
            return -1
        fd = os.open(path, os.O_RDONLY)
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            size = 0
            while chunk := os.read(fd, 1 << 20):
                size += len(chunk)
            return size
        finally:
            os.close(fd)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        sizes = [size for size in pool.map(read, files) if size >= 0]
    return ReadResult(str(root), len(sizes), sum(sizes), time.perf_counter() - start)


def stage_read_throughput(source: Path, stage_dir: Path, *, max_files: int = 2000, max_s: float = 10.0) -> ReadResult:
    """Read MB/s of the node-local disk data.stage would copy to: copy a sample of the files
    there (into a scratch folder removed afterwards), then read them back like ``read_throughput``.

    ``stage_dir``'s parent must exist: a missing ``stage_dir`` itself is created and removed
    again afterwards, so the measurement leaves the disk as it found it (no directory tree
    made from a typo)."""
    import shutil
    import tempfile

    hint = "pass --stage-dir (or set data.stage_dir) to a writable folder on the node-local disk, e.g. /tmp"
    if not stage_dir.parent.is_dir():
        raise UsageError(f"stage dir {stage_dir}: {stage_dir.parent} does not exist", hint=hint)
    created = False
    try:
        if not stage_dir.exists():
            stage_dir.mkdir()
            created = True
        scratch = Path(tempfile.mkdtemp(prefix="hpctrain-bench-", dir=stage_dir))
    except OSError as exc:
        if created:
            stage_dir.rmdir()
        raise UsageError(f"stage dir {stage_dir}: cannot write there ({exc.strerror or exc})", hint=hint) from None
    try:
        deadline = time.monotonic() + max_s
        for i, path in enumerate(image_files(source, max_files)):
            if time.monotonic() > deadline:
                break
            shutil.copyfile(path, scratch / f"{i:06d}{path.suffix}")
        result = read_throughput(scratch, max_files=max_files, max_s=max_s)
        return ReadResult(f"{stage_dir} (sample copy)", result.files, result.bytes, result.seconds)
    except OSError as exc:  # the disk filled up, or the folder went away
        raise UsageError(
            f"stage dir {stage_dir}: copying the sample failed ({exc.strerror or exc})", hint=hint
        ) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                stage_dir.rmdir()


def render_plain(report: BenchReport) -> str:
    lines = [f"{report.spec}: bench-data"]
    lines += [f"  {what}: {value}" if what else f"    {value}" for what, value in report.rows()]
    lines += [f"  note: {note}" for note in report.notes]
    lines.append(report.verdict())
    return "\n".join(lines)


def render_rich(report: BenchReport) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{report.spec}: bench-data", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    for what, value in report.rows():
        table.add_row(what, value)
    console = Console()
    console.print(table)
    for note in report.notes:
        console.print(f"note: {note}")
    colour = {True: "green", False: "red", None: "yellow"}[report.keeps_up]
    console.print(f"[{colour}]{report.verdict()}[/{colour}]")
