"""``hpctrain doctor [SPEC] [--probe] [--json]``: one table of checks, each ok / warning / error with its fix.

A printer over ``hpctrain.diagnose.doctor.doctor_spec`` (``hpctrain.doctor``
calls the same door, which loads the spec). Exit 0 when no check is an error, 1 otherwise. Torch-free
(login nodes).
"""

from __future__ import annotations

import argparse
import json

from hpctrain.diagnose import doctor, path_checks
from hpctrain.diagnose.findings import Finding

MARKS = {"ok": "ok  ", "warning": "warn", "error": "FAIL"}


def run(args: argparse.Namespace) -> int:
    bounds = path_checks.MeasureBounds(max_files=args.measure_files, max_s=args.measure_seconds)
    found = doctor.doctor_spec(
        args.spec or None,
        args.overrides,
        cluster=args.cluster,
        probe=args.probe,
        probe_timeout_s=args.probe_timeout,
        bounds=bounds,
    )
    if args.json:
        print(json.dumps(found.as_json(), indent=2))
    else:
        print_table(list(found.checks))
    return 0 if found.ok else 1


def print_table(checks: list[Finding]) -> None:
    width = max((len(c.key) for c in checks), default=10)
    for check in checks:
        print(f"{MARKS[check.level]}  {check.key:<{width}}  {check.message}")
        if check.level != "ok" and check.fix:
            print(f"      {'':<{width}}  fix: {check.fix}")
    errors = sum(c.level == "error" for c in checks)
    warnings = sum(c.level == "warning" for c in checks)
    print(f"\n{errors} error(s), {warnings} warning(s)" + ("" if errors else ": nothing stops this job from running"))
