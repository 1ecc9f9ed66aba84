"""``hpctrain report RUN_OR_STUDY... [--out DIR] [--baseline hal] [--json]``: plots and tables from runs.

A printer over ``hpctrain.observe.report.build``'s report sequence (``hpctrain.report``
calls the same). Runs on a login node (no torch).
"""

from __future__ import annotations

import argparse
import json
import sys

from hpctrain.contract.runfiles import json_safe, printable
from hpctrain.observe.report.build import report


def run(args: argparse.Namespace) -> int:
    written = report(args.runs, args.out, args.baseline)
    if args.json:
        print(json.dumps(json_safe(written.as_json()), indent=2, default=str, allow_nan=False))
        return 0
    for note in written.notes:
        print(f"note: {printable(note)}", file=sys.stderr)
    for run_data in written.runs:
        for note in run_data.get("notes") or []:
            print(f"note: {printable(run_data.get('label'))}: {printable(note)}", file=sys.stderr)
    print(f"report: {written.html}")
    print(f"        {written.markdown} ({len(written.files) - 2} images)")
    return 0
