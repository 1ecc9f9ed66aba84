"""Global rank 0 starts the live tracker sender beside training (runtime/tracker_relay.py), never inside it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hpctrain.errors import SpecError
from hpctrain.jobspec import tracking_checks
from hpctrain.jobspec.load import load_job
from hpctrain.runtime import tracker_relay
from hpctrain.runtime.tracker_relay import live_sender_argv, start_live_sender

pytestmark = pytest.mark.usefixtures("isolated")

SPEC = "name: t\ncluster: local\noutput_dir: {out}\ndata: {{root: /d}}\ntracking: {tracking}\n"
LIVE = "{mlflow: {tracking_uri: 'file:///tmp/mlruns'}, live: true, live_interval_s: 15}"


def spec_of(tmp_path: Path, tracking: str, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setattr(tracking_checks, "installed", lambda tracker: True)
    path = tmp_path / "job.yaml"
    path.write_text(SPEC.format(out=tmp_path / "runs", tracking=tracking))
    return load_job(path).spec


def test_rank_0_of_a_live_spec_starts_the_sender_as_its_own_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = spec_of(tmp_path, LIVE, monkeypatch)
    argv = live_sender_argv(spec, tmp_path / "run", is_main=True)
    assert argv == [sys.executable, "-m", "hpctrain.tracking.live", str(tmp_path / "run"), "--interval", "15"]
    assert live_sender_argv(spec, tmp_path / "run", is_main=False) is None
    plain = spec_of(tmp_path, "{mlflow: {tracking_uri: 'file:///tmp/mlruns'}}", monkeypatch)
    assert live_sender_argv(plain, tmp_path / "run", is_main=True) is None


def test_live_without_a_tracker_is_refused_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SpecError) as caught:
        spec_of(tmp_path, "{live: true}", monkeypatch)
    assert "add tracking.mlflow or .wandb" in str(caught.value)


def test_a_sender_that_cannot_start_is_a_warning_not_a_failed_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = spec_of(tmp_path, LIVE, monkeypatch)

    def no_fork(*args: object, **kwargs: object) -> None:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(tracker_relay, "start_child", no_fork)
    assert start_live_sender(spec, tmp_path / "run", is_main=True) is None
    assert "tracking.live: the sender did not start" in capsys.readouterr().err


def test_the_sender_starts_logs_into_the_run_and_ends_on_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import time

    spec = spec_of(tmp_path, LIVE, monkeypatch)
    run_dir = tmp_path / "run"  # no spec.yaml: each sync fails, and is counted
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    sender = start_live_sender(spec, run_dir, is_main=True)
    assert sender is not None
    try:
        state = run_dir / ".hpctrain" / "tracking" / "live.json"
        deadline = time.monotonic() + 120
        while not state.exists():
            assert time.monotonic() < deadline and sender.poll() is None, "the sender wrote no state"
            time.sleep(0.2)
        sender.terminate()
        assert sender.wait(timeout=90) == 0
    finally:
        sender.kill()
    assert json.loads(state.read_text())["failed_syncs"] >= 1
    assert "not synced" in (run_dir / ".hpctrain" / "tracking" / "live.log").read_text()
