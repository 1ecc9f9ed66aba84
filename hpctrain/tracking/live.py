"""``tracking.live``: the run's trackers fed from the job while it trains, in a process of its own.

``python -m hpctrain.tracking.live RUN_DIR`` is started on global rank 0's
node, once per start of the job: by rank 0's task, or under ``launcher:
torchrun`` by the node task that hosts rank 0 (``runtime/tracker_relay.py``;
the task side never imports this wing), and
runs ``hpctrain sync RUN_DIR`` every ``tracking.live_interval_s``: the same
sequence, cursors and locks as the login side's, so a step is sent once
whoever sends it, and what this process could not send the login side's
``hpctrain sync`` sends later. Why it cannot slow or stop training:

* it is another process, at a lower CPU priority (``nice`` 10), that only
  **reads** ``metrics.jsonl``: the trainer never waits on it, there is no
  queue in the trainer to fill, and nothing is dropped (the file keeps every
  step; a send that failed is sent by a later sync);
* a tracker that is down, slow or refusing costs this process, not the run:
  each sync is bounded by the tracker clients' timeouts (MLflow: no retries,
  10 s a request, unless set), and after a failure the next try waits twice
  as long, up to :data:`MAX_BACKOFF_S`;
* it ends with the task (the parent's death signal), after one last sync
  bounded by :data:`LAST_SYNC_S`; it then leaves at once (``os._exit``),
  without the interpreter's teardown, whose length a busy node decides.

How it learns that the run ended: its sync runs inside the job, so Slurm says
the job is RUNNING and ``hpctrain sync``'s rule (a running job may go on) would
keep the tracker's run open forever. The task that started it knows better and
says so on the sender's standard input: a line ``ended`` (:data:`ENDED_LINE`)
means every rank returned and the run is not coming back; the sender then makes
its last sync as ``hpctrain sync --ended`` does, so the run's end (FINISHED, its
summary's numbers) reaches the tracker. SIGTERM alone (a requeue, a preemption,
a failure) leaves the run open for the next start.

What it did is counted in ``RUN/.hpctrain/tracking/live.json`` (syncs, steps
sent, failed syncs, the last error, the steps it is behind) and its log
``live.log`` beside it; ``hpctrain sync RUN`` afterwards fills in every step.
The counts never count a step twice but may miss some: a sender killed after
its sync's cursor write and before its line (docs/tracking.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn

from hpctrain.contract.rundir import tracking_dir, write_json_atomic
from hpctrain.errors import HpctrainError

LIVE_STATE = "live.json"
LIVE_LOG = "live.log"
MAX_BACKOFF_S = 300.0
LAST_SYNC_S = 30.0
ENDED_LINE = "ended"  # on the sender's stdin, from the task that started it: the run ended for good
QUICK_CLIENT = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


@dataclass
class LiveState:
    """What the node's sender did, for the user and for ``hpctrain sync`` to report."""

    syncs: int = 0
    sent_steps: int = 0
    failed_syncs: int = 0
    last_error: str | None = None
    through: dict[str, int] | None = None  # tracker -> every step up to this one is there
    behind: int | None = None  # steps logged but not yet in every tracker (settled or not)
    updated_at: float = 0.0


def live_state_path(run_dir: Path) -> Path:
    return tracking_dir(run_dir) / LIVE_STATE


def follow(
    run_dir: Path,
    *,
    interval_s: float,
    stop: threading.Event,
    ended: threading.Event | None = None,
    sync_once: Callable[..., list] | None = None,
    clock: Callable[[], float] = time.time,
) -> LiveState:
    """Sync every ``interval_s`` (longer after failures) until the run is in its trackers whole or ``stop``
    is set; then one last sync, which sends the run's end if ``ended`` is set. Never raises for a tracker's
    sake."""
    if sync_once is None:
        from hpctrain.tracking.sync import sync as sync_once
    state, wait = LiveState(through={}), interval_s
    while True:
        last = stop.is_set()
        if last and ended is not None and ended.is_set():
            results, failed = _one_sync(run_dir, lambda run: sync_once(run, ended=True), state)
        else:
            results, failed = _one_sync(run_dir, sync_once, state)
        state.updated_at = clock()
        _save(run_dir, state)
        complete = bool(results) and all(getattr(r, "complete", False) for r in results)
        if last or complete:
            return state
        wait = min(MAX_BACKOFF_S, wait * 2) if failed else interval_s
        stop.wait(wait)


def _one_sync(run_dir: Path, sync_once: Callable[[Path], list], state: LiveState) -> tuple[list, bool]:
    state.syncs += 1
    try:
        results = sync_once(run_dir)
    except HpctrainError as exc:
        state.failed_syncs, state.last_error = state.failed_syncs + 1, exc.message[:500]
        print(f"{time.strftime('%H:%M:%S')} not synced: {exc.message}", flush=True)
        return [], True
    errors = [r.error for r in results if getattr(r, "error", None) is not None]
    state.sent_steps += sum(getattr(r, "sent", 0) for r in results)
    state.through = {r.tracker: r.through for r in results if r.tracker != "-"}
    lasts = [r.last_step for r in results if getattr(r, "last_step", None) is not None]
    state.behind = max((last - min(state.through.values(), default=-1) for last in lasts), default=None)
    if errors:
        state.failed_syncs, state.last_error = state.failed_syncs + 1, errors[0].message[:500]
    for result in results:
        note = f"error: {result.error.message}" if result.error is not None else f"through step {result.through}"
        note += f", ended: {result.final}" if getattr(result, "final", None) else ""
        print(f"{time.strftime('%H:%M:%S')} {result.tracker}: sent {result.sent}, {note}", flush=True)
    return results, bool(errors)


def listen(lines: Iterable[str], ended: threading.Event, stop: threading.Event) -> None:
    """The task's word on stdin: :data:`ENDED_LINE` sets ``ended`` and ``stop``. Its end (the task closed it,
    or none was given: /dev/null) says nothing."""
    for line in lines:
        if line.strip() == ENDED_LINE:
            print(f"{time.strftime('%H:%M:%S')} the run ended (its task says): the last sync sends its end", flush=True)
            ended.set()
            stop.set()
            return


def _save(run_dir: Path, state: LiveState) -> None:
    try:
        path = live_state_path(run_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, asdict(state))
    except OSError:
        pass  # the counts are a courtesy; the cursors are what counts


def main(argv: list[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser(prog="python -m hpctrain.tracking.live")
    parser.add_argument("run_dir")
    parser.add_argument("--interval", type=float, default=30.0)
    args = parser.parse_args(argv)
    for key, value in QUICK_CLIENT.items():
        os.environ.setdefault(key, value)
    try:
        os.nice(10)
    except OSError:
        pass
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # started by a task that held its stop signals (stop_signals.py): a held SIGTERM would never end it
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    ended, done = threading.Event(), threading.Event()
    threading.Thread(target=listen, args=(sys.stdin, ended, stop), daemon=True).start()
    run_dir, interval_s = Path(args.run_dir), max(1.0, args.interval)
    worker = threading.Thread(
        target=lambda: (follow(run_dir, interval_s=interval_s, stop=stop, ended=ended), done.set()), daemon=True
    )
    worker.start()
    while not done.wait(1.0):
        if stop.is_set():  # the task ended: the last sync gets LAST_SYNC_S, then this process goes
            done.wait(LAST_SYNC_S)
            break
    # Everything that counts is on disk already (cursors, live.json, each written atomically; W&B's run is
    # finished in the sync that opened it). The interpreter's own teardown (the tracker clients' modules, a
    # sync still running) is not bounded: at nice 10 on a busy node it took 30-70 s after the last sync.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
