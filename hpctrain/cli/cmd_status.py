"""``hpctrain status [RUN]``: Slurm state plus training progress from summary.json."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hpctrain import job_registry, slurm
from hpctrain.cli.cmd_logs import log_path
from hpctrain.errors import ClusterError, RunDirError
from hpctrain.rundir import Summary, parse_summary, read_run_info, read_summary
from hpctrain.runtime.failures import first_task_failure
from hpctrain.slurm import TERMINAL_STATES, job_state

PROGRESS_KEYS = (
    "status",
    "epochs_completed",
    "global_step",
    "val_top1",
    "best_val_top1",
    "train_images_per_s",
    "restarts",
    "stop_reason",
    "failed_rank",
    "failed_node",
    "failed_reason",
)


def run_status(run_dir: Path) -> dict:
    info = read_run_info(run_dir)
    recorded = read_summary(run_dir)
    state = "local" if info.get("backend") == "local" else _slurm_state(info.get("job_id", ""))
    summary = parse_summary(reconcile(recorded.fields() if recorded else {}, state, run_dir)) or Summary()
    return {
        "run_dir": str(run_dir),
        "name": info.get("name"),
        "job_id": info.get("job_id"),
        "job_ids": info.get("job_ids", []),
        "cluster": info.get("cluster"),
        "slurm_state": state,
        **{key: getattr(summary, key) for key in PROGRESS_KEYS},
    }


def reconcile(summary: dict[str, Any], slurm_state: str, run_dir: Path) -> dict[str, Any]:
    """A job that Slurm says has ended but whose summary still says "running"
    lost its rank 0 (killed, out of memory, node failure): say so, and name the
    task srun reported as failed first in the batch step's log."""
    if (
        slurm_state not in TERMINAL_STATES
        or slurm_state == "COMPLETED"
        or summary.get("status") not in (None, "running")
    ):
        return summary
    summary = {**summary, "status": "failed" if slurm_state != "CANCELLED" else "stopped"}
    if summary.get("failed_rank") is None:
        try:
            failure = first_task_failure(log_path(run_dir, 0, err=True).read_text(errors="replace"))
        except (OSError, RunDirError):
            failure = None
        if failure is not None:
            summary.update(failed_rank=failure.rank, failed_node=failure.node, failed_reason=failure.reason)
    return summary


def _slurm_state(job_id: str) -> str:
    if not job_id or not slurm.available():
        return "unknown (no Slurm here)"
    try:
        return job_state(job_id)
    except ClusterError as exc:
        return f"unknown ({exc.message})"


def run(args: argparse.Namespace) -> int:
    if args.run:
        status = run_status(job_registry.resolve_run(args.run))
        if args.json:
            print(json.dumps(status))
            return 0
        for key, value in status.items():
            if value not in (None, [], ""):
                print(f"{key:>20}: {value:.2f}" if isinstance(value, float) else f"{key:>20}: {value}")
        return 0
    return list_recent(args)


def list_recent(args: argparse.Namespace) -> int:
    seen, rows = set(), []
    for entry in reversed(job_registry.entries()):
        run_dir = Path(entry["run_dir"])
        if run_dir in seen or not run_dir.is_dir():
            continue
        seen.add(run_dir)
        summary = read_summary(run_dir) or Summary()
        rows.append(
            (
                entry["job_id"],
                time.strftime("%m-%d %H:%M", time.localtime(entry["time"])),
                summary.status or "-",
                "-" if summary.epochs_completed is None else str(summary.epochs_completed),
                _fmt(summary.val_top1),
                str(run_dir),
            )
        )
        if len(rows) >= 20:
            break
    if args.json:
        print(
            json.dumps([dict(zip(("job_id", "submitted", "status", "epochs", "val_top1", "run_dir"), r)) for r in rows])
        )
        return 0
    if not rows:
        print("no runs submitted from this account yet; start with: hpctrain submit jobs/quickstart.yaml")
        return 0
    table = Table(title="recent hpctrain runs (hpctrain status RUN for details)", title_justify="left")
    for column in ("job", "submitted", "status", "epochs", "val top-1", "run dir"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    Console(file=sys.stdout).print(table)
    return 0


def _fmt(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, float) else "-"
