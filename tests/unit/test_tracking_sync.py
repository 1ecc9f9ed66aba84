"""``hpctrain sync``'s sequence (tracking/sync.py) against an in-memory tracker that keeps what MLflow keeps.

The real MLflow server and W&B's own reader are in tests/local/test_tracking_servers.py.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from hpctrain.contract.tracking_state import read_cursor
from hpctrain.errors import RunDirError
from hpctrain.tracking import sync as sync_module
from hpctrain.tracking.mlflow_sink import TrackerError
from hpctrain.tracking.sync import load_run, sync, sync_tracker
from tests.tracking_helpers import TRACKING_ID, craft_run, last_loss, metric_line, write_checkpoint, write_summary

MLFLOW = {"mlflow": {"tracking_uri": "http://127.0.0.1:9", "experiment": "e"}}


class FakeMlflow:
    """Keeps each (key, step, time, value) once, as MLflow's store does; can fail on a chosen batch."""

    acks_each_batch, rewrites, where = True, False, "fake"
    runs: dict[str, dict[str, Any]] = {}

    def __init__(self, fail_on_batch: int | None = None) -> None:
        self.fail_on_batch, self.batches = fail_on_batch, 0

    def open(self, tracking_id: str, run_ref: str | None, label: str, run_dir: Path) -> tuple[str, int | None]:
        run = self.runs.setdefault(tracking_id, {"metrics": set(), "params": {}, "tags": {}, "status": None})
        self.run = run
        synced = run["tags"].get("hpctrain.synced_through")
        return f"run-{tracking_id}", None if run_ref or synced is None else int(synced)

    def send_steps(self, steps: list[Any], *, through: int) -> None:
        self.batches += 1
        if self.batches == self.fail_on_batch:
            raise TrackerError("server went away")
        self.run["metrics"] |= {(k, e.step, e.time_of(k), v) for e in steps for k, v in e.values.items()}
        self.run["tags"]["hpctrain.synced_through"] = str(through)

    def send_params(self, params: dict[str, str]) -> None:
        changed = {k for k, v in params.items() if self.run["params"].get(k, v) != v}
        assert not changed, "MLflow refuses a parameter logged again with another value"
        self.run["params"].update(params)

    def set_tags(self, tags: dict[str, str]) -> None:
        self.run["tags"].update(tags)

    def send_artifacts(self, paths: list[Path]) -> None:
        self.run.setdefault("artifacts", []).extend(p.name for p in paths)

    def finish(self, status: str | None, numbers: dict[str, float], step: int | None, time_s: float) -> None:
        self.run["status"] = status

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def fresh_tracker() -> None:
    FakeMlflow.runs = {}


def history(key: str = "train/loss") -> list[tuple[int, float]]:
    return sorted((step, value) for k, step, _, value in FakeMlflow.runs[TRACKING_ID]["metrics"] if k == key)


def sync_once(run: Path, sink: Any = None, **more: Any) -> Any:
    return sync_tracker(load_run(run, **more), "mlflow", sink or FakeMlflow())


def test_a_running_run_is_sent_up_to_its_checkpoint_then_the_rest_once_it_ends(tmp_path: Path) -> None:
    run = craft_run(tmp_path / "run", MLFLOW)
    first = sync_once(run)
    assert (first.sent, first.through, first.last_step, first.final) == (6, 6, 15, None)
    assert "steps 7-15 wait" in first.waiting
    write_summary(run, "completed", stop_reason="finished")
    second = sync_once(run)
    assert (second.sent, second.through, second.final) == (9, 15, "completed") and second.complete
    assert history() == [(step, last_loss(step)) for step in range(1, 16)]  # each step once, its last value
    assert history("hpctrain/restart") == [(7, 1.0)] and history("hpctrain/node_lost") == [(9, 1.0)]
    tracked = FakeMlflow.runs[TRACKING_ID]
    assert tracked["status"] == "completed" and tracked["params"]["trainer.lr"] == "0.1"
    assert tracked["tags"]["hpctrain.lost_nodes"] == "c2" and tracked["tags"]["hpctrain.stop_reason"] == "finished"
    assert sync_once(run).sent == 0


