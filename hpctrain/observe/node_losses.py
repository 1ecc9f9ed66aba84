"""One line about the nodes a healing run lost (summary.json's ``node_failures``), for status, watch and report.

The records come from a run directory, so they are untrusted: anything that
is not a record (an object naming its node) is skipped, a field of the wrong
type is left out of its line, only the last few are shown, and the text is
made printable. Torch-free.
"""

from __future__ import annotations

from typing import Any

from hpctrain.contract.runfiles import printable

SHOWN = 5  # the last records shown; older ones are counted


def node_loss_text(failures: Any) -> str | None:
    """``n2 at step 412 (rank 3 exited 137): continue on n1,n3`` for each lost node, or None without any."""
    if not isinstance(failures, list):
        return None
    records = [f for f in failures if isinstance(f, dict) and isinstance(f.get("node"), str) and f["node"]]
    if not records:
        return None
    parts = [_one(record) for record in records[-SHOWN:]]
    older = len(records) - SHOWN
    return printable(("; ".join(parts)) + (f" (and {older} earlier)" if older > 0 else ""))


def _one(record: dict[str, Any]) -> str:
    nodes = record.get("nodes")
    where = f" on {','.join(str(n) for n in nodes[:64])}" if isinstance(nodes, list) and nodes else ""
    step = record.get("step")
    at = f" at step {step}" if isinstance(step, int) and not isinstance(step, bool) else ""
    reason, action = record.get("reason"), record.get("action")
    why = f" ({reason})" if isinstance(reason, str) and reason else ""
    then = f": {action}" if isinstance(action, str) and action else ""
    return f"{record['node']}{at}{why}{then}{where}"
