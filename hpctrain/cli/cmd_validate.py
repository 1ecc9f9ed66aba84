"""``hpctrain validate SPEC``: check a spec in well under a second, print a one-line summary."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.cli.main import warn
from hpctrain.errors import SpecError, SpecProblem
from hpctrain.jobspec.load import LoadedJob, load_job
from hpctrain.jobspec.node_loss import fewest_nodes_step_cost
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
        f"{spec.name} on {job.profile.name}: {spec.resources.nodes} node{'s' if spec.resources.nodes > 1 else ''} "
        f"x {per_node}, world size {spec.world_size}, "
    )
    if spec.entrypoint is None:
        layout = spec.batch_layout
        line += f"global batch {layout.global_batch} ({layout.describe()}), "
    line += f"{what}, time {spec.resources.time}"
    cost = fewest_nodes_step_cost(spec)
    if cost is not None:  # e.g. 16 -> 15 nodes of 4 GPUs: 1.09x, the ideal 1.07x
        fewest = spec.resources.fewest_nodes
        line += f"; after a lost node down to {fewest} node{'s' * (fewest > 1)} (a step then takes {cost:.2f}x)"
    if job.is_sweep:
        line += f", sweep of {len(job.trials)} trials"
    if job.is_study:
        line += f"; study of {len(job.points)} points, one job each"
    return line


def run(args: argparse.Namespace) -> int:
    job = load_job(args.spec, args.overrides, cluster=args.cluster)
    findings = image_findings(job)
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


def image_findings(job: LoadedJob) -> list[Finding]:
    """A data.root that names an image file is read (never mounted): a broken image fails here, not in the job."""
    from hpctrain.diagnose.preflight import check_data_root

    findings: list[Finding] = []
    for spec in job.trials:
        if spec.entrypoint is None and spec.data.root and Path(spec.data.root).expanduser().is_file():
            findings += [f for f in check_data_root(spec) if f not in findings]
    return findings
