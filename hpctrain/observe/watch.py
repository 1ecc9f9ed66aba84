"""Watching a run (``hpctrain status RUN --watch``): poll it until its job ends, as a live panel or as plain
change lines.

Each poll makes one Slurm call (``sacct``, or ``squeue`` on a cluster
without accounting), and one more a minute for the run's expected finish
(``watch_extras.py``, which also keeps the trackers synced with ``--sync``),
and reads the run directory once; ``metrics.jsonl`` is
tailed from where the last poll stopped. The watch ends when Slurm says the
job has ended (after up to ``settle_s`` more for the run's final summary), or,
without Slurm (local runs, no client here), when summary.json is final; a
local run also ends when its process is gone (killed), shown as failed.

Exit codes: 0 completed, 1 failed, 10 stopped or cancelled (resume continues
it), 130 on Ctrl-C (quietly). Clock, sleep and the Slurm client are
injectable, so tests never wait.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TextIO

from hpctrain.contract.rundir import metrics_path, read_run_info, run_home
from hpctrain.contract.slurm import Slurm, SlurmCommandError
from hpctrain.contract.slurm_states import is_final, succeeded
from hpctrain.contract.summary import Summary, parse_summary, read_summary
from hpctrain.errors import ClusterError
from hpctrain.launch import local_run
from hpctrain.launch.run_state import display_status, reconcile
from hpctrain.observe.live_status import MetricsTail, Snapshot, build_snapshot, read_run
from hpctrain.observe.live_view import final_lines, plain_changes, rich_view
from hpctrain.observe.watch_extras import WatchExtras

MIN_INTERVAL_S = 2.0
DEFAULT_INTERVAL_S = 5.0
SETTLE_S = 30.0  # after Slurm says the job ended, wait at most this long for the run's final summary.json
EXIT_STOPPED = 10  # apart from the error codes 1-5 and 130, so a script can tell "resume it" from "broken"
EXIT_CODES = {"completed": 0, "failed": 1, "stopped": EXIT_STOPPED, "cancelled": EXIT_STOPPED}


class JobPoller:
    """The job's Slurm state, one command per call; switches to squeue once if sacct is refused."""

    def __init__(self, slurm: Slurm | None = None) -> None:
        self.slurm = slurm or Slurm()
        self.source: Literal["sacct", "squeue"] = "sacct"
        self.have_slurm = self.slurm.available()

    def state(self, info: dict, run_dir: Path, *, summary_final: bool = False) -> str:
        if info.get("backend") == "local":
            return local_run.state(info, run_dir, summary_final=summary_final)
        job_id = str(info.get("job_id") or "")
        if not job_id or not self.have_slurm:
            return "unknown (no Slurm here)"
        try:
            return self.slurm.job_state(job_id, source=self.source)
        except SlurmCommandError as exc:
            if self.source == "sacct" and exc.kind in ("refused", "missing"):
                self.source = "squeue"  # accounting off, or no sacct: ask squeue from the next poll on
            return f"unknown ({exc.kind})"
        except ClusterError:
            return "unknown"


def job_ended(state: str, summary: Summary, job_id: str | None = None) -> bool:
    """Whether the job will not run again by itself: what Slurm says, else a final summary.json of this job.

    "This job": after ``hpctrain resume`` the summary of the previous attempt
    is final while sacct may not list the new job yet (its summary records the
    job id; an array task's SLURM_JOB_ID differs from ``123_4``, so those match any).
    """
    if is_final(state) or state == local_run.GONE_STATE:
        return True
    if state == local_run.STATE:
        return summary.is_final
    this_job = summary.job_id is None or not job_id or "_" in job_id or summary.job_id == job_id
    return state.lower().startswith("unknown") and summary.is_final and this_job


def exit_code(snap: Snapshot) -> int:
    if snap.status in EXIT_CODES:
        return EXIT_CODES[snap.status]
    return 0 if succeeded(snap.slurm_state) else 1


def take_snapshot(run_dir: Path, tail: MetricsTail, poller: JobPoller, now: float) -> tuple[Snapshot, bool]:
    """(the snapshot, whether summary.json is final) at ``now``; one Slurm call at most."""
    info = read_run_info(run_dir)  # read again each time: 'hpctrain resume' records a new job id
    recorded = read_summary(run_dir) or Summary()
    state = poller.state(info, run_dir, summary_final=recorded.is_final)
    summary = parse_summary(reconcile(recorded.fields(), state, run_dir)) or Summary()
    ended = job_ended(state, recorded, str(info.get("job_id") or ""))
    snap = build_snapshot(read_run(run_dir, info, tail, summary), state, now, final=ended)
    return dataclasses.replace(snap, status=display_status(summary.status, state)), recorded.is_final


def watch(
    run_dir: Path,
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    out: TextIO | None = None,
    tty: bool | None = None,
    show_ranks: bool = False,
    poller: JobPoller | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    settle_s: float = SETTLE_S,
    sync: bool = False,
) -> int:
    """Show the run until its job ends; the exit code says how it ended. ``sync``: keep the run's trackers
    up to date as it goes, and send the rest at its end (``watch_extras.py``)."""
    out = out or sys.stdout
    tty = out.isatty() if tty is None else tty
    poller = poller or JobPoller()
    on_slurm = poller.have_slurm and read_run_info(run_dir).get("backend") != "local"
    extras = WatchExtras(run_dir, poller.slurm if on_slurm else None, sync=sync, now=clock())
    tail = MetricsTail(metrics_path(run_dir), within=run_home(run_dir))
    interval_s = max(MIN_INTERVAL_S, interval_s)
    live = None
    if tty:
        from rich.console import Console, Group
        from rich.live import Live
        from rich.text import Text

        live = Live(console=Console(file=out), auto_refresh=False, transient=False)
        live.start()
    try:
        previous, ended_at, shown = None, None, []
        while True:
            now = clock()
            snap, summary_final = take_snapshot(run_dir, tail, poller, now)
            if snap.final and ended_at is None:
                ended_at = now
            # a local run whose process is gone writes nothing more: no wait for its summary
            gone = snap.slurm_state == local_run.GONE_STATE
            done = snap.final and (summary_final or gone or now - (ended_at or now) >= settle_s)
            news = [] if done else extras.tick(now, running=not snap.final)
            if live is not None:
                shown = news[-1:] or shown
                view = rich_view(snap, interval_s=interval_s)
                live.update(Group(view, *(Text(line, style="dim") for line in shown)) if shown else view, refresh=True)
                if done:
                    live.stop()
                    live = None
                    _write(out, [*extras.ended(now), *final_lines(snap)[-1:]])
            elif done:
                last = final_lines(snap)
                _write(out, [*last[:-1], *extras.ended(now), *last[-1:]])
            else:
                _write(out, [*plain_changes(previous, snap, show_ranks=show_ranks), *news])
            if done:
                return exit_code(snap)
            previous = snap
            sleep(interval_s)
    except KeyboardInterrupt:
        return 130
    finally:
        if live is not None:
            live.stop()


def _write(out: TextIO, lines: list[str]) -> None:
    for line in lines:
        out.write(line + "\n")
    out.flush()
