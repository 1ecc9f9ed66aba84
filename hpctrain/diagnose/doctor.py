"""``hpctrain doctor``: will this cluster run this job? Every check, with its fix. Torch-free.

The doctor verb's one door (:func:`doctor_spec`: it loads the spec, then runs
:func:`doctor`; ``hpctrain doctor`` prints its report, ``hpctrain.doctor``
returns it, so both faces load a spec alike): the cluster's checks
(``diagnose/cluster_checks.py``: Slurm, the spec against its partition,
nodes, associations and preemption), the paths' (``diagnose/path_checks.py``:
output_dir, data.root, the Python environment, and for a local cluster how
fast data.root serves files here), then, with ``--probe``, a short job that
reports what a compute node sees (``diagnose/probe.py``), weighed against the
job's demand.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.contract.slurm import Slurm
from hpctrain.diagnose.cluster_checks import (
    ClusterView,
    check_expedited_requeue,
    check_lead_time,
    check_slurm,
    check_spec_on_cluster,
)
from hpctrain.diagnose.findings import Finding
from hpctrain.diagnose.path_checks import (
    MeasureBounds,
    check_paths,
    file_rate_checks,
    measure_here,
    measure_threads,
    measured_split,
    sharing_check,
)
from hpctrain.errors import ClusterError
from hpctrain.jobspec.load import LoadedJob, load_job

Check = Finding  # doctor's name for a finding (every check yields some)


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
        if reachable:
            checks += check_expedited_requeue(job, view.config)
    if job is not None:
        if job.spec.runs_trainer:
            checks += check_lead_time(job)
        checks += check_paths(job, slurm_backend=slurm_backend)
        if not slurm_backend:
            checks += measure_here(job, bounds or MeasureBounds())
    else:
        checks.append(sharing_check("python", sys.prefix, slurm_backend, None, "the job's Python environment"))
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


def doctor_spec(
    spec: str | Path | None,
    overrides: Sequence[str] = (),
    *,
    cluster: str | None = None,
    probe: bool = False,
    probe_timeout_s: float = 300.0,
    bounds: MeasureBounds | None = None,
    slurm: Slurm | None = None,
) -> DoctorReport:
    """The doctor verb's one door (``hpctrain doctor [SPEC]``, ``hpctrain.doctor``): load ``spec`` (None:
    the cluster alone) as ``jobspec.load.load_job`` does -- a spec that is wrong in itself is a
    ``SpecError`` listing every problem -- then :func:`doctor`. What the files behind the spec say (the
    script's file, an entry point's source, data.root) are checks of the report, never refusals."""
    job = load_job(spec, overrides, cluster=cluster) if spec is not None else None
    return doctor(job, probe=probe, probe_timeout_s=probe_timeout_s, bounds=bounds, slurm=slurm)


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
            data_root=spec.data.root if spec.runs_trainer else None,
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
