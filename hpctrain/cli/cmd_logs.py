"""``hpctrain logs RUN``: print or follow one task's stdout/stderr of a run's latest job.

Thin: ``hpctrain.observe.logs`` finds, tails and follows the log. It is
looked for inside the run directory only: run.json's ``submitit_dir`` is
followed when it lies there, and no symlink is followed out of it.
"""

from __future__ import annotations

import argparse
import sys

from hpctrain.contract import job_registry
from hpctrain.contract.rundir import read_run_info, run_home, submitit_dir_ignored, task_log_path
from hpctrain.contract.runfiles import printable
from hpctrain.errors import RunDirError
from hpctrain.observe import logs


def run(args: argparse.Namespace) -> int:
    run_dir = job_registry.resolve_run(args.run)
    info = read_run_info(run_dir)
    path = task_log_path(run_dir, info, args.rank, err=args.err)
    logs.check_rank(args.rank, info)
    ignored = submitit_dir_ignored(run_dir, info)
    if ignored is not None:
        print(
            f"note: run.json's submitit_dir {printable(ignored)} is outside this run directory; "
            f"reading {path.parent} instead",
            file=sys.stderr,
        )
    if not path.exists() and not args.follow:
        raise RunDirError(f"no log yet at {path}", hint="the job may still be pending: hpctrain status " + args.run)
    offset = logs.write_tail(path, args.lines, sys.stdout, within=run_home(run_dir))
    if args.follow:
        logs.follow(path, offset, run_dir, info, sys.stdout)
    return 0
