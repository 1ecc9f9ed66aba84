"""``hpctrain report RUN_OR_STUDY... [--out DIR] [--baseline hal] [--json]``: plots and tables from runs.

Thin: hpctrain.observe.report does the work. Runs on a login node (no torch).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hpctrain.contract.runfiles import json_safe, printable
from hpctrain.observe.report.build import as_json, make_report


def run(args: argparse.Namespace) -> int:
    written = make_report([Path(p) for p in args.runs], Path(args.out) if args.out else None, args.baseline)
    if args.json:
        print(json.dumps(json_safe(as_json(written)), indent=2, default=str, allow_nan=False))
    else:
        for note in written.report.notes:
            print(f"note: {printable(note)}", file=sys.stderr)
        for run_data in written.report.runs:
            for note in run_data.notes:
                print(f"note: {printable(run_data.label)}: {printable(note)}", file=sys.stderr)
        print(f"report: {written.out_dir / 'report.html'}")
        print(f"        {written.out_dir / 'report.md'} ({len(written.files) - 2} images)")
    return 0
