"""A run's status as ``hpctrain status`` shows it: its state, progress, ranks and future, and the recent runs.

Every view of a run (one run, a study's points, the list of recent runs,
``status --watch`` and the Python API) reads it through here, on the one
state rule (``launch/run_state.py``: Slurm's word, or a local run's
processes, reconciled with summary.json). Torch-free.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.contract import job_registry
from hpctrain.contract.heartbeat_files import read_heartbeats
from hpctrain.contract.rundir import RUN_FILE, read_run_info
from hpctrain.contract.runfiles import plausible
from hpctrain.contract.slurm import Slurm
from hpctrain.contract.slurm_states import ended_unsuccessfully, is_final, is_pending, was_cancelled
from hpctrain.contract.summary import Summary, read_summary
from hpctrain.errors import RunDirError
from hpctrain.launch import local_run
from hpctrain.launch.run_state import display_status, run_state
from hpctrain.observe.live_status import RankView, rank_views
from hpctrain.observe.node_losses import burn_in_text, evictions_text, node_loss_text
from hpctrain.observe.start_costs import last_start

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
    "failed_exit_code",
    "failed_signal",
    "failed_stderr",
    "hung_rank",
    "hung_node",
    "hung_phase",
    "hung_frozen_s",
)
RECENT_RUNS = 20


def run_status(run_dir: Path, known_states: Mapping[str, str] | None = None, *, slurm: Slurm | None = None) -> dict:
    """The run's state and progress; ``known_states``: job id -> Slurm state, where the caller asked already."""
    info, state, summary = run_state(run_dir, known_states, slurm=slurm)
    return {
        "run_dir": str(run_dir),
        "name": info.get("name"),
        "job_id": info.get("job_id"),
        "job_ids": info.get("job_ids", []),
        "cluster": info.get("cluster"),
        "slurm_state": state,
        **{key: getattr(summary, key) for key in PROGRESS_KEYS},
        "lost_nodes": node_loss_text(summary.node_failures),
        "burn_in": burn_in_text(summary.burn_in),
        "evictions": evictions_text(summary.evictions),
        "status": display_status(summary.status, state),
        "last_start": last_start(run_dir),
    }


def status_with_ranks(run_dir: Path, *, slurm: Slurm | None = None) -> tuple[dict, tuple[RankView, ...]]:
    """``run_status`` plus ``stragglers``, and each rank's last heartbeat: what ``hpctrain status RUN`` shows."""
    slurm = slurm or Slurm()
    status = run_status(run_dir, slurm=slurm)
    ranks = run_ranks(run_dir, status)
    status["stragglers"] = [view.rank for view in ranks if view.straggler]
    queued_or_running = is_pending(status["slurm_state"]) or status["slurm_state"] == "RUNNING"
    if status.get("job_id") and queued_or_running and read_run_info(run_dir).get("backend") != "local":
        from hpctrain.planning.progress import estimate  # the plan's own timeline (docs/planning.md)

        found = estimate(run_dir, str(status["job_id"]), slurm)
        status.update(found.as_dict() if found is not None else {})
    return status, ranks


def run_ranks(run_dir: Path, status: dict) -> tuple[RankView, ...]:
    """Each rank's last heartbeat (stale ones flagged while the job runs)."""
    running = status.get("status") == "running" and not is_final(status.get("slurm_state") or "")
    return rank_views(read_heartbeats(run_dir), time.time(), running=running)


