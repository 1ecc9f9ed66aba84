"""``tracking.live``'s sender (tracking/live.py): it syncs on a schedule, backs off from a tracker that is
down, counts what it could not send, and ends with one last sync; never raising for a tracker's sake."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from typing import Any

from hpctrain.errors import ClusterError
from hpctrain.tracking.live import MAX_BACKOFF_S, follow, listen, live_state_path
from hpctrain.tracking.sync import Synced


class Waits(threading.Event):
    """A stop event whose waits return at once and are recorded; set after ``stop_after`` waits."""

    def __init__(self, stop_after: int | None = None) -> None:
        super().__init__()
        self.waits: list[float] = []
        self.stop_after = stop_after

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        if self.stop_after is not None and len(self.waits) >= self.stop_after:
            self.set()
        return self.is_set()


def result(run_dir: Path, through: int, *, error: Any = None, final: str | None = None, sent: int = 0) -> Synced:
    return Synced(run_dir, "mlflow", "http://m", "r1", sent, through, 20, final, error=error)


def test_a_tracker_that_is_down_is_backed_off_counted_and_caught_up(tmp_path: Path) -> None:
    down = ClusterError("MLflow at http://m: opening the run failed: connection refused")
    answers = iter(
        [
            [result(tmp_path, -1, error=down)],
            [result(tmp_path, -1, error=down)],
            [result(tmp_path, 10, sent=10)],
            [result(tmp_path, 20, sent=10, final="completed")],
        ]
    )
    stop = Waits()
    state = follow(tmp_path, interval_s=30, stop=stop, sync_once=lambda run_dir: next(answers))
    assert stop.waits == [60, 120, 30]  # twice as long after each failure, the interval once it answers
    assert (state.syncs, state.failed_syncs, state.sent_steps, state.through) == (4, 2, 20, {"mlflow": 20})
    assert "connection refused" in (state.last_error or "") and state.behind == 0
    saved = json.loads(live_state_path(tmp_path).read_text())
    assert saved["failed_syncs"] == 2 and saved["sent_steps"] == 20


def test_the_backoff_is_bounded_and_a_raising_sync_is_a_failure_not_the_end(tmp_path: Path) -> None:
    def broken(run_dir: Path) -> list[Synced]:
        raise ClusterError("the run's spec is unreadable")

    stop = Waits(stop_after=8)
    state = follow(tmp_path, interval_s=30, stop=stop, sync_once=broken)
    assert max(stop.waits) == MAX_BACKOFF_S and state.failed_syncs == state.syncs == 9  # the last one after stop
    assert state.last_error == "the run's spec is unreadable"


def test_a_stop_gets_one_last_sync(tmp_path: Path) -> None:
    calls = []

    def running(run_dir: Path) -> list[Synced]:
        calls.append(run_dir)
        return [result(run_dir, 5, sent=1)]

    stop = Waits(stop_after=2)
    state = follow(tmp_path, interval_s=10, stop=stop, sync_once=running)
    assert len(calls) == 3 and stop.waits == [10, 10] and state.behind == 15


def test_the_tasks_word_that_the_run_ended_makes_the_last_sync_send_its_end(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []

    def syncing(run_dir: Path, **more: Any) -> list[Synced]:
        calls.append(more)
        return [result(run_dir, 20, sent=1, final="completed" if more.get("ended") else None)]

    stop, ended = threading.Event(), threading.Event()
    listen(io.StringIO("noise\nended\n"), ended, stop)
    assert ended.is_set() and stop.is_set()
    follow(tmp_path, interval_s=10, stop=stop, ended=ended, sync_once=syncing)
    assert calls == [{"ended": True}]  # as `hpctrain sync --ended`: Slurm's RUNNING for its own job is no answer

    quiet_stop, quiet = threading.Event(), threading.Event()
    listen(io.StringIO(""), quiet, quiet_stop)  # /dev/null (srun's rank 0 task), or the task closed it unsaid
    assert not quiet.is_set() and not quiet_stop.is_set()
    quiet_stop.set()  # SIGTERM: a requeue, a preemption or a failure leaves the run open
    calls.clear()
    follow(tmp_path, interval_s=10, stop=quiet_stop, ended=quiet, sync_once=syncing)
    assert calls == [{}]
