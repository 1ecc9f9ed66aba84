"""A run's chain as ``status`` shows it (``after:``, docs/chains.md): from its first run down, one row per run.

The chain is read from the run directories' links (``contract/chain_links.py``):
up from the run asked about to the run with no upstream, then every
dependent below it, depth first. Each row is that run's status by the one
rule (``observe/run_status.py``) and, for a run the chain ended without
running it, the reason. Bounded (``MAX_CHAIN`` runs) and cycle-safe, since
the records may have been edited by hand. Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.contract.chain_links import MAX_CHAIN, dependents_of, read_chain_end, upstream_link
from hpctrain.contract.slurm import Slurm
from hpctrain.errors import HpctrainError
from hpctrain.observe.run_status import run_status


def first_run(run_dir: Path) -> Path:
    """The chain's first run: up the upstream links from ``run_dir`` (stops at a cycle or after ``MAX_CHAIN``)."""
    seen = [Path(run_dir)]
    link = upstream_link(Path(run_dir))
    while link is not None and link.upstream not in seen and len(seen) <= MAX_CHAIN:
        seen.append(link.upstream)
        link = upstream_link(link.upstream)
    return seen[-1]


def chain_rows(run_dir: Path, *, slurm: Slurm | None = None) -> list[dict[str, Any]]:
    """Every run of ``run_dir``'s chain, first run first: ``{run_dir, depth, when, job_id, status, reason}``;
    empty for a run that is in no chain."""
    root = first_run(run_dir)
    if root == Path(run_dir) and not dependents_of(root):
        return []
    slurm = slurm or Slurm()
    rows: list[dict[str, Any]] = []
    stack: list[tuple[Path, int, str | None]] = [(root, 0, None)]
    seen: set[Path] = set()
    while stack and len(rows) < MAX_CHAIN:
        one, depth, when = stack.pop()
        if one in seen:
            continue
        seen.add(one)
        rows.append(_row(one, depth, when, slurm))
        stack += [(link.run_dir, depth + 1, link.when) for link in reversed(dependents_of(one))]
    return rows


def _row(run_dir: Path, depth: int, when: str | None, slurm: Slurm) -> dict[str, Any]:
    try:
        facts = run_status(run_dir, slurm=slurm)
        job_id, status = facts.get("job_id"), facts.get("status") or facts.get("slurm_state")
    except HpctrainError as exc:
        job_id, status = None, f"unreadable ({exc.message})"
    ended = read_chain_end(run_dir)
    reason = ended["reason"] if ended is not None else None
    if reason is not None:
        status = "ended by its chain" if ended.get("kind") == "end" else "waiting for its upstream's resume"
    elif status == "pending" and when is not None:
        status = f"pending (after: {when})"
    return {"run_dir": str(run_dir), "depth": depth, "when": when, "job_id": job_id, "status": status, "reason": reason}


def chain_lines(rows: list[dict[str, Any]], here: str) -> list[str]:
    """The rows as ``status`` prints them, indented by depth; ``here`` marks the run asked about."""
    lines = []
    for row in rows:
        mark = "*" if row["run_dir"] == here else " "
        arrow = f"after {row['when']}: " if row["when"] else ""
        lines.append(f"{mark} {'  ' * row['depth']}{arrow}{row['run_dir']} (job {row['job_id']}): {row['status']}")
        if row["reason"]:
            lines.append(f"  {'  ' * row['depth']}  {row['reason']}")
    return lines
