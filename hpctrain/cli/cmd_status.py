"""``hpctrain status [RUN]``: Slurm state plus training progress from summary.json."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hpctrain.cli.cmd_logs import log_path
from hpctrain.contract import job_registry, slurm
from hpctrain.contract.heartbeat_files import read_heartbeats
from hpctrain.contract.rundir import RUN_FILE, Summary, parse_summary, read_run_info, read_summary
from hpctrain.contract.runfiles import for_rich, json_safe, plausible, printable, read_tail
from hpctrain.contract.slurm import TERMINAL_STATES, job_state
from hpctrain.errors import ClusterError, RunDirError, UsageError
from hpctrain.observe.live_status import RankView, rank_views
from hpctrain.observe.live_view import rank_table
from hpctrain.observe.node_losses import node_loss_text
from hpctrain.runtime import local_run
from hpctrain.runtime.failures import first_task_failure

PROGRESS_KEYS = (
    "status",
    "epochs_completed",
    "global_step",
    "val_top1",
    "best_val_top1",
    "train_images_per_s",
    "data_wait_fraction",
    "skipped_samples",
    "restarts",
    "stop_reason",
    "failed_rank",
    "failed_node",
    "failed_reason",
    "hung_rank",
    "hung_node",
    "hung_phase",
    "hung_frozen_s",
)
RANK_TABLE_UP_TO = 8  # the plain status shows every rank's heartbeat up to this many ranks (or with --ranks)
FAILURE_LOG_TAIL_BYTES = 4 << 20  # srun reports a failed task at the end of the batch step's log


def run_status(run_dir: Path, known_states: Mapping[str, str] | None = None) -> dict:
    """The run's state and progress; ``known_states``: job id -> Slurm state, where the caller asked already."""
    info = read_run_info(run_dir)
    recorded = read_summary(run_dir)
    job_id = str(info.get("job_id", ""))
    known = (known_states or {}).get(job_id)
    if info.get("backend") == "local":
        state = local_run.state(info, summary_final=bool(recorded and recorded.is_final))
    else:
        state = known or _slurm_state(job_id)
    summary = parse_summary(reconcile(recorded.fields() if recorded else {}, state, run_dir)) or Summary()
    return {
        "run_dir": str(run_dir),
        "name": info.get("name"),
        "job_id": info.get("job_id"),
        "job_ids": info.get("job_ids", []),
        "cluster": info.get("cluster"),
        "slurm_state": state,
        **{key: getattr(summary, key) for key in PROGRESS_KEYS},
        "lost_nodes": node_loss_text(summary.node_failures),
        "status": display_status(summary.status, state),
    }


def reconcile(summary: dict[str, Any], slurm_state: str, run_dir: Path) -> dict[str, Any]:
    """A job that Slurm says has ended (or a local run whose processes are gone) but whose summary
    still says "running" lost its rank 0 (killed, out of memory, node failure): say so, and name
    the task srun reported as failed first in the batch step's log."""
    if (
        (slurm_state not in TERMINAL_STATES and slurm_state != local_run.GONE_STATE)
        or slurm_state == "COMPLETED"
        or summary.get("status") not in (None, "running")
        or (summary.get("status") is None and slurm_state == "CANCELLED")  # cancelled before it started
    ):
        return summary
    summary = {**summary, "status": "failed" if slurm_state != "CANCELLED" else "stopped"}
    if summary.get("failed_rank") is None:
        try:
            tail = read_tail(log_path(run_dir, 0, err=True), FAILURE_LOG_TAIL_BYTES)
            failure = first_task_failure(tail.decode("utf-8", errors="replace"))
        except (OSError, RunDirError):
            failure = None
        if failure is not None:
            summary.update(failed_rank=failure.rank, failed_node=failure.node, failed_reason=failure.reason)
        elif slurm_state == local_run.GONE_STATE and summary.get("failed_reason") is None:
            summary["failed_reason"] = "its processes ended without recording an end (killed, e.g. out of memory)"
    return summary


def display_status(status: str | None, slurm_state: str | None) -> str | None:
    """The run's own status, or what Slurm knows when the run never started (pending, cancelled while queued)."""
    if status is not None or slurm_state is None:
        return status
    if slurm_state == "PENDING":
        return "pending"
    if slurm_state == "CANCELLED":
        return "cancelled"
    if (slurm_state in TERMINAL_STATES and slurm_state != "COMPLETED") or slurm_state == local_run.GONE_STATE:
        return "failed"
    return None


def _slurm_state(job_id: str) -> str:
    if not job_id or not slurm.available():
        return "unknown (no Slurm here)"
    try:
        return job_state(job_id)
    except ClusterError as exc:
        return f"unknown ({exc.message})"