@dataclass(frozen=True)
class RunStatus:
    """One run's status: the facts ``hpctrain status RUN --json`` prints, as attributes.

    ``status`` is the run's own word (running, completed, stopped, failed) or,
    for a job that never started, Slurm's (pending, cancelled); ``slurm_state``
    is what Slurm (or, for a local run, its processes) says now.
    """

    run_dir: str
    name: str | None
    job_id: str | None
    job_ids: list[str]
    cluster: str | None
    slurm_state: str
    status: str | None
    epochs_completed: int | None
    global_step: int | None
    val_top1: float | None
    best_val_top1: float | None
    train_images_per_s: float | None
    data_wait_fraction: float | None
    skipped_samples: int | None
    restarts: int | None
    stop_reason: str | None
    failed_rank: int | None
    failed_node: str | None
    failed_reason: str | None
    failed_exit_code: int | None  # a script job: the first failed script's exit code, or the signal that killed it,
    failed_signal: str | None
    failed_stderr: list[str] | None  # and its last lines of output
    hung_rank: int | None
    hung_node: str | None
    hung_phase: str | None
    hung_frozen_s: float | None
    lost_nodes: str | None
    burn_in: str | None  # the last burn-in's scores and who it flagged
    evictions: str | None
    stragglers: list[int]
    # a queued or running Slurm run's future (planning/progress.py): None when not known, 'basis' says why
    expected_start: str | None = None
    expected_finish: str | None = None
    finish_at_least: str | None = None
    steps_left: int | None = None
    chunks_left: int | None = None
    basis: str | None = None
    last_start: str | None = None  # the last start's cost, in words (observe/start_costs.py)
    chain: list[dict[str, Any]] = field(default_factory=list)  # after: its chain, first run first (chain_view.py)
    ranks: tuple[RankView, ...] = field(default=(), compare=False, repr=False)  # each rank's last heartbeat

    @property
    def finished(self) -> bool:
        """Whether the run will not go on by itself (completed, stopped, failed, cancelled)."""
        return self.status in ("completed", "stopped", "failed", "cancelled")

    def as_dict(self) -> dict[str, Any]:
        """The same keys, in the same order, as ``hpctrain status RUN --json`` (without ``--ranks``)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "ranks"}


# ------------------------------------------------------------------ recent runs

RECENT_KEYS = ("job_id", "submitted", "status", "epochs", "val_top1", "run_dir")


def registry_runs(limit: int = RECENT_RUNS, *, under: Path | None = None) -> list[tuple[str, float, Path]]:
    """(job id, submitted at, run dir) of the newest runs this account submitted; with ``under``, only those
    of that project (submitted from it or below, or whose run directory lies in it): a shared account's
    other users' runs are not listed."""
    seen, runs = set(), []
    for entry in reversed(job_registry.entries()):
        run_dir = Path(entry["run_dir"])
        if run_dir in seen or not run_dir.is_dir():
            continue
        seen.add(run_dir)
        if under is not None and not _of_project(entry, run_dir, under):
            continue
        when = entry.get("time")
        runs.append((entry["job_id"], float(when) if plausible(when) else 0.0, run_dir))
        if len(runs) >= limit:
            break
    return runs


def _of_project(entry: dict[str, Any], run_dir: Path, project: Path) -> bool:
    submitted_from = entry.get("submit_dir")
    if not isinstance(submitted_from, str):
        return True  # recorded before submit_dir was: whose it is is unknown, so it is listed (as it was)
    return any(place == project or project in place.parents for place in (run_dir, Path(submitted_from)))


def runs_under(output_dir: Path, limit: int = RECENT_RUNS) -> list[tuple[str, float, Path]]:
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


def recent_rows(
    runs: list[tuple[str, float, Path]], *, slurm: Slurm | None = None
) -> list[tuple[str, str, str, str, str, str]]:
    """One row of text per run (``RECENT_KEYS``); Slurm is asked once, for the unfinished ones."""
    summaries = {run_dir: read_summary(run_dir) or Summary() for _, _, run_dir in runs}
    unfinished = [(job_id, run_dir) for job_id, _, run_dir in runs if summaries[run_dir].status in (None, "running")]
    local_states = _local_states([run_dir for _, run_dir in unfinished])
    slurm_ids = [job_id for job_id, run_dir in unfinished if run_dir not in local_states]
    states = (slurm or Slurm()).job_states([job_id for job_id in slurm_ids if job_id.replace("_", "").isdigit()])
    rows = []
    for job_id, when, run_dir in runs:
        summary = summaries[run_dir]
        state = local_states.get(run_dir) or states.get(job_id)
        status = summary.status
        if status == "running" and ended_unsuccessfully(state):
            status = "stopped" if was_cancelled(state) else "failed"
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
    return rows


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
            states[run_dir] = local_run.state(info, run_dir, summary_final=False)
    return states


def _when(unix_time: float) -> str:
    """``MM-DD HH:MM``, or '?' for a time no clock shows (a registry or run.json edited by hand)."""
    try:
        return time.strftime("%m-%d %H:%M", time.localtime(unix_time)) if unix_time else "?"
    except (OverflowError, OSError, ValueError):
        return "?"


def _fmt(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, float) else "-"
