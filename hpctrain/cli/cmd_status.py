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
from hpctrain.observe.chain_view import chain_lines
from hpctrain.observe.live_view import rank_table
from hpctrain.observe.run_status import RECENT_KEYS, RunStatus, recent_rows, registry_runs, runs_under
from hpctrain.observe.status import COLUMNS, StudyStatus, point_cells, status

# a finished run that logged no step (a plain script): what would give it progress and curves
NO_STEPS = "no training step logged; a script logs them with hpctrain.task.log(step, loss=...) (docs/your-own-loop.md)"
RANK_TABLE_UP_TO = 8  # the plain status shows every rank's heartbeat up to this many ranks (or with --ranks)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "watch", False):
        return watch(args)
    if getattr(args, "sync", False):
        raise UsageError("--sync keeps a watched run's trackers up to date", hint="hpctrain status RUN --watch --sync")
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
    return watch(job_registry.resolve_run(args.run), interval_s=args.interval, show_ranks=args.ranks, sync=args.sync)


def print_run(found: RunStatus, *, as_json: bool, show_ranks: bool) -> int:
    facts, ranks = found.as_dict(), found.ranks
    if as_json:
        shown = {**facts, **({"ranks": [asdict(view) for view in ranks]} if show_ranks else {})}
        print(json.dumps(json_safe(shown), allow_nan=False))
        return 0
    for key, value in facts.items():
        if key == "chain":
            if value:  # after: the whole chain, this run marked
                print(f"{'chain':>20}:")
                print("\n".join(f"{'':>20}  {printable(line)}" for line in chain_lines(value, found.run_dir)))
        elif key == "failed_stderr" and isinstance(value, list) and value:  # a failed script's last lines
            print(f"{key:>20}: (last {len(value)} lines)")
            print("\n".join(f"{'':>20}  | {printable(line)}" for line in value))
        elif value not in (None, [], ""):
            print(f"{key:>20}: {value:.2f}" if isinstance(value, float) else f"{key:>20}: {printable(value)}")
    if found.global_step is None and found.finished:
        print(f"{'progress':>20}: {NO_STEPS}")
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
    elif args.all:
        runs = registry_runs()
    else:
        runs = registry_runs(under=Path.cwd())
    rows = recent_rows(runs)
    if args.json:
        print(json.dumps([dict(zip(RECENT_KEYS, row)) for row in rows]))
        return 0
    if not rows and args.output_dir:
        print(f"no runs under {args.output_dir} (runs are OUTPUT_DIR/NAME/RUN_ID)")
        return 0
    if not rows and not args.all and registry_runs(limit=1):
        print(f"no runs submitted from {Path.cwd()} or below; every run of this account: hpctrain status --all")
        return 0
    if not rows:
        print("no runs submitted from this account yet; start with: hpctrain submit jobs/quickstart.yaml")
        return 0
    where = "" if args.output_dir or args.all else f" submitted from {Path.cwd()} (--all: every run of this account)"
    table = Table(title=f"recent hpctrain runs{where}; hpctrain status RUN for details", title_justify="left")
    headers = ("job", "submitted", "status", "epochs", "val top-1", "run dir")
    for column in headers:
        table.add_column(column, no_wrap=True)
    cells = [[for_rich(cell) for cell in row] for row in rows]
    for row in cells:
        table.add_row(*row)
    # the run dir is what gets copied: never cut a cell (at 80 columns when piped), let a terminal wrap the line
    widths = [max(len(header), *(len(row[i]) for row in cells)) for i, header in enumerate(headers)]
    console = Console(file=sys.stdout)
    Console(file=sys.stdout, width=max(console.width, sum(widths) + 3 * len(widths) + 1)).print(table)
    return 0
