"""``status --watch`` beside the run's files: its time to result (recorded, then Slurm's), predicted vs real
at the end, and ``--sync`` keeping the trackers up to date without ever holding the watch."""

from __future__ import annotations

import io
import json
import re
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from hpctrain.contract.estimates import record_estimate
from hpctrain.contract.slurm_answers import JOB_TIMES_FORMAT
from hpctrain.errors import ClusterError
from hpctrain.observe.watch import JobPoller, watch
from hpctrain.observe.watch_extras import ESTIMATE_EVERY_S, SYNC_EVERY_S, WatchExtras
from hpctrain.tracking import sync as sync_module
from hpctrain.tracking.sync import Synced
from tests.fake_slurm import FakeSlurm
from tests.unit.cli_helpers import assert_user_error, in_process

pytestmark = pytest.mark.usefixtures("isolated")

GOLDEN = Path(__file__).parent / "golden" / "slurm" / "24.11"
NOW = datetime(2026, 11, 29, 0, 13, 19).timestamp()


STAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")


def iso(at: float) -> str:
    return datetime.fromtimestamp(at).astimezone().strftime("%Y-%m-%dT%H:%M:%S%z")


def make_run(tmp_path: Path, **summary: Any) -> Path:
    run_dir = tmp_path / "runs" / "x" / "20261129-001300"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"job_id": "77", "job_ids": ["77"], "backend": "slurm"}))
    fields = {"status": "running", "epochs": 2, "steps_per_epoch": 100, "global_step": 150, **summary}
    (run_dir / "summary.json").write_text(json.dumps(fields))
    (run_dir / "spec.yaml").write_text("resources:\n  time: '00:10:00'\nsignals:\n  signal_delay_s: 120\n")
    lines = [{"kind": "train_step", "global_step": i, "step_s": 1.0, "time": i} for i in range(1, 6)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run_dir


def test_the_recorded_estimate_shows_first_and_slurms_replaces_it_a_minute_in(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    record_estimate(run_dir, {"by": "submit", "made_at": NOW, "start_at": NOW + 60, "finish_at": NOW + 900})
    ask = f"squeue -h -t all -o {JOB_TIMES_FORMAT} -j 77"
    fake = FakeSlurm(answers={ask: (0, (GOLDEN / "squeue_times_running.txt").read_text())})
    extras = WatchExtras(run_dir, fake.client(), sync=False, now=NOW)
    [first] = extras.tick(NOW, running=True)
    assert f"expected finish {iso(NOW + 900)}" in first and "as estimated at submit" in first
    assert extras.tick(NOW + 10, running=True) == [] and not fake.commands  # no Slurm call for it yet
    [fresh] = extras.tick(NOW + ESTIMATE_EVERY_S, running=True)
    assert len(fake.asked("squeue")) == 1 and "expected finish" in fresh and "50 steps left" in fresh
    assert extras.tick(NOW + ESTIMATE_EVERY_S + 5, running=True) == []  # shown once until it changes


def test_watch_ends_with_predicted_vs_real_just_before_its_last_line(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, status="completed", started_at=iso(NOW + 100), updated_at=iso(NOW + 1000))
    record_estimate(run_dir, {"by": "submit", "made_at": NOW, "start_at": NOW + 60, "finish_at": NOW + 1100})
    fake = FakeSlurm({"77": "COMPLETED"})
    out = io.StringIO()
    assert watch(run_dir, out=out, tty=False, poller=JobPoller(fake.client()), clock=lambda: NOW, sleep=print) == 0
    lines = out.getvalue().splitlines()
    assert lines[-2][19:].startswith(" estimated at submit: start: predicted") and "10% late" in lines[-2]
    assert all(STAMPED.match(line) for line in lines), lines  # every line of a piped watch is timestamped
    assert lines[-1].endswith("ended COMPLETED; run status: completed")


def synced(run_dir: Path, through: int, final: str | None = None, error: Any = None) -> Synced:
    return Synced(run_dir, "mlflow", "http://m", "r1", 1, through, 15, final, error=error)


def test_sync_runs_beside_the_watch_and_once_more_at_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = make_run(tmp_path)
    release, calls = threading.Event(), []

    def slow_sync(target: Path, **kwargs: Any) -> list[Synced]:
        calls.append(target)
        release.wait(30)  # a tracker server that does not answer yet
        return [synced(target, 6 if len(calls) == 1 else 15, None if len(calls) == 1 else "completed")]

    monkeypatch.setattr(sync_module, "sync", slow_sync)
    extras = WatchExtras(run_dir, None, sync=True, now=NOW)
    assert extras.tick(NOW, running=True) == [] and len(calls) == 1
    assert extras.tick(NOW + SYNC_EVERY_S + 1, running=True) == [] and len(calls) == 1  # never two at once
    release.set()
    assert extras.worker is not None
    extras.worker.join(10)
    assert extras.tick(NOW + SYNC_EVERY_S + 2, running=True)[0].endswith("mlflow: synced through step 6")
    last = extras.ended(NOW + 100)
    assert len(calls) == 3 and last[-1].endswith(" mlflow: synced through step 15, run completed")


def test_a_tracker_that_cannot_be_reached_is_a_line_not_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = make_run(tmp_path)
    down = ClusterError("http://m: connection refused")
    monkeypatch.setattr(sync_module, "sync", lambda target, **kwargs: [synced(target, -1, error=down)])
    extras = WatchExtras(run_dir, None, sync=True, now=NOW)
    heard = extras.tick(NOW, running=True)  # the sync may be done already
    assert extras.worker is not None
    extras.worker.join(10)
    heard += extras.tick(NOW + 1, running=True)
    assert [line[20:] for line in heard] == ["mlflow: not synced: http://m: connection refused"]
    assert [line[20:] for line in extras.ended(NOW + 2)] == ["mlflow: not synced: http://m: connection refused"]


def test_sync_without_watch_says_how_to_use_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert_user_error(in_process(capsys, "status", str(make_run(tmp_path)), "--sync"), 2, "--watch --sync")
