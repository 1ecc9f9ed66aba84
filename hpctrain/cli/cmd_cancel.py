"""``hpctrain cancel RUN|JOB_ID|STUDY``: cancel a run so that nothing it started survives.

Thin: the cancel protocol (cancel marker, then ``scancel``, then the wait for
the run to settle) is ``hpctrain.launch.cancel``; this prints where the run
stands afterwards. A study's points are cancelled one by one, and one point's
trouble does not keep the others running.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hpctrain.cli.main import print_error
from hpctrain.contract import job_registry
from hpctrain.contract.runfiles import printable
from hpctrain.errors import HpctrainError
from hpctrain.launch import cancel
from hpctrain.launch.study import point_dir, read_study, study_dir_of


def run(args: argparse.Namespace) -> int:
    if (study_dir := study_dir_of(args.run)) is not None:
        return cancel_study(study_dir, args.timeout)
    return cancel_run(job_registry.resolve_run(args.run), args.timeout)


def cancel_run(run_dir: Path, timeout_s: float) -> int:
    """Cancel one run's job, wait until none of its processes is left, print where it stands."""
    done = cancel.cancel_run(run_dir, timeout_s)
    print(f"job {done.job_id}: {done.state}; run status: {done.status}")
    if not done.settled:
        print(
            f"warning: {done.limit_s:.0f} s after the cancel, some task of job {done.job_id} may still be writing; "
            f"check 'hpctrain status {run_dir}' before resuming"
        )
    if done.script is not None:
        print(f"the script keeps its own checkpoints; 'hpctrain resume {run_dir}' starts it again to resume from them")
    elif done.checkpoint_step is None:
        print(f"no checkpoint was written; 'hpctrain resume {run_dir}' starts it again from the beginning")
    else:
        print(f"last complete checkpoint: step {done.checkpoint_step}; 'hpctrain resume {run_dir}' continues from it")
    return 0


def cancel_study(study_dir: Path, timeout_s: float) -> int:
    """Cancel every submitted point through the per-run cancel (which waits until nothing is left)."""
    codes = []
    for point in read_study(study_dir)["points"]:
        if not point.get("job_id"):
            print(f"{printable(point.get('label'))}: never submitted")
            continue
        print(f"{printable(point.get('label'))}:")
        try:
            codes.append(cancel_run(point_dir(study_dir, point), timeout_s))
        except HpctrainError as exc:  # one point's trouble does not keep the others running
            print_error(exc)
            codes.append(exc.exit_code)
    return max(codes, default=0)