def run(args: argparse.Namespace) -> int:
    from hpctrain.cli import study_views

    if (study_dir := study_views.study_dir_of(args.run)) is not None:
        if getattr(args, "watch", False):
            raise UsageError(
                "--watch follows one run", hint=f"watch one point: hpctrain status {study_dir}/POINT --watch"
            )
        return study_views.status(study_dir, as_json=args.json)
    if getattr(args, "watch", False):
        from hpctrain.cli.watch import watch

        if not args.run:
            raise UsageError("--watch follows one run", hint="hpctrain status RUN --watch (RUN: run dir or job id)")

        return watch(job_registry.resolve_run(args.run), interval_s=args.interval, show_ranks=args.ranks)
    if args.run:
        run_dir = job_registry.resolve_run(args.run)
        status = run_status(run_dir)
        ranks = _ranks(run_dir, status)
        status["stragglers"] = [view.rank for view in ranks if view.straggler]
        if args.json:
            shown = {**status, **({"ranks": [asdict(view) for view in ranks]} if args.ranks else {})}
            print(json.dumps(json_safe(shown), allow_nan=False))
            return 0
        for key, value in status.items():
            if value not in (None, [], ""):
                print(f"{key:>20}: {value:.2f}" if isinstance(value, float) else f"{key:>20}: {printable(value)}")
        if ranks and (args.ranks or len(ranks) <= RANK_TABLE_UP_TO):
            Console(file=sys.stdout).print(rank_table(ranks, limit=len(ranks)))
        elif ranks:
            print(f"{'ranks':>20}: {len(ranks)} wrote heartbeats (--ranks shows each)")
        return 0
    return list_recent(args)


def _ranks(run_dir: Path, status: dict) -> tuple[RankView, ...]:
    """Each rank's last heartbeat (stale ones flagged while the job runs)."""
    running = status.get("status") == "running" and status.get("slurm_state") not in TERMINAL_STATES
    return rank_views(read_heartbeats(run_dir), time.time(), running=running)


def registry_runs(limit: int = 20) -> list[tuple[str, float, Path]]:
    """(job id, submitted at, run dir) of the newest runs this account submitted."""
    seen, runs = set(), []
    for entry in reversed(job_registry.entries()):
        run_dir = Path(entry["run_dir"])
        if run_dir in seen or not run_dir.is_dir():
            continue
        seen.add(run_dir)
        when = entry.get("time")
        runs.append((entry["job_id"], float(when) if plausible(when) else 0.0, run_dir))
        if len(runs) >= limit:
            break
    return runs


def runs_under(output_dir: Path, limit: int = 20) -> list[tuple[str, float, Path]]:
    """The newest runs in OUTPUT_DIR/NAME/RUN_ID (or NAME/RUN_ID when given a job's folder)."""
    runs = []
    for run_file in [*output_dir.glob(f"*/*/{RUN_FILE}"), *output_dir.glob(f"*/{RUN_FILE}")]:
        try:
            info = read_run_info(run_file.parent)
        except RunDirError:
            continue
        when = info.get("submitted_at") or info.get("created_at") or 0
        runs.append((str(info.get("job_id", "-")), float(when) if plausible(when) else 0.0, run_file.parent))
    return sorted(runs, key=lambda run: run[1], reverse=True)[:limit]


def list_recent(args: argparse.Namespace) -> int:
    if args.output_dir:
        output_dir = Path(args.output_dir).expanduser()
        if not output_dir.is_dir():
            raise RunDirError(f"--output-dir {args.output_dir}: no such directory")
        runs = runs_under(output_dir)
    else:
        runs = registry_runs()
    summaries = {run_dir: read_summary(run_dir) or Summary() for _, _, run_dir in runs}
    unfinished = [(job_id, run_dir) for job_id, _, run_dir in runs if summaries[run_dir].status in (None, "running")]
    local_states = _local_states([run_dir for _, run_dir in unfinished])
    slurm_ids = [job_id for job_id, run_dir in unfinished if run_dir not in local_states]
    states = slurm.job_states([job_id for job_id in slurm_ids if job_id.replace("_", "").isdigit()])
    rows = []
    for job_id, when, run_dir in runs:
        summary = summaries[run_dir]
        state = local_states.get(run_dir) or states.get(job_id)
        status = summary.status
        if status == "running" and state in TERMINAL_STATES and state != "COMPLETED":
            status = "stopped" if state == "CANCELLED" else "failed"
        elif status == "running" and state == local_run.GONE_STATE:
            status = "failed"
        rows.append(
            (
                job_id,
                _when(when),
                display_status(status, state) or "-",
                "-" if summary.epochs_completed is None else str(summary.epochs_completed),
                _fmt(summary.val_top1),
                str(run_dir),
            )
        )
    if args.json:
        keys = ("job_id", "submitted", "status", "epochs", "val_top1", "run_dir")
        print(json.dumps([dict(zip(keys, row)) for row in rows]))
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


def _local_states(run_dirs: list[Path]) -> dict[Path, str]:
    """The state of each local run among ``run_dirs``, unfinished ones (its process alive or gone);
    Slurm is not asked about them."""
    states = {}
    for run_dir in run_dirs:
        try:
            info = read_run_info(run_dir)
        except RunDirError:
            continue
        if info.get("backend") == "local":
            states[run_dir] = local_run.state(info, summary_final=False)
    return states


def _when(unix_time: float) -> str:
    """``MM-DD HH:MM``, or '?' for a time no clock shows (a registry or run.json edited by hand)."""
    try:
        return time.strftime("%m-%d %H:%M", time.localtime(unix_time)) if unix_time else "?"
    except (OverflowError, OSError, ValueError):
        return "?"


def _fmt(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, float) else "-"
