"""``hpctrain sync RUN|STUDY [--follow]``: send a run's new metrics to its W&B and MLflow runs.

A printer over ``hpctrain.tracking.sync`` (``hpctrain.sync`` calls the same
sequence): one line per run and tracker as each is done, and a non-zero exit
when any tracker could not be reached (what it acknowledged before is kept;
running the verb again sends the rest, nothing twice).
"""

from __future__ import annotations

import argparse
import json

from hpctrain.cli.main import print_error
from hpctrain.contract.runfiles import printable
from hpctrain.tracking.sync import Synced, resolve_target, sync


def run(args: argparse.Namespace) -> int:
    target = resolve_target(args.run)
    printer = None if args.json else print_synced
    results = sync(target, follow=args.follow, interval_s=args.interval, ended=args.ended, on_result=printer)
    if args.json:
        print(json.dumps([as_json(result) for result in results], indent=2))
    return max((result.error.exit_code for result in results if result.error is not None), default=0)


def print_synced(result: Synced) -> None:
    where = f"{printable(result.run_dir)}" + (f" -> {printable(result.where)}" if result.tracker != "-" else "")
    if result.error is not None:
        sent = f"sent {result.sent} step(s), through step {result.through}, then " if result.sent else ""
        print(f"{where}: {sent}not synced")
        print_error(result.error)
        return
    through = f"through step {result.through}" if result.through >= 0 else "no step yet"
    end = f", run {result.final}" if result.final else ""
    print(f"{where}: sent {result.sent} step(s), {through}{end} (run {printable(result.run_ref or '-')})")
    if result.waiting:
        print(f"  {printable(result.waiting)}")


def as_json(result: Synced) -> dict[str, object]:
    return {
        "run_dir": str(result.run_dir),
        "tracker": result.tracker,
        "where": result.where,
        "run_ref": result.run_ref,
        "sent": result.sent,
        "through": result.through,
        "last_step": result.last_step,
        "final": result.final,
        "waiting": result.waiting,
        "error": None if result.error is None else result.error.message,
    }
