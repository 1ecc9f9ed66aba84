"""``hpctrain resume RUN``: continue a stopped, cancelled or failed run as a new job in the same run directory.

A printer over ``hpctrain.launch.resume``'s one sequence (``hpctrain.resume``
calls the same): it refuses what must not resume (a study, a sweep, an
attempt that may still be writing, a reshape that breaks the global batch),
submits the next attempt and follows or waits for it; this prints each step
as ``hpctrain submit`` does.
"""

from __future__ import annotations

import argparse

from hpctrain.cli.submit_printer import Printed, exit_code
from hpctrain.launch.resume import resume


def run(args: argparse.Namespace) -> int:
    done = resume(args.run, args.overrides, local=args.local, wait=args.wait, follow_local=True, steps=Printed(args))
    return exit_code(done)
