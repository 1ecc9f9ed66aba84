"""``hpctrain resume RUN``: continue a stopped, cancelled or failed run as a new
job in the same run directory; training resumes from its latest valid checkpoint."""

from __future__ import annotations

import argparse
import json
import sys

from hpctrain import job_registry
from hpctrain.cli.cmd_submit import follow_local, print_submitted, wait_slurm
from hpctrain.cli.cmd_validate import print_warnings
from hpctrain.errors import UsageError
from hpctrain.rundir import SPEC_FILE, read_run_info
from hpctrain.runtime.stop import clear_cancel_marker
from hpctrain.slurm import TERMINAL_STATES, job_state
from hpctrain.spec.load import load_job
from hpctrain.submission import resubmit


def run(args: argparse.Namespace) -> int:
    run_dir = job_registry.resolve_run(args.run)
    info = read_run_info(run_dir)
    if info.get("trials"):
        raise UsageError(f"{run_dir} is a sweep", hint=f"resume one trial: hpctrain resume {run_dir}/trial-NNN")
    if info.get("backend") == "slurm" and not args.local:
        state = job_state(str(info["job_id"]))
        if state not in TERMINAL_STATES:
            raise UsageError(
                f"job {info['job_id']} of this run is still {state}",
                hint=f"it resumes by itself; cancel it first with 'hpctrain cancel {run_dir}'",
            )
    job = load_job(run_dir / SPEC_FILE)
    print_warnings(job, run_dir)  # measured save times from this run's own checkpoints
    clear_cancel_marker(run_dir)
    submitted = resubmit(run_dir, job, local=args.local)
    if args.json:
        print(json.dumps({"job_id": submitted.job_id, "run_dir": str(run_dir), "cluster": submitted.backend}))
    else:
        print_submitted(submitted, job)
    if submitted.backend == "local":
        return follow_local(submitted, stream=sys.stderr if args.json else sys.stdout)
    return wait_slurm(submitted, quiet=args.json) if args.wait else 0
