"""bench-data's measurement, on this machine or as a one-task Slurm job on a compute node.

:func:`measure` runs every measurement here (a login node, a laptop, or the
compute node of ``--slurm``) and imports torch only after the spec and data
root have been checked. :func:`run_on_slurm` runs the same measurement as a
short single-task job on the spec's cluster (same partition, cores per task
and one of its GPUs) through the executor ``submit`` uses; the verdict
itself is :mod:`hpctrain.diagnose.data_bench`.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.diagnose.data_bench import (
    BenchReport,
    Demand,
    cores_per_gpu,
    gpu_type,
    gpu_type_from_name,
    read_throughput,
    spec_demand,
    stage_read_throughput,
)
from hpctrain.errors import ClusterError, HpctrainError, UsageError
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.profiles import ClusterProfile


@dataclass(frozen=True)
class BenchOptions:
    stage_dir: str | None = None
    gpu: str | None = None
    demand: float | None = None
    measure_gpu: bool = False
    max_files: int = 2000
    seconds: float = 10.0


def measure(spec: JobSpec, profile: ClusterProfile, options: BenchOptions, source: str) -> BenchReport:
    """All measurements on this machine (a login node, a laptop, or the compute node of --slurm)."""
    train_root = _train_root(spec)
    read = read_throughput(train_root, max_files=options.max_files, max_s=options.seconds)
    stage_read = None
    if options.stage_dir or spec.data.stage == "node":
        if options.stage_dir:
            stage_dir = Path(options.stage_dir).expanduser()
        else:
            from hpctrain.trainer.data.staging import resolve_stage_dir

            stage_dir = resolve_stage_dir(spec.data.stage_dir, os.environ)
        stage_read = stage_read_throughput(train_root, stage_dir, max_files=options.max_files, max_s=options.seconds)
    # Measure decoding on data.root itself: a bench must not stage the whole dataset.
    spec = spec.model_copy(update={"data": spec.data.model_copy(update={"stage": "none"})})

    import torch  # only now: a bad spec or data root is reported without paying for torch

    from hpctrain.trainer.data import pipeline_rates
    from hpctrain.trainer.data.device_decode import dali_installed

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    decoder = spec.data.decode
    if decoder == "auto":
        decoder = ("dali" if dali_installed() else "gpu") if spec.uses_gpus else "cpu"
    rate, note = pipeline_rates.decode_rate(spec, decoder, max_s=options.seconds)
    cores, cores_source = cores_per_gpu(spec, os.environ, len(os.sched_getaffinity(0)))
    notes = []
    gpu = options.gpu or gpu_type(spec, profile) or (gpu_type_from_name(torch.cuda.get_device_name()) if cuda else None)
    if options.demand is not None:
        demand = Demand(options.demand, "--demand")
    elif options.measure_gpu:
        if not cuda:
            raise UsageError(
                "--measure-gpu: this machine has no CUDA GPU",
                hint="run it on a GPU node: add --slurm, or use the table (leave --measure-gpu out)",
            )
        rate_gpu = pipeline_rates.training_rate(spec, device)
        demand = Demand(
            rate_gpu, f"measured: {spec.trainer.arch} {spec.trainer.precision} on {torch.cuda.get_device_name()}"
        )
    elif gpu is None:
        demand = Demand(None, "unknown GPU model: pass --gpu (h100, a100, v100), --demand IMG_S or --measure-gpu")
    else:
        demand = spec_demand(spec, gpu)
    gpu_decode = pipeline_rates.gpu_decode_rate(spec, decoder, device) if options.measure_gpu else None
    if not spec.uses_gpus:
        notes.append("the spec asks for no GPUs: figures are per GPU of the model named above, as if it had them")
    if read.files < 50:
        notes.append(f"only {read.files} files read: the read rate is rough")
    return BenchReport(
        spec=source,
        decoder=decoder,
        read=read,
        stage_read=stage_read,
        decode_img_s_per_core=rate,
        decode_note=note,
        cores_per_gpu=cores,
        cores_source=cores_source,
        gpus_per_node=spec.resources.gpus_per_node or 0,
        gpu=gpu or "unknown",
        demand=demand,
        gpu_decode_img_s=gpu_decode,
        notes=notes,
    )


def _train_root(spec: JobSpec) -> Path:
    if spec.data.root is None:
        raise UsageError("data.root is not set", hint="set data.root in the spec or pass --set data.root=DIR")
    root = Path(spec.data.root).expanduser()
    if root.is_file():
        raise UsageError(
            f"data.root: {root} is a file (a packed image?); bench-data reads a dataset folder",
            hint="pass --set data.root=DIR with the folder the image was packed from",
        )
    if not root.is_dir():
        raise UsageError(
            f"data.root: {root} does not exist or is not a directory",
            hint="point data.root at an ImageFolder, or make a small one with 'hpctrain make-dataset DIR'",
        )
    train = root / spec.data.train_dir
    if not train.is_dir():
        raise UsageError(
            f"data.train_dir: {train} does not exist (data.root is {root})",
            hint="set data.train_dir to the training split's folder under data.root",
        )
    return train


# --- --slurm: the same measurement as a one-task job -------------------------------------------------------


def bench_slurm_parameters(spec: JobSpec, profile: ClusterProfile, folder: Path, time_min: int) -> dict[str, Any]:
    """The job's own sbatch parameters, cut down to one node, one task and at most one GPU. Pure."""
    from hpctrain.launch.submission import slurm_parameters

    params = slurm_parameters(spec, profile, folder)
    params.update(job_name=f"{spec.name}-bench-data", nodes=1, ntasks_per_node=1, time=time_min)
    params.pop("array_parallelism", None)
    if "gres" in params:
        params["gres"] = profile.gpu_gres.format(gpus=1)  # type: ignore[union-attr]
    if "gpus_per_node" in params:
        params["gpus_per_node"] = 1
    extra = {k: v for k, v in params["additional_parameters"].items() if k not in ("requeue", "signal")}
    extra["no-requeue"] = True
    params["additional_parameters"] = extra
    return params


