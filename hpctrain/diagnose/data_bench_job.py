"""bench-data's measurement, on this machine or as a one-task Slurm job on a compute node.

:func:`measure` runs every measurement here (a login node, a laptop, or the
compute node of ``--slurm``) and imports torch only after the spec and data
root have been checked. ``--slurm`` runs the same measurement as a short
single-task job (``hpctrain/launch/bench_job.py`` submits it): on the node,
:func:`main` reads the request the login side wrote into the job's folder and
prints its report as one JSON line (:data:`MARKER`); the verdict itself is
:mod:`hpctrain.diagnose.data_bench`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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
from hpctrain.errors import HpctrainError, UsageError
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


# --- --slurm: the node's side of the one-task job (the login side submits it: launch/bench_job.py) -----------

MARKER = "HPCTRAIN-BENCH "  # the node's one line of result in the job's output
REQUEST_NAME = "request.json"
MAX_OUTPUT_BYTES = 4 << 20


def remote_measure(request: Path) -> dict[str, Any]:
    """What the compute node runs: the measurement's report, or the user error it met, as data."""
    document = json.loads(request.read_text())
    spec, profile = JobSpec.model_validate(document["spec"]), ClusterProfile.model_validate(document["profile"])
    try:
        return measure(spec, profile, BenchOptions(**document["options"]), document["source"]).as_dict()
    except HpctrainError as exc:
        return {"error": exc.message, "hint": exc.hint, "exit_code": exc.exit_code}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description="bench-data's node side")
    parser.add_argument("--request", required=True, help=f"the {REQUEST_NAME} the login side wrote")
    args = parser.parse_args(argv)
    print(MARKER + json.dumps(remote_measure(Path(args.request))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
