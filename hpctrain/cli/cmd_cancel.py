"""``hpctrain cancel RUN|JOB_ID|STUDY``: cancel a run so that nothing it started survives.

A printer over ``hpctrain.launch.cancel`` (``hpctrain.cancel`` calls the same
policy and protocol): it prints where each run stands afterwards. A run that
had already ended is said so, nothing is written or signalled, and the exit
code is 0: what cancel asks for holds. A study's points are cancelled one by
one; one point's trouble is printed and does not keep the others running.
"""

from __future__ import annotations

import argparse
import json

from hpctrain.cli.main import print_error
from hpctrain.contract.runfiles import printable
from hpctrain.launch.cancel import Cancelled, cancel, cancelled_json


def run(args: argparse.Namespace) -> int:
    done = cancel(args.run, args.timeout)
    if getattr(args, "json", False):  # one JSON document: a run's Cancelled, or a study's points
        if isinstance(done, Cancelled):
            print(json.dumps(cancelled_json(done)))
            return 0
        points = [
            {"label": p.label, "run_dir": str(p.run_dir), "result": p.result and cancelled_json(p.result),
             "error": p.error and {"message": p.error.message, "hint": p.error.hint}}
            for p in done.points
        ]  # fmt: skip
        print(json.dumps({"study_dir": str(done.study_dir), "points": points}))
        error = done.error()
        return 0 if error is None else error.exit_code
    if isinstance(done, Cancelled):
        print_cancelled(done)
        return 0
    for point in done.points:
        if point.result is None and point.error is None:
            print(f"{printable(point.label)}: never submitted")
            continue
        print(f"{printable(point.label)}:")
        if point.error is not None:  # one point's trouble does not keep the others running
            print_error(point.error)
        elif point.result is not None:
            print_cancelled(point.result)
    error = done.error()
    return 0 if error is None else error.exit_code


def print_cancelled(done: Cancelled) -> None:
    """Where one run stands once cancel is done with it."""
    run_dir = done.run_dir
    for dependent in done.dependents:
        print(f"cancelled with its chain: {printable(str(dependent))}")
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
