"""``hpctrain bench-data --slurm``: the measurement as a one-task job on a compute node, its report read back.

The job is the spec's, cut down to one node, one task and at most one GPU
(same partition, account, cores per task; never requeued), submitted as the
doctor's probe is (``sbatch --wrap`` through the one Slurm client). The node
runs ``python -m hpctrain.diagnose.data_bench_job``, which reads the request
written here into the job's folder and prints its report as one JSON line;
a user error on the node comes back as that error. Here, not in
``diagnose/``: it submits a job with the spec's Slurm parameters
(``submission.py``), and ``diagnose`` never imports ``launch``.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hpctrain.contract.file_writes import write_atomic
from hpctrain.contract.runfiles import load_json, printable, read_tail
from hpctrain.contract.slurm import Slurm, WaitTimedOut, sbatch_wrap_command
from hpctrain.diagnose import data_bench_job
from hpctrain.diagnose.data_bench import BenchReport
from hpctrain.diagnose.data_bench_job import MARKER, MAX_OUTPUT_BYTES, REQUEST_NAME, BenchOptions
from hpctrain.errors import ClusterError, HpctrainError
from hpctrain.jobscript.parameters import slurm_parameters
from hpctrain.jobscript.sbatch_script import python_command
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.profiles import ClusterProfile


def bench_sbatch_options(spec: JobSpec, profile: ClusterProfile, folder: Path) -> list[tuple[str, Any]]:
    """The job's own sbatch options, cut down to one node, one task and at most one GPU, never requeued
    (:func:`~hpctrain.contract.slurm.sbatch_wrap_command` adds those). Pure."""
    params = slurm_parameters(spec, profile, folder)
    options: list[tuple[str, Any]] = [
        (name.replace("_", "-"), params.get(name)) for name in ("partition", "account", "qos", "constraint")
    ]
    options += [("cpus-per-task", params.get("cpus_per_task")), ("mem", params.get("mem"))]
    options += [("exclusive", params.get("exclusive"))]
    if "gres" in params:
        options.append(("gres", profile.gpu_gres.format(gpus=1)))  # type: ignore[union-attr]
    if "gpus_per_node" in params:
        options.append(("gpus-per-node", 1))
    skipped = ("requeue", "no-requeue", "signal", "no-kill")
    options += [(key, value) for key, value in params["additional_parameters"].items() if key not in skipped]
    return options


def bench_wrap(spec: JobSpec, profile: ClusterProfile, folder: Path, request: Path) -> str:
    """What the job runs: the spec's setup lines, then the measurement under the reaper's exec wrapper. Pure."""
    setup = slurm_parameters(spec, profile, folder)["setup"]
    command = f"{python_command()} -m {data_bench_job.__name__} --request {shlex.quote(str(request))}"
    return "\n".join([*setup, command])


def run_on_slurm(
    spec: JobSpec,
    profile: ClusterProfile,
    options: BenchOptions,
    source: str,
    *,
    timeout_s: float,
    slurm: Slurm | None = None,
) -> BenchReport:
    """The measurement as a one-task job (``sbatch --wrap``, as the doctor's probe), its report read back
    from the job's output; a user error on the node comes back as that error."""
    slurm = slurm or Slurm()
    if profile.scheduler != "slurm" or not slurm.available():
        raise ClusterError(
            f"--slurm: cluster '{profile.name}' has no Slurm here (scheduler {profile.scheduler}, sbatch "
            f"{'found' if slurm.which('sbatch') else 'not on PATH'})",
            hint="run without --slurm to measure on this machine, or pass --cluster NAME of a Slurm profile",
        )
    folder = Path(spec.output_dir).expanduser() / spec.name / "bench-data" / time.strftime("%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    request = folder / REQUEST_NAME
    document = {"spec": spec.model_dump(mode="json"), "profile": profile.model_dump(mode="json")}
    document.update(options=asdict(options), source=source)
    write_atomic(request, json.dumps(document))
    command = sbatch_wrap_command(
        job_name=f"{spec.name}-bench-data",
        wrap=bench_wrap(spec, profile, folder.absolute(), request.absolute()),
        output=folder.absolute() / "bench-%j.out",
        time_min=max(2, int(timeout_s // 60)),
        options=bench_sbatch_options(spec, profile, folder),
    )
    try:
        job_id = slurm.submit_wrapped(command)
    except ClusterError as exc:
        raise ClusterError(f"Slurm refused the bench-data job: {exc.message}", hint=exc.hint) from None
    print(f"bench-data: Slurm job {job_id} (logs in {folder})", file=sys.stderr)
    try:
        state = slurm.wait_for(job_id, timeout_s=timeout_s, poll_s=1.0)
    except WaitTimedOut:
        try:
            slurm.cancel_job(job_id)
        except ClusterError:
            pass
        raise ClusterError(
            f"bench-data job {job_id} did not finish within {timeout_s:.0f} s; cancelled it",
            hint="the queue may be busy: raise --timeout, or look at 'squeue -j JOBID'",
        ) from None
    return _read_result(folder / f"bench-{job_id}.out", job_id, state, folder)


def _read_result(output: Path, job_id: str, state: str, folder: Path) -> BenchReport:
    try:
        text = read_tail(output, MAX_OUTPUT_BYTES).decode(errors="replace")
    except (OSError, HpctrainError):
        text = ""
    lines = text.splitlines()
    found = next((line[len(MARKER) :] for line in reversed(lines) if line.startswith(MARKER)), None)
    try:
        result = load_json(found) if found is not None else None
    except (ValueError, RecursionError):
        result = None
    if not isinstance(result, dict):
        last = printable(lines[-1][:300]) if lines else f"no output in {output}"
        raise ClusterError(f"bench-data job {job_id} failed ({state}): {last}", hint=f"see its logs in {folder}")
    if "error" in result:
        error = HpctrainError(f"on the compute node: {printable(result['error'])}", printable(result.get("hint")))
        code = result.get("exit_code")
        error.exit_code = code if isinstance(code, int) and 1 <= code <= 125 else 1
        raise error
    try:
        return BenchReport.from_dict(result)
    except (KeyError, TypeError, ValueError) as exc:
        raise ClusterError(
            f"bench-data job {job_id} reported an unreadable result ({exc})", hint=f"see {output}"
        ) from None
