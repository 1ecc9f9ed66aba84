"""The nodes verb's sequence (``hpctrain nodes``, ``hpctrain.nodes``, ``hpctrain.forget_node``): the user's
bad-node ledger, with the evidence an administrator can act on, and forgetting a node.

The entries come from ``contract/bad_nodes.py`` (read bounded and tolerant);
each becomes one row: node, cluster, why (the kind and the reason), the
numbers behind it (burn-in scores, compute times, the step it was lost at),
the run and job, when, and until when ``submit`` excludes it. Text from the
file is made printable. The CLI prints a :class:`NodeLedger` (``--json``:
:meth:`NodeLedger.as_json`), the Python API returns it. Torch-free.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.contract import bad_nodes
from hpctrain.contract.runfiles import json_safe, printable

COLUMNS = ("node", "cluster", "kind", "reason", "evidence", "run / job", "when", "excluded until")


@dataclass(frozen=True)
class NodeLedger:
    """The ledger as ``hpctrain nodes`` shows it: where it lies, one row per entry (newest last; only the
    live ones unless ``include_expired``), and what could not be read (``warnings``, never fatal)."""

    path: Path
    rows: tuple[dict[str, Any], ...]
    warnings: tuple[str, ...]
    include_expired: bool = False

    def as_json(self) -> list[dict[str, Any]]:
        """What ``hpctrain nodes --json`` prints."""
        return [dict(row) for row in self.rows]


def nodes(*, cluster: str | None = None, include_expired: bool = False, path: Path | None = None) -> NodeLedger:
    """The user's bad-node ledger (``path``: another ledger file), on ``cluster`` only when given."""
    ledger = bad_nodes.read_ledger(path)
    rows = ledger_rows(ledger, cluster=cluster, include_expired=include_expired)
    return NodeLedger(ledger.path, tuple(rows), tuple(ledger.warnings), include_expired)


def forget_node(node: str, *, cluster: str | None = None, path: Path | None = None) -> int:
    """Remove every entry of ``node`` (on ``cluster``, when given) from the ledger; how many were removed.
    An unreadable ledger is a ``RunDirError`` that says how to start a new one."""
    return bad_nodes.forget(node, path, cluster=cluster)


def ledger_rows(
    ledger: bad_nodes.Ledger, *, cluster: str | None = None, include_expired: bool = False, now: float | None = None
) -> list[dict[str, Any]]:
    """One dict per entry (newest last): the entry's fields, plus ``live``."""
    moment = time.time() if now is None else now
    rows = []
    for entry in ledger.entries:
        if cluster is not None and entry.cluster != cluster:
            continue
        if not include_expired and not entry.live(moment):
            continue
        rows.append({**json_safe(entry.model_dump(mode="json")), "live": entry.live(moment)})
    return rows


def evidence_text(evidence: Any) -> str:
    """``compute_ms=412, allreduce_mb_s=310, step=40`` from an entry's evidence (numbers and short words)."""
    if not isinstance(evidence, dict):
        return ""
    parts = []
    for key, value in list(evidence.items())[:12]:
        if value in (None, [], {}, ""):
            continue
        if isinstance(value, float):
            value = f"{value:.4g}"
        elif isinstance(value, list):
            value = "; ".join(str(v) for v in value[:4])
        parts.append(f"{key}={value}")
    return printable(", ".join(parts))[:300]


def _when(stamp: Any) -> str:
    if not isinstance(stamp, (int, float)) or stamp <= 0:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))


def row_cells(row: dict[str, Any]) -> list[str]:
    """The table cells of one row, in :data:`COLUMNS` order, printable."""
    run = f"{row.get('run') or '?'} / {row.get('job_id') or '?'}"
    until = _when(row.get("expires")) + ("" if row.get("live") else " (expired)")
    cells = [row.get("node"), row.get("cluster") or "?", row.get("kind") or "?", row.get("reason") or ""]
    return [printable(c)[:200] for c in cells] + [
        evidence_text(row.get("evidence")),
        printable(run),
        _when(row.get("time")),
        until,
    ]
