"""``hpctrain validate SPEC``: check a spec in well under a second, print a one-line summary.

A printer over ``hpctrain.launch.plan``'s validate sequence (``hpctrain.load_job``
runs the same checks).
"""

from __future__ import annotations

import argparse

from hpctrain.cli.main import warn
from hpctrain.launch.plan import validate


def run(args: argparse.Namespace) -> int:
    checked = validate(args.spec, args.overrides, cluster=args.cluster)
    print(f"{args.spec}: OK - {checked.summary}")
    for line in checked.points:
        print(f"  {line}")
    warn(checked.warnings)
    return 0