def test_a_sync_killed_halfway_and_run_again_sends_nothing_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = craft_run(tmp_path / "run", MLFLOW, status="completed", last=40)
    monkeypatch.setattr(sync_module, "_chunks", lambda steps: ([entry] for entry in steps))  # one step a batch
    failed = sync_once(run, FakeMlflow(fail_on_batch=5))
    assert isinstance(failed.error, TrackerError) and not failed.complete
    assert read_cursor(run, "mlflow").sent_step == 4  # what the tracker acknowledged, no more
    assert (failed.sent, failed.through, failed.final) == (4, 4, None)  # and what this sync counts as sent
    with pytest.raises(TrackerError):  # nothing acknowledged: the error, as before
        sync_once(run, FakeMlflow(fail_on_batch=1))
    sent = Counter((k, step) for k, step, _, _ in FakeMlflow.runs[TRACKING_ID]["metrics"])
    real_write = sync_module.write_cursor
    calls = {"n": 0}

    def killed_after_the_ack(run_dir: Path, cursor: Any) -> None:  # the server stored it; the cursor never moved
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        real_write(run_dir, cursor)

    monkeypatch.setattr(sync_module, "write_cursor", killed_after_the_ack)
    with pytest.raises(KeyboardInterrupt):
        sync_once(run)
    monkeypatch.setattr(sync_module, "write_cursor", real_write)
    last = sync_once(run)
    assert last.through == 40
    # What the syncs that returned count (live.log adds it up) is a lower bound, never over: the killed sync
    # recorded steps 5 and 6 (its cursor writes 1 and 2) and died before it could count them; step 7, which
    # the tracker had but its cursor did not, the last sync sent again and counted once (docs/tracking.md).
    assert failed.sent + last.sent == 40 - 2
    assert sent["train/loss", 4] == 1
    assert history() == [(step, last_loss(step)) for step in range(1, 41)]
    assert len(FakeMlflow.runs[TRACKING_ID]["metrics"]) == 40 + 1 + 3  # losses, val, restart/redone/node_lost


def test_a_batch_sent_again_after_a_kill_is_the_same_data_though_its_steps_got_more_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI's stop 54: a sender killed after MLflow stored its batch and before its cursor's write; meanwhile a step of
    that batch got another line (its step_split, written just after the checkpoint that settled it) and a lost node
    was recorded at a step already sent. The next sync sends the batch again: each value keeps its own time (and the
    late event its record's), so MLflow, which keeps a (key, step, time, value) once, holds each step once."""
    run = craft_run(tmp_path / "run", MLFLOW)
    (run / "summary.json").write_text(json.dumps({"status": "running", "restarts": 1}))  # no lost node yet
    assert sync_once(run).through == 6
    write_checkpoint(run, 12)
    real_write = sync_module.write_cursor
    monkeypatch.setattr(sync_module, "write_cursor", lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):  # 7..12 stored, the cursor still says 6
        sync_once(run)
    monkeypatch.setattr(sync_module, "write_cursor", real_write)
    with (run / "metrics.jsonl").open("a") as handle:
        handle.write(metric_line(12, 0.5, 2012.7, kind="step_split"))
    assert sync_once(run).through == 12
    write_summary(run, "running", node_failures=[{"node": "c2", "kind": "lost", "step": 9, "time": 2009.5}])
    monkeypatch.setattr(sync_module, "write_cursor", lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):  # the late event stored, not recorded
        sync_once(run)
    monkeypatch.setattr(sync_module, "write_cursor", real_write)
    sync_once(run)
    held = Counter((key, step) for key, step, _, _ in FakeMlflow.runs[TRACKING_ID]["metrics"])
    assert [k for k, count in held.items() if count > 1] == [], held
    assert held["train/loss", 12] == held["split/loss", 12] == held["hpctrain/node_lost", 9] == 1
    times = {(k, step): t for k, step, t, _ in FakeMlflow.runs[TRACKING_ID]["metrics"]}
    assert times["train/loss", 12] == 2012.0 and times["split/loss", 12] == 2012.7  # each line's own time
    assert times["hpctrain/node_lost", 9] == 2009.5 and times["hpctrain/restart", 7] == 2007.0  # the step's


def test_a_lost_cursor_continues_after_the_step_the_tracker_says(tmp_path: Path) -> None:
    run = craft_run(tmp_path / "run", MLFLOW)
    sync_once(run)
    shutil.rmtree(run / ".hpctrain")
    write_summary(run, "completed")
    assert sync_once(run).sent == 9  # 7..15: the run's synced_through tag said 6
    assert history() == [(step, last_loss(step)) for step in range(1, 16)]


def test_steps_redone_after_they_were_sent_are_reported_not_sent_again(tmp_path: Path) -> None:
    run = craft_run(tmp_path / "run", MLFLOW)
    write_checkpoint(run, 12)
    assert sync_once(run).through == 12
    with (run / "metrics.jsonl").open("a") as handle:  # the checkpoint at 12 was damaged: a restart from 6
        handle.write(metric_line(8, 555.0, 5000.0))
    sync_once(run)
    assert dict(history())[8] == last_loss(8)
    assert json.loads(FakeMlflow.runs[TRACKING_ID]["tags"]["hpctrain.late_redone_steps"]) == [8]


def test_ended_sends_the_steps_of_a_run_that_will_not_go_on(tmp_path: Path) -> None:
    run = craft_run(tmp_path / "run", MLFLOW)
    done = sync_once(run, ended=True)
    assert (done.through, done.final) == (15, "stopped")


def test_ended_inside_its_own_job_sends_the_summarys_end_though_slurm_calls_it_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tracking.live's last sync runs inside the job (Slurm: RUNNING); the node task said the run ended."""
    run = craft_run(tmp_path / "run", MLFLOW, status="completed")
    monkeypatch.setattr(sync_module, "run_end", lambda run_dir: None)  # the job runs: it may go on
    assert sync_once(run).final is None
    done = sync_once(run, ended=True)
    assert (done.through, done.final) == (15, "completed")
    assert FakeMlflow.runs[TRACKING_ID]["status"] == "completed"


def test_a_resumed_run_reopens_and_a_changed_spec_value_becomes_a_tag(tmp_path: Path) -> None:
    run = craft_run(tmp_path / "run", MLFLOW, status="stopped")
    sync_once(run)
    spec = json.loads((run / "spec.yaml").read_text())
    spec["trainer"]["lr"] = 0.2
    (run / "spec.yaml").write_text(json.dumps(spec))
    write_summary(run, "running")
    sync_once(run)
    tracked = FakeMlflow.runs[TRACKING_ID]
    assert tracked["status"] is None and tracked["params"]["trainer.lr"] == "0.1"
    assert tracked["tags"]["hpctrain.changed.trainer.lr"] == "0.2"


def test_a_run_without_trackers_or_with_a_bad_section_is_refused_with_the_fix(tmp_path: Path) -> None:
    run = craft_run(tmp_path / "run", {})
    with pytest.raises(RunDirError, match="names no tracker"):
        load_run(run)
    (run / "spec.yaml").write_text(json.dumps({"name": "x", "tracking": {"mlflow": {"tracking_uri": "ftp://x"}}}))
    with pytest.raises(RunDirError, match="tracking.mlflow.tracking_uri"):
        load_run(run)


def test_one_failing_run_does_not_stop_the_others_and_follow_stops_when_all_are_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "run.json").write_text(json.dumps({"trials": 2}))
    craft_run(sweep / "trial-000", {})
    good = craft_run(sweep / "trial-001", MLFLOW)
    monkeypatch.setattr(sync_module, "_sink", lambda tracker, tracking: FakeMlflow())
    naps: list[float] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        write_summary(good, "completed")

    results = sync(sweep, follow=True, interval_s=5, sleep=nap)
    assert naps == [5]  # once more after the run ended, then done (the failing trial keeps no one waiting)
    assert [(r.run_dir.name, r.tracker, r.error is not None) for r in results] == [
        ("trial-000", "-", True),
        ("trial-001", "mlflow", False),
    ]
    assert results[1].complete


