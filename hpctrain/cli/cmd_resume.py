"""``hpctrain resume RUN``: continue a stopped, cancelled or failed run as a new job in the same run directory.

Thin: ``hpctrain.launch.resume`` refuses what must not resume (a study, a
sweep, an attempt that may still be writing, a reshape that breaks the global
batch) and submits the next attempt; ``launch.follow`` follows or waits.
"""

from __future__ import annotations

import argparse
import json
import sys

from hpctrain.cli.main import warn
from hpctrain.launch import follow, plan, resume


def run(args: argparse.Namespace) -> int:
    run_dir, job = resume.prepare(args.run, args.overrides)
    warn(plan.spec_warnings(job, run_dir))  # measured save times from this run's own checkpoints
    submitted = resume.start(run_dir, job, local=args.local)
    warn(submitted.notes)  # the bad-node ledger's exclusions
    if args.json:
        print(json.dumps({"job_id": submitted.job_id, "run_dir": str(run_dir), "cluster": submitted.backend}))
    else:
        print("\n".join(plan.submitted_lines(submitted, job.profile.name)))
    if submitted.backend == "local":
        return follow.follow_local(submitted, stream=sys.stderr if args.json else sys.stdout)
    return follow.wait_slurm(submitted, quiet=args.json) if args.wait else 0
