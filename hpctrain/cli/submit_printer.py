"""What ``hpctrain submit`` and ``hpctrain resume`` print while their sequence goes, and their exit code.

Both verbs run a library sequence (``launch/submit.py``, ``launch/resume.py``)
that tells its :class:`~hpctrain.launch.submit.Steps` what happens; this is
the command line's way of hearing it. ``--json``: one JSON line on stdout,
a followed local run's log and every note on stderr. Every line goes out
through :func:`say`: it quotes folder names and spec values, which reach the
terminal escaped (``hpctrain.errors.printable``), never raw.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from hpctrain.cli.main import warn
from hpctrain.contract.slurm_states import succeeded
from hpctrain.errors import printable
from hpctrain.launch.submit import Steps, Submission


def say(text: str, **kwargs: object) -> None:
    """``print`` of a line that quotes user text: control, bidi and line-separator characters escaped."""
    print(printable(text, keep="\n"), **kwargs)  # type: ignore[call-overload]


class Printed(Steps):
    """Each step of a submit (or resume), printed as it comes; ``--json``: one JSON line, the rest on stderr."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.as_json = bool(args.json)
        self.log = sys.stderr if self.as_json else sys.stdout

    def warned(self, warnings: Sequence[str]) -> None:
        warn(warnings)

    def submitted(self, submission: Submission) -> None:
        if self.as_json:
            print(json.dumps(submission.as_json()), flush=True)
        elif submission.points and submission.backend == "slurm":
            study = submission.run_dir
            say(f"submitted study {study.name}: {len(submission.points)} jobs")
            for point in submission.points:
                say(f"  {point.label:<24} job {point.job_id:<10} world size {point.world_size}")
            say(f"  study dir: {study}")
            say(f"  status:    hpctrain status {study}")
            say(f"  cancel:    hpctrain cancel {study}")
        elif not submission.points:
            say("\n".join(submitted_lines(submission)), flush=True)

    def following(self, label: str, world_size: int) -> None:
        say(f"# study point {label} (world size {world_size})", file=self.log, flush=True)

    def ended(self, submission: Submission) -> None:
        if not self.as_json:
            say(f"job {submission.job_id} ended: {submission.state}")
            if submission.run_completed and not succeeded(submission.state or ""):
                say(
                    f"the run completed; Slurm ended the job {submission.state} "
                    "(a preemption reached it in its last seconds)"
                )
        if submission.ended_well is False:
            say(
                f"error: job {submission.job_id} ended {submission.state}; "
                f"see hpctrain logs {submission.run_dir} --err",
                file=sys.stderr,
            )


def submitted_lines(submission: Submission) -> list[str]:
    """Where a submitted run is, and (on Slurm) how to follow, inspect and cancel it."""
    where = "Slurm" if submission.backend == "slurm" else "this machine (local executor)"
    run_dir = submission.run_dir
    lines = [f"submitted job {submission.job_id} to {where}, cluster '{submission.cluster}'", f"  run dir: {run_dir}"]
    if submission.code is not None:
        from hpctrain.launch.plan import code_line

        lines.append(f"  code:    {code_line(submission.code)}")
    if submission.forecast is not None:
        lines += submission.forecast.lines()
    if submission.backend == "slurm":
        lines += [
            f"  follow:  hpctrain logs {run_dir} --follow",
            f"  status:  hpctrain status {run_dir}",
            f"  cancel:  hpctrain cancel {run_dir}",
        ]
    return lines


def exit_code(submission: Submission) -> int:
    """0 unless what was waited for (a followed local run, a waited-for Slurm job) ended badly."""
    return 1 if submission.ended_well is False else 0
