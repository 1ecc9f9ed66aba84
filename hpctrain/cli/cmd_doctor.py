"""``hpctrain doctor [SPEC] [--probe] [--json]``: one table of checks, each ok / warning / error with its fix.

Exit 0 when no check is an error, 1 otherwise. Torch-free (login nodes).
"""

from __future__ import annotations

import argparse
import json

from hpctrain.diagnose import doctor
from hpctrain.diagnose.findings import Finding
from hpctrain.jobspec.load import LoadedJob, load_job

MARKS = {"ok": "ok  ", "warning": "warn", "error": "FAIL"}


def run(args: argparse.Namespace) -> int:
    job = load_job(args.spec, args.overrides, cluster=args.cluster) if args.spec else None
    slurm_backend = job is None or job.profile.scheduler == "slurm"
    bounds = doctor.MeasureBounds(max_files=args.measure_files, max_s=args.measure_seconds)
    checks = doctor.run_checks(job, slurm_backend=slurm_backend, bounds=bounds)
    probe = None
    if args.probe:
        checks, probe = with_probe(job, checks, timeout_s=args.probe_timeout, bounds=bounds)
    report = doctor.summary(checks)
    if probe is not None:
        report["probe"] = probe
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(checks, probe)
    return 0 if report["ok"] else 1


def with_probe(
    job: LoadedJob | None, checks: list[Finding], *, timeout_s: float, bounds: doctor.MeasureBounds
) -> tuple[list[Finding], dict | None]:
    """Run the probe job where the checks so far allow it; add what it found."""
    from hpctrain.diagnose.probe import Measure, probe_findings, run_probe
    from hpctrain.errors import ClusterError

    if any(c.level == "error" and c.key in ("slurm clients", "controller") for c in checks):
        return [*checks, Finding("error", "probe", "not run: Slurm does not answer")], None
    if job is None or job.profile.scheduler != "slurm":
        return [*checks, Finding("warning", "probe", "not run: give a spec for a Slurm cluster")], None
    spec = job.spec
    gpus = spec.resources.gpus_per_node or 0
    gres = (
        job.profile.gpu_gres.format(gpus=gpus) if gpus and job.profile.gpu_gres else (f"gpu:{gpus}" if gpus else None)
    )
    split = doctor.measured_split(job)
    measure = None
    if split is not None:
        measure = Measure(str(split), bounds.max_files, bounds.max_s, doctor.measure_threads(job))
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
        )
    except ClusterError as exc:
        return [
            *checks,
            Finding("error", "probe", f"the probe job was refused: {exc.message}", exc.hint or ""),
        ], None
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
    added += doctor.file_rate_checks(job, found.get("file_rate"), f"from {found.get('hostname', 'the node')}")
    return [*checks, *added], found


def print_table(checks: list[Finding], probe: dict | None) -> None:
    width = max((len(c.key) for c in checks), default=10)
    for check in checks:
        print(f"{MARKS[check.level]}  {check.key:<{width}}  {check.message}")
        if check.level != "ok" and check.fix:
            print(f"      {'':<{width}}  fix: {check.fix}")
    errors = sum(c.level == "error" for c in checks)
    warnings = sum(c.level == "warning" for c in checks)
    print(f"\n{errors} error(s), {warnings} warning(s)" + ("" if errors else ": nothing stops this job from running"))
