"""Global rank 0 starts the live tracker sender beside training (runtime/tracker_relay.py), never inside it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpctrain.errors import SpecError
from hpctrain.jobspec import tracking_checks
from hpctrain.jobspec.load import load_job
from hpctrain.runtime import tracker_relay
from hpctrain.runtime.tracker_relay import LAST_SYNC_WAIT_S, live_sender_argv, start_live_sender, stop_live_sender

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


@pytest.mark.parametrize(
    "failure", [OSError(11, "Resource temporarily unavailable"), subprocess.SubprocessError("in preexec_fn")]
)
def test_a_sender_that_cannot_start_is_a_warning_not_a_failed_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], failure: Exception
) -> None:
    spec = spec_of(tmp_path, LIVE, monkeypatch)

    def no_fork(*args: object, **kwargs: object) -> None:
        raise failure

    monkeypatch.setattr(tracker_relay, "start_child", no_fork)
    assert start_live_sender(spec, tmp_path / "run", is_main=True) is None
    assert "tracking.live: the sender did not start" in capsys.readouterr().err


def test_the_sender_starts_logs_into_the_run_and_ends_on_sigterm_even_if_started_with_it_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = spec_of(tmp_path, LIVE, monkeypatch)
    run_dir = tmp_path / "run"  # no spec.yaml: each sync fails, and is counted
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # a node task holding its stop signals
    try:
        sender = start_live_sender(spec, run_dir, is_main=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
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


STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"


def test_stopping_the_sender_waits_only_as_asked_and_kills_one_that_overstays() -> None:
    from hpctrain.tracking.live import LAST_SYNC_S

    assert LAST_SYNC_WAIT_S > LAST_SYNC_S  # a node task waits out the sender's own bound for its last sync
    stop_live_sender(None)  # nothing started: nothing to do
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stop_live_sender(polite, wait_s=30)
    assert polite.returncode == -15  # SIGTERM, waited for
    stubborn = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline()  # its handler is in place
        began = time.monotonic()
        stop_live_sender(stubborn, wait_s=0.5)
        assert stubborn.returncode == -9 and time.monotonic() - began < 10  # overstayed: killed
        late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        stop_live_sender(late)  # wait_s=0: SIGTERM, no waiting (a requeue or a failure ends the task now)
        assert late.wait(timeout=30) == -15
    finally:
        stubborn.kill()
        stubborn.wait()


HEARS = "import sys; line = sys.stdin.readline(); sys.exit(0 if line == 'ended\\n' else 3)"


def test_a_run_that_ended_for_good_is_said_on_the_senders_stdin_not_with_sigterm() -> None:
    """Inside the job Slurm calls it RUNNING: only the node task can tell the sender the run's end may be sent."""
    told = subprocess.Popen([sys.executable, "-c", HEARS], stdin=subprocess.PIPE)
    stop_live_sender(told, wait_s=30, ended=True)
    assert told.returncode == 0  # it read "ended" and exited by itself: no SIGTERM came
    gone = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE)
    gone.wait(timeout=30)
    stop_live_sender(gone, wait_s=1, ended=True)  # ended meanwhile: nothing to say, no error
    deaf = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # no stdin pipe
    stop_live_sender(deaf, wait_s=30, ended=True)
    assert deaf.returncode == -15  # SIGTERM, as before


def test_a_sender_started_from_a_thread_that_ends_lives_on_until_told() -> None:
    """The parent's death signal follows the starting thread: under torchrun that is the node task's worker
    watch, which ends with torchrun, before the node task tells the sender that the run ended."""
    from hpctrain.runtime.tracker_relay import start_kept

    box: list[subprocess.Popen] = []
    starter = threading.Thread(
        target=lambda: box.append(start_kept([sys.executable, "-c", HEARS], stdin=subprocess.PIPE))
    )
    starter.start()
    starter.join()  # the thread that started it is gone
    [sender] = box
    try:
        time.sleep(1.0)
        assert sender.poll() is None, "the sender got the parent's death signal when its starting thread ended"
        stop_live_sender(sender, wait_s=30, ended=True)
        assert sender.returncode == 0  # it heard "ended"
    finally:
        sender.kill()
        sender.wait()
