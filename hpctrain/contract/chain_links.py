"""The links of a chain in the run directories (``after:``, docs/chains.md): both sides read them here.

A dependent's ``run.json`` names its upstream (``after: {run_dir, when}``);
the upstream lists its dependents, one small file each under
``.hpctrain/dependents/`` (written by whoever submits the dependent: no
shared file to lock), so that a ``resume`` of the upstream finds whom to
re-point. A dependent that the chain ended without running it says why in
``.hpctrain/chain-ended.json``; ``status`` shows it, and the upstream's
next ``resume`` submits such dependents again.

:func:`chain_decision` is the one decider: given the condition and how the upstream
ended, start, end, or wait for the upstream's resume. Every read of another
run's directory is bounded, of regular files only, and never follows a
symlink out of that run: an upstream may belong to someone else.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hpctrain.contract.cancel_marker import cancel_marker_paths
from hpctrain.contract.checkpoint_listing import latest_checkpoint
from hpctrain.contract.rundir import (
    CONTROL_DIR,
    chain_end_path,
    checkpoints_dir,
    dependents_dir,
    read_json_object,
    run_home,
    run_info_path,
    write_json_atomic,
)
from hpctrain.contract.summary import read_summary

AFTER_KEY = "after"  # run.json's record of the upstream
MAX_DEPENDENTS = 256  # files read from one upstream's dependents folder
MAX_CHAIN = 64  # runs walked up or down one chain
Outcome = Literal["completed", "failed", "cancelled", "stopped", "running"]
Decision = Literal["start", "end", "wait"]
SUMMARY_VALUES = ("global_step", "epochs_completed", "val_top1", "best_val_top1", "val_loss", "train_loss")


@dataclass(frozen=True)
class Link:
    """One edge of a chain: ``run_dir`` starts after ``upstream`` has ``when``."""

    run_dir: Path
    upstream: Path
    when: str

    def as_json(self) -> dict[str, str]:
        return {"run_dir": str(self.upstream), "when": self.when}


def link_of(run_dir: Path, info: dict[str, Any]) -> Link | None:
    """The run's upstream link from its ``run.json`` (None: no ``after:``, or a record that is not one)."""
    record = info.get(AFTER_KEY)
    if not isinstance(record, dict) or not isinstance(record.get("run_dir"), str):
        return None
    when = record.get("when") if record.get("when") in ("completed", "ended", "failed") else "completed"
    return Link(Path(run_dir), Path(record["run_dir"]), str(when))


def upstream_link(run_dir: Path) -> Link | None:
    """``link_of`` the run's own ``run.json``, read bounded; None when unreadable."""
    info = read_json_object(run_info_path(run_dir), within=run_home(run_dir))
    return link_of(run_dir, info) if info is not None else None


def record_dependent(upstream: Path, dependent: Path, when: str) -> None:
    """List ``dependent`` in ``upstream``'s dependents (one file, named after the dependent's path)."""
    name = hashlib.sha256(str(dependent).encode()).hexdigest()[:24] + ".json"
    folder = dependents_dir(upstream)
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / name, {"run_dir": str(dependent), "when": when, "time": time.time()})


