"""``hpctrain submit SPEC``: validate, then submit to Slurm, or run here with ``--local``.

A printer over ``hpctrain.launch.submit``'s one sequence (the Python API's
``hpctrain.submit`` calls the same): it prints each step as the sequence
hears it -- warnings, the submitted job (or study), each local study point,
how a waited-for job ended -- and exits with how the run ended. ``--dry-run``
prints the exact sbatch script (rendered by the same executor a real submit
uses) and what each rank will see, and touches neither Slurm nor the output
directory. A local run is followed in the foreground: it ends with this process.
"""

from __future__ import annotations

import argparse

from hpctrain.cli.submit_printer import Printed, exit_code
from hpctrain.errors import printable
from hpctrain.launch.submit import submit


def run(args: argparse.Namespace) -> int:
    done = submit(
        args.spec,
        overrides=[
            *args.overrides,
            *([f"resources.time_min={args.time_min}"] if args.time_min else []),
        ],
        cluster=args.cluster,
        dry_run=args.dry_run,
        local=args.local,
        wait=args.wait,
        follow_local=True,
        preflight=not args.no_preflight,
        snapshot=not args.no_snapshot,
        exclude_bad_nodes=not args.no_exclude,
        steps=Printed(args),
        after=args.after,
    )
    if args.dry_run:  # the plan quotes spec values and folder names: nothing in it reaches the terminal raw
        print(printable(done.plan, keep="\n\t"), end="")
    return exit_code(done)
