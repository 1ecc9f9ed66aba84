"""``hpctrain nodes``: the nodes your runs found sick or lost, and ``--forget NODE``.

A printer over ``hpctrain.observe.node_ledger``'s sequence (the Python API's
``hpctrain.nodes`` and ``hpctrain.forget_node`` call the same).
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from hpctrain.cli.main import warn
from hpctrain.contract.runfiles import for_rich, printable
from hpctrain.observe.node_ledger import COLUMNS, forget_node, nodes, row_cells


def run(args: argparse.Namespace) -> int:
    if args.forget:
        removed = forget_node(args.forget, cluster=args.cluster)
        where = f" on cluster {args.cluster}" if args.cluster else ""
        print(f"forgot {removed} entr{'y' if removed == 1 else 'ies'} of {printable(args.forget)}{where}")
        return 0
    ledger = nodes(cluster=args.cluster, include_expired=args.all)
    warn(ledger.warnings)
    rows = ledger.rows
    if args.json:
        print(json.dumps(ledger.as_json(), allow_nan=False))
        return 0
    if not rows:
        print(f"no {'' if args.all else 'live '}entries in {ledger.path}: submit excludes no node")
        return 0
    table = Table(
        title=for_rich(f"bad-node ledger {ledger.path} (submit excludes the live ones; --forget NODE)"),
        title_justify="left",
    )
    for column in COLUMNS:
        table.add_column(column)
    for row in rows:
        table.add_row(*(for_rich(cell) for cell in row_cells(row)))
    Console(file=sys.stdout, width=220).print(table)
    return 0
