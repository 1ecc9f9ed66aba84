"""``hpctrain validate SPEC``: check a spec in well under a second, print a one-line summary."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.cli.main import warn
from hpctrain.errors import SpecError, SpecProblem
from hpctrain.jobspec.load import LoadedJob, load_job
from hpctrain.jobspec.node_loss import node_count_text
from hpctrain.launch.plan import spec_warnings

if TYPE_CHECKING:
    from hpctrain.diagnose.preflight import Finding


def describe(job: LoadedJob) -> str:
    """One line: where, how big, how much per step."""
    spec = job.spec
    gpus = spec.resources.gpus_per_node or 0
    per_node = f"{gpus} GPUs" if gpus else f"{spec.tasks_per_node} CPU task{'s' if spec.tasks_per_node > 1 else ''}"
    what = spec.entrypoint or f"{spec.trainer.arch} {spec.trainer.strategy} {spec.trainer.precision}"
    line = (
        f"{spec.name} on {job.profile.name}: {node_count_text(spec.resources)} "
        f"x {per_node}, world size {spec.world_size}, "
    )
    if spec.entrypoint is None:
        layout = spec.batch_layout
        line += f"global batch {layout.global_batch} ({layout.describe()}), "
    line += f"{what}, time {spec.resources.time}"
    if job.is_sweep:
        line += f", sweep of {len(job.trials)} trials"
    if job.is_study:
        line += f"; study of {len(job.points)} points, one job each"
    return line


def run(args: argparse.Namespace) -> int:
    job = load_job(args.spec, args.overrides, cluster=args.cluster)
    findings = file_findings(job)
    errors = [f for f in findings if f.level == "error"]
    if errors:
        raise SpecError(str(job.source), [SpecProblem(f.key, f.message) for f in errors])
    print(f"{args.spec}: OK - {describe(job)}")
    if job.is_study:
        from hpctrain.launch.study import describe_point

        for point in job.points:
            print(f"  {point.label}: {describe_point(point)}")
    warn(spec_warnings(job))
    for finding in findings:
        print(f"warning: {job.source}: {finding.key}: {finding.message}", file=sys.stderr)
    return 0


def file_findings(job: LoadedJob) -> list[Finding]:
    """What the files behind the spec say, read on this machine and never run: a data.root that names an
    image file (read, never mounted), and an entry point whose source cannot take ``ctx`` (read with
    ``ast``, never imported). Either fails here, not in the job."""
    images = [spec for spec in job.trials if spec.entrypoint is None and _names_file(spec.data.root)]
    entrypoints = [spec for spec in job.trials if spec.entrypoint is not None]
    if not images and not entrypoints:
        return []  # nothing to read: the common case does not load the checks
    from hpctrain.diagnose.preflight import check_data_root, check_entrypoint

    findings: list[Finding] = []
    for found in [*map(check_data_root, images), *map(check_entrypoint, entrypoints)]:
        findings += [f for f in found if f not in findings]
    return findings


def _names_file(root: str | None) -> bool:
    return bool(root) and Path(root).expanduser().is_file()