def dependents_of(upstream: Path) -> list[Link]:
    """The runs chained after ``upstream``, oldest first (at most :data:`MAX_DEPENDENTS`; odd files skipped)."""
    folder = dependents_dir(upstream)
    try:
        names = sorted(child.name for child in folder.iterdir() if child.name.endswith(".json"))
    except OSError:
        return []
    found = []
    for name in names[:MAX_DEPENDENTS]:
        record = read_json_object(folder / name, within=run_home(Path(upstream)))
        if record is None or not isinstance(record.get("run_dir"), str):
            continue
        when = record.get("when") if record.get("when") in ("completed", "ended", "failed") else "completed"
        found.append((record.get("time") or 0, Link(Path(record["run_dir"]), Path(upstream), str(when))))
    return [link for _, link in sorted(found, key=lambda pair: float(pair[0]) if _number(pair[0]) else 0.0)]


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def outcome(upstream: Path, *, job_ended: bool) -> Outcome:
    """How the upstream run stands, from its own record. ``job_ended``: Slurm says its job has ended, so a
    summary still "running" (or none) means rank 0 was lost: failed. A cancel marker makes a stop a cancel."""
    ended_by_chain = read_chain_end(upstream)  # an upstream its own chain ended: as cancelled, or still waiting
    if ended_by_chain is not None:
        return "stopped" if ended_by_chain.get("kind") == "wait" else "cancelled"
    summary = read_summary(upstream)
    status = summary.status if summary is not None else None
    if status == "completed":
        return "completed"
    if status == "failed":
        return "failed"
    cancelled = any(path.exists() for path in cancel_marker_paths(upstream))
    if status == "stopped":
        return "cancelled" if cancelled else "stopped"
    if not job_ended:
        return "running"
    return "cancelled" if cancelled else "failed"


# condition -> upstream outcome -> what the dependent does
_TABLE: dict[str, dict[str, Decision]] = {
    "completed": {"completed": "start", "failed": "end", "cancelled": "end"},
    "ended": {"completed": "start", "failed": "start", "cancelled": "start"},
    "failed": {"completed": "end", "failed": "start", "cancelled": "start"},
}


def chain_decision(when: str, upstream_outcome: Outcome) -> Decision:
    """Start, end (the condition can no longer hold), or wait (the upstream runs, or stopped and may be resumed)."""
    return _TABLE.get(when, _TABLE["completed"]).get(upstream_outcome, "wait")


def end_reason(link: Link, upstream_outcome: Outcome) -> str:
    """What a dependent's status says when the chain ended it without running it."""
    if upstream_outcome == "stopped" or upstream_outcome == "running":
        return (
            f"after: {link.upstream} stopped before it completed; this run starts again when it is resumed "
            f"(hpctrain resume {link.upstream})"
        )
    return f"after: {link.upstream} {upstream_outcome} (this run waits for when: {link.when}); it never ran"


def write_chain_end(run_dir: Path, reason: str, upstream: Path, kind: str) -> None:
    """Record why the chain ended this run (``kind``: ``end`` or ``wait``, as :func:`chain_decision` said)."""
    (Path(run_dir) / CONTROL_DIR).mkdir(parents=True, exist_ok=True)
    record = {"reason": reason, "upstream": str(upstream), "kind": kind, "time": time.time()}
    write_json_atomic(chain_end_path(run_dir), record)


def read_chain_end(run_dir: Path) -> dict[str, Any] | None:
    record = read_json_object(chain_end_path(run_dir), within=run_home(Path(run_dir)))
    return record if record is not None and isinstance(record.get("reason"), str) else None


def clear_chain_end(run_dir: Path) -> None:
    chain_end_path(run_dir).unlink(missing_ok=True)


def upstream_values(upstream: Path) -> dict[str, str]:
    """Every ``{after.NAME}`` this upstream can fill: its run directory, final checkpoint, job id, status, and
    the summary's values it has (a name it lacks has no value: filling it names it)."""
    values = {"run_dir": str(upstream), "checkpoint_dir": str(checkpoints_dir(upstream))}
    final = latest_checkpoint(checkpoints_dir(upstream))
    if final is not None:
        values["checkpoint"] = str(final)
    info = read_json_object(run_info_path(upstream), within=run_home(upstream)) or {}
    if isinstance(info.get("job_id"), str):
        values["job_id"] = info["job_id"]
    summary = read_summary(upstream)
    if summary is not None:
        if summary.status is not None:
            values["status"] = summary.status
        for key in SUMMARY_VALUES:
            value = getattr(summary, key, None)
            if value is not None:
                values[key] = str(value)
    return values
