"""``summary.json`` of a run whose training loop is the user's own (an entry point or a script). Torch-free.

The built-in trainer writes its own summary (``trainer/reporting.py``). A
user's loop gets one through ``hpctrain.task``, written by global rank 0:

* ``running`` when the task starts, with the job, its ranks and nodes;
* the step it got to (``global_step``), at every checkpoint and at most every
  :data:`PROGRESS_EVERY_S` while it logs metrics, and ``restarts`` once it
  resumed from a checkpoint;
* ``stopped`` with the stop reason when it stops for a requeue;
* ``completed`` when an entry point returns: :func:`finish_summary`, called
  by the launcher (a script's wrapper sees its exit code and says how it ended).

A new attempt keeps what the supervisor recorded about lost nodes
(``CARRIED_SUMMARY_KEYS``), when the run first started and its wall time so
far; everything else describes this attempt. Writes never raise: the run
matters more than its summary (an error is logged once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpctrain.contract.summary import CARRIED_SUMMARY_KEYS, Summary, read_summary, write_summary

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 30.0  # logging steps rewrites summary.json at most this often
STATUS_KEYS = ("status", "stop_reason", "global_step", "restarts")  # what hpctrain sets; set_summary may not


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class UserRunSummary:
    """Rank 0's summary.json of one attempt of a user's loop."""

    def __init__(self, run_dir: Path, facts: Mapping[str, Any], *, restart_count: int) -> None:
        self.run_dir = Path(run_dir)
        previous = read_summary(self.run_dir) or Summary()
        self.prior_restarts = int(previous.restarts or 0)
        self.restart_count = restart_count
        self.prior_wall_s = float(previous.wall_s or 0.0)
        self.started = time.monotonic()
        carried = {key: getattr(previous, key) for key in CARRIED_SUMMARY_KEYS if getattr(previous, key) is not None}
        self.fields: dict[str, Any] = {
            **carried,
            **facts,
            "restarts": max(restart_count, self.prior_restarts),
            "started_at": previous.started_at or _now_iso(),
        }
        self._written_at: float | None = None
        self._warned = False
        global _active
        _active = self

    @property
    def status(self) -> str | None:
        return self.fields.get("status")

    def start(self) -> None:
        self.write(status="running")

    def resumed(self, step: int) -> None:
        """This attempt continues a checkpoint of step ``step``: one restart more than the last attempt saw."""
        self.fields["restarts"] = max(self.restart_count, self.prior_restarts + 1)
        self.write(global_step=step)

    def progress(self, step: int, *, force: bool = False) -> None:
        """The loop got to ``step``; written now when ``force`` or when the last write is old enough."""
        self.fields["global_step"] = int(step)
        due = self._written_at is None or time.monotonic() - self._written_at >= PROGRESS_EVERY_S
        if force or due:
            self.write()

    def stopped(self, reason: str) -> None:
        self.write(status="stopped", stop_reason=reason)

    def write(self, **fields: Any) -> None:
        """Merge ``fields`` and rewrite summary.json (atomically); never raises."""
        self.fields.update(fields)
        self.fields["wall_s"] = round(self.prior_wall_s + time.monotonic() - self.started, 3)
        self.fields["updated_at"] = _now_iso()
        self._written_at = time.monotonic()
        try:
            write_summary(self.run_dir, self.fields)
        except Exception as exc:  # noqa: BLE001 - the run matters more than its summary
            if not self._warned:
                self._warned = True
                log.warning("could not write %s/summary.json (not retried in the log): %s", self.run_dir, exc)


_active: UserRunSummary | None = None  # this process's (rank 0 of a user loop)


def finish_summary(run_dir: Path, job_id: str, result: Any) -> None:
    """After an entry point returned on rank 0: a summary this job left ``running`` says how it ended.

    ``result`` ``{"status": "stopped", "stop_reason": R}`` (what ``hpctrain.task.stopped()`` returns)
    means stopped for a requeue; anything else, completed. A summary another writer made final (the
    built-in trainer, the hang watchdog) or one of another job is left alone. Never raises.
    """
    stopped = isinstance(result, Mapping) and result.get("status") == "stopped"
    mine = _active
    if mine is not None and mine.run_dir == Path(run_dir) and mine.status == "running":
        fields = {"status": "stopped", "stop_reason": result.get("stop_reason")} if stopped else {"status": "completed"}
        mine.write(**fields)  # with the progress it holds that is not written yet
        return
    try:
        previous = read_summary(Path(run_dir))
        if previous is None or previous.status != "running" or previous.job_id not in (None, str(job_id)):
            return
        fields = previous.fields()
        if stopped:
            fields.update(status="stopped", stop_reason=result.get("stop_reason"))
        else:
            fields["status"] = "completed"
        fields["updated_at"] = _now_iso()
        write_summary(Path(run_dir), fields)
    except Exception as exc:  # noqa: BLE001 - the run's own outcome matters more
        log.warning("could not finish %s/summary.json: %s", run_dir, exc)
