"""``hpctrain sync`` into the real things: an MLflow tracking server (SQLite store, started here on
127.0.0.1 and stopped after) and W&B's offline run folder, read back with W&B's own reader
(``wandb leet inspect --json``, the wandb-core program). No W&B server is reachable from the test bed.

The run directory is crafted as the trainer leaves it after a hard kill (tests/tracking_helpers.py):
two attempts, steps 7-10 redone with other values, a lost node at step 9.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpctrain.contract.tracking_state import read_cursor
from hpctrain.tracking import sync as sync_module
from hpctrain.tracking.sync import load_run, sync_tracker
from tests.net_helpers import free_port
from tests.tracking_helpers import TRACKING_ID, craft_run, last_loss, mlflow_server, wandb_records, write_summary

mlflow = pytest.importorskip("mlflow")
BIN = Path(sys.executable).parent
SECRET = "s3cret-never-stored"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``mlflow server`` with a SQLite backend; its URI."""
    if shutil.which("mlflow", path=str(BIN)) is None:
        pytest.skip("the mlflow server is not installed (pip install mlflow)")
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


@pytest.fixture
def no_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


def hpctrain_sync(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[2]
    environment = {**os.environ, "PYTHONPATH": str(root), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", "sync", *args], capture_output=True, text=True, env=environment, timeout=300
    )


def tracked_run(uri: str, experiment: str) -> Any:
    client = mlflow.tracking.MlflowClient(uri)
    found = client.search_runs(
        [client.get_experiment_by_name(experiment).experiment_id], f"tags.`hpctrain.tracking_id` = '{TRACKING_ID}'"
    )
    assert len(found) == 1, "one MLflow run per hpctrain run"
    return client, found[0]


def steps_of(client: Any, run: Any, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


def test_a_restarted_run_is_one_mlflow_run_with_each_step_once_at_its_last_value(server: str, tmp_path: Path) -> None:
    tracking = {"mlflow": {"tracking_uri": server, "experiment": "restarts", "tags": {"team": "hal"}}}
    run = craft_run(tmp_path / "run", tracking)
    (run / "report").mkdir()
    (run / "report" / "loss.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    env = {"MLFLOW_TRACKING_USERNAME": "bob", "MLFLOW_TRACKING_PASSWORD": SECRET}
    first = hpctrain_sync(str(run), env=env)
    assert first.returncode == 0, first.stderr
    assert "sent 6 step(s), through step 6" in first.stdout and "steps 7-15 wait" in first.stdout
    client, tracked = tracked_run(server, "restarts")
    assert steps_of(client, tracked, "train/loss") == [(step, last_loss(step)) for step in range(1, 7)]
    assert tracked.info.status == "RUNNING"
    write_summary(run, "completed", stop_reason="finished", val_top1=50.0)
    second = hpctrain_sync(str(run), "--json", env=env)
    assert second.returncode == 0, second.stderr
    [state] = json.loads(second.stdout)
    assert (state["sent"], state["through"], state["final"]) == (9, 15, "completed")
    client, tracked = tracked_run(server, "restarts")
    assert steps_of(client, tracked, "train/loss") == [(step, last_loss(step)) for step in range(1, 16)]
    assert steps_of(client, tracked, "val/top1") == [(15, 50.0)]
    assert steps_of(client, tracked, "hpctrain/restart") == [(7, 1.0)]
    assert steps_of(client, tracked, "hpctrain/redone_steps") == [(7, 4.0)]
    assert steps_of(client, tracked, "hpctrain/node_lost") == [(9, 1.0)]
    assert tracked.info.status == "FINISHED" and tracked.info.run_name == f"trk/{run.name}"
    tags, params = tracked.data.tags, tracked.data.params
    assert tags["team"] == "hal" and tags["hpctrain.lost_nodes"] == "c2" and tags["hpctrain.stop_reason"] == "finished"
    assert params["trainer.lr"] == "0.1" and tracked.data.metrics["summary/val_top1"] == 50.0
    assert [a.path for a in client.list_artifacts(tracked.info.run_id, "report")] == ["report/loss.png"]
    again = hpctrain_sync(str(run), env=env)
    assert "sent 0 step(s)" in again.stdout
    stored = [p for p in run.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not stored, f"the password landed in {stored}"


def test_a_sync_killed_after_the_server_stored_a_batch_sends_nothing_twice(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = craft_run(tmp_path / "run", {"mlflow": {"tracking_uri": server, "experiment": "killed"}}, status="completed")
    monkeypatch.setattr(sync_module, "_chunks", lambda steps: ([entry] for entry in steps))
    real_write = sync_module.write_cursor
    writes = {"n": 0}

    def killed_after_the_ack(run_dir: Path, cursor: Any) -> None:
        writes["n"] += 1
        if writes["n"] == 4:  # the server has the batch of step 4; the cursor says 3
            raise KeyboardInterrupt
        real_write(run_dir, cursor)

    monkeypatch.setattr(sync_module, "write_cursor", killed_after_the_ack)
    with pytest.raises(KeyboardInterrupt):
        sync_tracker(load_run(run), "mlflow")
    assert read_cursor(run, "mlflow").sent_step == 3
    monkeypatch.setattr(sync_module, "write_cursor", real_write)
    assert sync_tracker(load_run(run), "mlflow").through == 15
    client, tracked = tracked_run(server, "killed")
    history = client.get_metric_history(tracked.info.run_id, "train/loss")
    assert Counter(m.step for m in history) == dict.fromkeys(range(1, 16), 1)
    shutil.rmtree(run / ".hpctrain")  # the cursor lost too: the run's tag says where it stands
    assert sync_tracker(load_run(run), "mlflow").sent == 0
    client, tracked = tracked_run(server, "killed")
    assert Counter(m.step for m in client.get_metric_history(tracked.info.run_id, "train/loss")) == dict.fromkeys(
        range(1, 16), 1
    )


@pytest.mark.usefixtures("no_retries")
def test_a_server_that_is_down_is_a_clear_error_and_nothing_is_recorded(tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    run = craft_run(tmp_path / "run", {"mlflow": {"tracking_uri": uri}}, status="completed")
    started = time.monotonic()
    done = hpctrain_sync(str(run), env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"})
    assert done.returncode != 0 and time.monotonic() - started < 120
    assert f"error: MLflow at {uri}: opening the run failed" in done.stderr and "Traceback" not in done.stderr
    assert "nothing is sent twice" in done.stderr
    assert not (run / ".hpctrain" / "tracking" / "mlflow.json").exists()


def test_a_wandb_offline_run_is_one_folder_one_id_each_step_once(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    if not (BIN / "wandb").exists():
        pytest.skip("the wandb command is not installed")
    run = craft_run(tmp_path / "run", {"wandb": {"project": "smoke", "mode": "offline", "tags": ["hal"]}})
    first = hpctrain_sync(str(run), env={"WANDB_API_KEY": SECRET})
    assert first.returncode == 0, first.stderr
    write_summary(run, "completed")
    second = hpctrain_sync(str(run), env={"WANDB_API_KEY": SECRET})
    assert second.returncode == 0, second.stderr
    folders = list((run / "wandb").glob("offline-run-*"))
    assert len(folders) == 1 and folders[0].name.endswith(TRACKING_ID)  # the earlier sync's folder is gone
    records = wandb_records(run / "wandb")
    [started] = [r["run"] for r in records if r["type"] == "run"]
    assert started["run_id"] == TRACKING_ID and started["project"] == "smoke" and started["tags"] == ["hal"]
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    losses = [(item["_step"], item["train/loss"]) for item in history if "train/loss" in item]
    assert losses == [(step, last_loss(step)) for step in range(1, 16)]
    assert [item["_step"] for item in history if "hpctrain/node_lost" in item] == [9]
    stored = [p for p in run.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not stored, f"the API key landed in {stored}"


def live_sender(run: Path, *, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``tracking.live``'s sender, as global rank 0's task starts it (runtime/tracker_relay.py)."""
    root = Path(__file__).resolve().parents[2]
    environment = {**os.environ, "PYTHONPATH": str(root), **(env or {})}
    argv = [sys.executable, "-m", "hpctrain.tracking.live", str(run), "--interval", "1"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment)


def wait_for(condition: Any, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def live_state(run: Path) -> dict[str, Any]:
    path = run / ".hpctrain" / "tracking" / "live.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_the_live_sender_feeds_the_server_as_the_run_goes_and_ends_once_it_has_all(server: str, tmp_path: Path) -> None:
    run = craft_run(tmp_path / "run", {"mlflow": {"tracking_uri": server, "experiment": "live"}, "live": True})
    sender = live_sender(run)
    try:
        wait_for(
            lambda: (
                (run / ".hpctrain" / "tracking" / "mlflow.json").exists() and read_cursor(run, "mlflow").sent_step == 6
            ),
            timeout_s=240,
        )
        assert sender.poll() is None  # the run goes on: so does the sender
        write_summary(run, "completed", stop_reason="finished")
        assert sender.wait(timeout=240) == 0  # everything is in the tracker: it ends by itself
    finally:
        sender.kill()
    client, tracked = tracked_run(server, "live")
    assert steps_of(client, tracked, "train/loss") == [(step, last_loss(step)) for step in range(1, 16)]
    # Each step once, whatever the load. Not "no sync failed": the sender's requests have 10 s each (QUICK_CLIENT),
    # and beside CI's Slurm legs, at nice 10 on both sides, a server's answer can take longer; that sync counts as
    # failed and a later one sends its steps (stop 53's CI).
    state = live_state(run)
    assert state["through"] == {"mlflow": 15} and state["sent_steps"] == 15, state


def test_the_live_sender_survives_a_server_that_is_down_and_ends_when_the_task_does(tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    run = craft_run(tmp_path / "run", {"mlflow": {"tracking_uri": uri}, "live": True})
    sender = live_sender(run)
    try:
        wait_for(lambda: live_state(run).get("failed_syncs", 0) >= 1)
        assert sender.poll() is None  # a tracker that is down never ends it, nor the run
        began = time.monotonic()
        sender.terminate()  # the task ended (the parent's death signal)
        assert sender.wait(timeout=120) == 0 and time.monotonic() - began < 60  # one last sync, bounded
    finally:
        sender.kill()
    state = live_state(run)
    assert state["failed_syncs"] >= 2 and "opening the run failed" in state["last_error"]
    assert not (run / ".hpctrain" / "tracking" / "mlflow.json").exists()  # nothing claimed sent
