"""``hpctrain bench-data SPEC``: measure whether the data pipeline keeps the job's GPUs busy.

Runs here by default; ``--slurm`` runs the same measurement as a short
single-task job on a compute node of the spec's cluster (same partition,
cores per task and one of its GPUs) and prints its result. The measurement
and the node's side of the job are :mod:`hpctrain.diagnose.data_bench_job`, submitting it
:mod:`hpctrain.launch.bench_job`.
"""

from __future__ import annotations

import argparse
import json
import sys

from hpctrain.diagnose.data_bench import render_plain, render_rich
from hpctrain.diagnose.data_bench_job import BenchOptions, measure
from hpctrain.jobspec.load import load_job
from hpctrain.launch.bench_job import run_on_slurm


def run(args: argparse.Namespace) -> int:
    job = load_job(args.spec, args.overrides, cluster=args.cluster)
    options = BenchOptions(
        stage_dir=args.stage_dir,
        gpu=args.gpu,
        demand=args.demand,
        measure_gpu=args.measure_gpu,
        max_files=args.max_files,
        seconds=args.seconds,
    )
    if args.slurm:
        report = run_on_slurm(job.spec, job.profile, options, str(job.source), timeout_s=args.timeout)
    else:
        report = measure(job.spec, job.profile, options, str(job.source))
    if args.json:
        print(json.dumps(report.as_dict()))
    elif sys.stdout.isatty():
        render_rich(report)
    else:
        print(render_plain(report))
    return 0
