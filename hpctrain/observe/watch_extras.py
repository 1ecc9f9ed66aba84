"""What ``status --watch`` shows and does beside the run's own files: its time to result, and (``--sync``)
its trackers kept up to date.

* **The estimate**: until a minute has passed, the one ``submit`` (or
  ``resume``) recorded (``contract/estimates.py``), so a watch costs no Slurm
  call for it; then every :data:`ESTIMATE_EVERY_S` the plan's own estimate
  (``planning/progress.py``: one ``squeue``) while the job is queued or
  running. At the end, the first recorded estimate against the real start
  and finish (``planning/forecast.py``'s ``compare``), as ``report`` shows it.
* **The trackers** (``--sync``): ``hpctrain sync RUN`` every
  :data:`SYNC_EVERY_S` in a background thread (a tracker server that is down
  or slow never holds the watch: the next sync waits for the last), and once
  more, waited for, when the run ended, so the trackers have every step.
  What each sync did is one line; its errors are lines too, never the end of
  the watch.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.contract.estimates import read_estimates
from hpctrain.contract.rundir import read_run_info
from hpctrain.contract.runfiles import printable
from hpctrain.contract.slurm import Slurm
from hpctrain.contract.summary import read_summary
from hpctrain.errors import HpctrainError
from hpctrain.observe.live_view import stamp  # the one stamp of a watch's lines

if TYPE_CHECKING:
    from hpctrain.tracking.sync import Synced

ESTIMATE_EVERY_S = 60.0
SYNC_EVERY_S = 30.0
FINAL_SYNC_WAIT_S = 120.0  # the last sync's bound: a tracker that does not answer is left to 'hpctrain sync'


class WatchExtras:
    """The estimate and the trackers of one watched run; :meth:`tick` once per poll, :meth:`ended` at the end."""

    def __init__(self, run_dir: Path, slurm: Slurm | None, *, sync: bool, now: float) -> None:
        from hpctrain.planning.forecast import recorded_line

        self.run_dir, self.slurm, self.sync = run_dir, slurm, sync
        self.estimate = recorded_line(read_estimates(run_dir))
        self.estimate_at = now  # the first ask of Slurm a minute in
        self.shown = ""
        self.sync_at: float | None = None
        self.worker: threading.Thread | None = None
        self.heard: list[str] = []  # lines from the background sync, printed on the next tick
        self.lock = threading.Lock()

    def tick(self, now: float, *, running: bool) -> list[str]:
        """Lines to show now: the estimate when it changed, what a finished background sync did."""
        lines = []
        if running and self.slurm is not None and now - self.estimate_at >= ESTIMATE_EVERY_S:
            self.estimate_at = now
            self.estimate = self._ask_estimate() or self.estimate
        if running and self.estimate and self.estimate != self.shown:
            self.shown = self.estimate
            lines.append(f"{stamp(now)} {self.estimate}")
        if self.sync:
            idle = self.worker is None or not self.worker.is_alive()
            if idle and (self.sync_at is None or now - self.sync_at >= SYNC_EVERY_S):
                self.sync_at = now
                self.worker = threading.Thread(target=self._sync, daemon=True, name="hpctrain-watch-sync")
                self.worker.start()
        with self.lock:
            lines += [f"{stamp(now)} {line}" for line in self.heard]
            self.heard.clear()
        return lines

    def ended(self, now: float, *, wait_s: float = FINAL_SYNC_WAIT_S) -> list[str]:
        """The last lines: predicted vs real, and (``--sync``) the last sync, waited for up to ``wait_s``; each
        timestamped like every other line a watch prints (a pipe reads them as one log)."""
        from hpctrain.planning.forecast import compare

        lines = []
        outcome = compare(read_estimates(self.run_dir), read_summary(self.run_dir))
        if outcome is not None:
            lines.append(f"estimated at submit: {outcome.line()}")
        if self.sync:
            if self.worker is not None:
                self.worker.join(wait_s)
            if self.worker is None or not self.worker.is_alive():
                self._sync()
            else:
                self.heard.append(
                    "trackers: a sync is still waiting for its server; 'hpctrain sync RUN' sends the rest"
                )
            lines += self.heard
        return [f"{stamp(now)} {line}" for line in lines]

    def _ask_estimate(self) -> str:
        from hpctrain.planning.progress import estimate

        job_id = str(read_run_info(self.run_dir).get("job_id") or "")
        if not job_id or self.slurm is None:
            return ""
        try:
            found = estimate(self.run_dir, job_id, self.slurm)
        except (HpctrainError, OSError):
            return ""
        return "" if found is None else found.line()

    def _sync(self) -> None:
        from hpctrain.tracking.sync import sync

        heard: list[str] = []
        try:
            for result in sync(self.run_dir):
                heard.append(_synced_line(result))
        except HpctrainError as exc:
            heard.append(f"trackers: not synced: {exc.message}")
        with self.lock:
            self.heard += heard


def _synced_line(result: Synced) -> str:
    if result.error is not None:
        return f"{result.tracker}: not synced: {printable(result.error.message)}"
    if result.through < 0:
        return f"{result.tracker}: no settled step yet" + (f" ({printable(result.waiting)})" if result.waiting else "")
    return f"{result.tracker}: synced through step {result.through}" + (f", run {result.final}" if result.final else "")
