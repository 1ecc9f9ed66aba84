"""``hpctrain status [RUN]``: Slurm state plus training progress from summary.json.

A printer over ``hpctrain.observe.status`` (``hpctrain.status`` calls the
same): one run's status and its ranks, or a study's points; without RUN, the
recent runs (``observe.run_status``); ``--watch``: ``observe.watch``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hpctrain.contract import job_registry
from hpctrain.contract.runfiles import for_rich, json_safe, printable
from hpctrain.contract.study_file import study_dir_of
from hpctrain.errors import RunDirError, UsageError
from hpctrain.observe.live_view import rank_table
from hpctrain.observe.run_status import RECENT_KEYS, RunStatus, recent_rows, registry_runs, runs_under
from hpctrain.observe.status import COLUMNS, StudyStatus, point_cells, status

RANK_TABLE_UP_TO = 8  # the plain status shows every rank's heartbeat up to this many ranks (or with --ranks)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "watch", False):
        return watch(args)
    if not args.run:
        return list_recent(args)
    found = status(args.run)
    if isinstance(found, StudyStatus):
        return print_study(found, as_json=args.json)
    return print_run(found, as_json=args.json, show_ranks=args.ranks)


def watch(args: argparse.Namespace) -> int:
    """``--watch``: one run, followed until its job ends (``observe/watch.py``)."""
    from hpctrain.observe.watch import watch

    if (study_dir := study_dir_of(args.run)) is not None:
        raise UsageError("--watch follows one run", hint=f"watch one point: hpctrain status {study_dir}/POINT --watch")
    if not args.run:
        raise UsageError("--watch follows one run", hint="hpctrain status RUN --watch (RUN: run dir or job id)")
    return watch(job_registry.resolve_run(args.run), interval_s=args.interval, show_ranks=args.ranks)


def print_run(found: RunStatus, *, as_json: bool, show_ranks: bool) -> int:
    facts, ranks = found.as_dict(), found.ranks
    if as_json:
        shown = {**facts, **({"ranks": [asdict(view) for view in ranks]} if show_ranks else {})}
        print(json.dumps(json_safe(shown), allow_nan=False))
        return 0
    for key, value in facts.items():
        if key == "failed_stderr" and isinstance(value, list) and value:  # a failed script's last lines
            print(f"{key:>20}: (last {len(value)} lines)")
            print("\n".join(f"{'':>20}  | {printable(line)}" for line in value))
        elif value not in (None, [], ""):
            print(f"{key:>20}: {value:.2f}" if isinstance(value, float) else f"{key:>20}: {printable(value)}")
    if ranks and (show_ranks or len(ranks) <= RANK_TABLE_UP_TO):
        Console(file=sys.stdout).print(rank_table(ranks, limit=len(ranks)))
    elif ranks:
        print(f"{'ranks':>20}: {len(ranks)} wrote heartbeats (--ranks shows each)")
    return 0


def print_study(study: StudyStatus, *, as_json: bool) -> int:
    if as_json:
        print(json.dumps(json_safe(study.as_dict()), allow_nan=False))
        return 0
    table = Table(
        title=for_rich(f"study {study.name} {study.study_dir} (each point's run dir is STUDY_DIR/POINT)"),
        title_justify="left",
    )
    for column in COLUMNS:
        table.add_column(column)
    for row in study.points:
        table.add_row(*(for_rich(cell) for cell in point_cells(row)))
    Console(file=sys.stdout, width=200).print(table)
    return 0


def list_recent(args: argparse.Namespace) -> int:
    if args.output_dir:
        output_dir = Path(args.output_dir).expanduser()
        if not output_dir.is_dir():
            raise RunDirError(f"--output-dir {args.output_dir}: no such directory")
        runs = runs_under(output_dir)
    else:
        runs = registry_runs()
    rows = recent_rows(runs)
    if args.json:
        print(json.dumps([dict(zip(RECENT_KEYS, row)) for row in rows]))
        return 0
    if not rows and args.output_dir:
        print(f"no runs under {args.output_dir} (runs are OUTPUT_DIR/NAME/RUN_ID)")
        return 0
    if not rows:
        print("no runs submitted from this account yet; start with: hpctrain submit jobs/quickstart.yaml")
        return 0
    table = Table(title="recent hpctrain runs (hpctrain status RUN for details)", title_justify="left")
    for column in ("job", "submitted", "status", "epochs", "val top-1", "run dir"):
        table.add_column(column)
    for row in rows:
        table.add_row(*(for_rich(cell) for cell in row))
    Console(file=sys.stdout).print(table)
    return 0
