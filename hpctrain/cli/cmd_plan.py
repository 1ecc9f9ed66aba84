"""``hpctrain plan SPEC [--nodes 1,2,4,8] [--measure [STEPS]] [--json]``: when each shape would start and finish,
and the pick.

A printer over ``hpctrain.planning.plan`` (``hpctrain.plan`` calls the same).
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from hpctrain.contract.runfiles import for_rich, json_safe
from hpctrain.planning.plan import COLUMNS, parse_shapes, plan, shape_cells
from hpctrain.planning.timeline import duration


def run(args: argparse.Namespace) -> int:
    if args.measure is not None:  # the measurement runs through the one submit sequence
        from hpctrain.launch.submit import submit
    else:
        submit = None
    found = plan(
        args.spec,
        nodes=parse_shapes(args.nodes) if args.nodes is not None else None,
        overrides=args.overrides,
        cluster=args.cluster,
        steps=args.steps,
        samples_per_epoch=args.samples_per_epoch,
        step_time_s=args.step_time,
        step_time_nodes=args.step_time_nodes,
        margin=args.margin,
        restart_s=args.restart,
        measure_steps=args.measure,
        submit=submit,
    )
    if args.json:
        print(json.dumps(json_safe(found.as_json()), allow_nan=False))
        return 0
    where = f"partition {found.partition.name}" if found.partition else "partition unknown"
    table = Table(
        title=for_rich(
            f"plan for {found.name} ({where}; chunks of {duration(found.limit_s)}: {found.limit_source}; "
            f"work: {found.work.source})"
        ),
        title_justify="left",
    )
    for column in COLUMNS:
        table.add_column(column)
    for shape in found.shapes:
        table.add_row(*(for_rich(cell) for cell in shape_cells(shape)))
    console = Console(file=sys.stdout, width=200)
    console.print(table)
    pick = f"ask for {found.choice.nodes} node(s)" if found.choice.nodes is not None else "no recommendation"
    console.print(for_rich(f"recommended: {pick}: {found.choice.reason}"))
    for note in found.notes:
        console.print(for_rich(f"note: {note}"))
    return 0