def remote_measure(spec_data: dict[str, Any], profile_data: dict[str, Any], options: BenchOptions, source: str) -> Any:
    """What the compute node runs; a user error comes back as data, not as a remote traceback."""
    spec, profile = JobSpec.model_validate(spec_data), ClusterProfile.model_validate(profile_data)
    try:
        return measure(spec, profile, options, source)
    except HpctrainError as exc:
        return {"error": exc.message, "hint": exc.hint, "exit_code": exc.exit_code}


def run_on_slurm(
    spec: JobSpec, profile: ClusterProfile, options: BenchOptions, source: str, *, timeout_s: float
) -> BenchReport:
    from hpctrain.launch.sbatch_script import python_command
    from hpctrain.launch.submitit_executor import SlurmExecutor

    if profile.scheduler != "slurm" or shutil.which("sbatch") is None:
        raise ClusterError(
            f"--slurm: cluster '{profile.name}' has no Slurm here (scheduler {profile.scheduler}, sbatch "
            f"{'found' if shutil.which('sbatch') else 'not on PATH'})",
            hint="run without --slurm to measure on this machine, or pass --cluster NAME of a Slurm profile",
        )
    folder = Path(spec.output_dir).expanduser() / spec.name / "bench-data" / time.strftime("%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    executor = SlurmExecutor(folder=folder, python=python_command())
    executor.update_parameters(**bench_slurm_parameters(spec, profile, folder, time_min=max(2, int(timeout_s // 60))))
    spec_data, profile_data = spec.model_dump(mode="json"), profile.model_dump(mode="json")
    try:
        job = executor.submit(remote_measure, spec_data, profile_data, options, source)
    except Exception as exc:  # submitit raises several types for a refused sbatch
        raise ClusterError(f"Slurm refused the bench-data job: {str(exc).strip()[:500]}") from None
    print(f"bench-data: Slurm job {job.job_id} (logs in {folder})", file=sys.stderr)
    deadline = time.monotonic() + timeout_s
    while not job.done():
        if time.monotonic() > deadline:
            job.cancel(check=False)
            raise ClusterError(
                f"bench-data job {job.job_id} did not finish within {timeout_s:.0f} s; cancelled it",
                hint="the queue may be busy: raise --timeout, or look at 'squeue -j JOBID'",
            )
        time.sleep(1.0)
    try:
        result = job.result()
    except Exception as exc:
        raise ClusterError(
            f"bench-data job {job.job_id} failed: {str(exc).strip().splitlines()[-1][:300]}",
            hint=f"see its logs in {folder}",
        ) from None
    if isinstance(result, dict) and "error" in result:
        error = HpctrainError(f"on the compute node: {result['error']}", result.get("hint"))
        error.exit_code = int(result.get("exit_code", 1))
        raise error
    return result  # type: ignore[no-any-return]