def test_a_study_syncs_each_submitted_point_as_its_own_tracker_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study = tmp_path / "study"
    study.mkdir()
    points = [{"label": f"nodes-{n}", "run_dir": f"nodes-{n}"} for n in (1, 2, 4)]
    (study / "study.json").write_text(json.dumps({"kind": "study", "version": 1, "points": points}))
    for n, ident in ((1, "1111111111111111"), (2, "2222222222222222")):  # nodes-4 was never submitted
        run = craft_run(study / f"nodes-{n}", MLFLOW, status="completed")
        (run / "run.json").write_text(json.dumps({"tracking_id": ident}))
    monkeypatch.setattr(sync_module, "_sink", lambda tracker, tracking: FakeMlflow())
    results = sync(study)
    assert [(r.run_dir.name, r.through, r.error) for r in results] == [("nodes-1", 15, None), ("nodes-2", 15, None)]
    assert sorted(FakeMlflow.runs) == ["1111111111111111", "2222222222222222"]


def test_a_second_sync_of_the_same_run_leaves_it_to_the_first(tmp_path: Path) -> None:
    from hpctrain.contract.tracking_state import sync_lock

    run = craft_run(tmp_path / "run", MLFLOW, status="completed")
    with sync_lock(run, "mlflow") as mine:
        assert mine
        busy = sync_once(run)
    assert busy.sent == 0 and "another 'hpctrain sync' is sending this run" in busy.waiting
    assert TRACKING_ID not in FakeMlflow.runs and not busy.complete
    assert sync_once(run).through == 15  # the lock went with the first


@pytest.mark.parametrize(
    ("slurm_state", "status", "end"),
    [
        ("PENDING", "stopped", None),  # requeued after a time limit: summary.json says stopped until it restarts
        ("RUNNING", "running", None),
        ("COMPLETING", "completed", None),
        ("COMPLETED", "completed", "completed"),
        ("FAILED", "failed", "failed"),  # status reconciles a job that died without writing its end
        ("unknown (no Slurm here)", "stopped", "stopped"),  # a copied run directory: the summary says
    ],
)
def test_a_run_ends_when_its_summary_says_so_and_slurm_will_not_start_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slurm_state: str, status: str, end: str | None
) -> None:
    from hpctrain.contract.summary import Summary
    from hpctrain.launch import run_state

    monkeypatch.setattr(run_state, "run_state", lambda run_dir: ({}, slurm_state, Summary(status=status)))
    assert sync_module.run_end(tmp_path) == end
