"""Stop requests: handlers only set flags; the cancel marker turns SIGTERM into 'cancelled'."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctrain.contract.cancel_marker import (
    cancel_marker,
    cancel_marker_paths,
    clear_cancel_marker,
    marker_applies,
    write_cancel_marker,
)
from hpctrain.contract.rundir import cancel_marker_path
from hpctrain.runtime.stop import StopRequest, install_handlers, restore_handlers


@pytest.fixture
def handlers() -> Iterator[StopRequest]:
    stop = StopRequest()
    previous = install_handlers(stop, "USR2")
    yield stop
    restore_handlers(previous)


def test_no_signal_no_reason() -> None:
    assert StopRequest().local_reason is None


def test_time_limit_signal_only_sets_the_flag(handlers: StopRequest) -> None:
    os.kill(os.getpid(), signal.SIGUSR2)  # delivered before os.kill returns to Python code
    assert handlers.local_reason == "timeout"
    assert handlers.timeout_signals == 1 and handlers.term_signals == 0


def test_sigterm_means_preempted(handlers: StopRequest) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    assert handlers.local_reason == "preempted"
    assert handlers.term_signals == 1


def test_usr1_can_be_the_time_limit_signal() -> None:
    stop = StopRequest()
    previous = install_handlers(stop, "USR1")
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.local_reason == "timeout"
    finally:
        restore_handlers(previous)


def test_restore_puts_back_the_old_handlers() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR2)
    previous = install_handlers(StopRequest())
    assert signal.getsignal(signal.SIGTERM) is not before[0]
    restore_handlers(previous)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR2)) == before


def test_stronger_reason_wins_and_never_downgrades() -> None:
    stop = StopRequest()
    stop.request("preempted")
    stop.request("timeout")
    assert stop.local_reason == "preempted"
    stop.request("cancelled")
    stop.request("preempted")
    assert stop.local_reason == "cancelled"


def test_cancel_marker_turns_sigterm_into_cancelled(tmp_path: Path, handlers: StopRequest) -> None:
    handlers.cancel_markers = cancel_marker_paths(tmp_path)
    handlers.job_ids = ("1234",)
    write_cancel_marker(tmp_path, ["1234"])
    os.kill(os.getpid(), signal.SIGTERM)
    assert handlers.local_reason == "cancelled"


def test_marker_seen_late_still_upgrades(tmp_path: Path) -> None:
    stop = StopRequest(cancel_markers=cancel_marker_paths(tmp_path), job_ids=["7"])
    stop.note_term()
    assert stop.local_reason == "preempted"  # marker not visible yet (slow NFS)
    write_cancel_marker(tmp_path, ["7"])
    assert stop.local_reason == "cancelled"


def test_marker_does_not_turn_a_timeout_into_a_cancel(tmp_path: Path) -> None:
    write_cancel_marker(tmp_path)
    stop = StopRequest(cancel_markers=cancel_marker_paths(tmp_path), job_ids=["7"])
    stop.note_timeout()
    assert stop.local_reason == "timeout"


def test_marker_for_another_job_is_ignored(tmp_path: Path) -> None:
    write_cancel_marker(tmp_path, ["99"])
    stop = StopRequest(cancel_markers=cancel_marker_paths(tmp_path), job_ids=["7", "5_3"])
    stop.note_term()
    assert stop.local_reason == "preempted"


def test_marker_rules(tmp_path: Path) -> None:
    path = cancel_marker(tmp_path)
    assert path == cancel_marker_path(tmp_path)
    assert not marker_applies(path, ["1"])
    write_cancel_marker(tmp_path, [])
    assert marker_applies(path, ["1"])  # no ids: the whole run
    assert json.loads(path.read_text())["job_ids"] == []
    path.write_text("not json")
    assert marker_applies(path, ["1"])  # someone meant to cancel
    write_cancel_marker(tmp_path, ["5"])
    assert marker_applies(path, ["4", "5"])
    clear_cancel_marker(tmp_path)
    assert not path.exists()
    clear_cancel_marker(tmp_path)  # idempotent


def test_sweep_trial_obeys_the_sweep_marker(tmp_path: Path) -> None:
    trial = tmp_path / "trial-003"
    write_cancel_marker(tmp_path, ["1234"])
    stop = StopRequest(cancel_markers=cancel_marker_paths(trial), job_ids=["1240", "1234", "1234_3"])
    assert stop.cancel_requested()


def test_agreed_without_process_group_is_the_local_reason(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    stop = StopRequest()
    assert stop.agreed() is None
    stop.note_timeout()
    assert stop.agreed() == "timeout"


def test_an_entry_points_own_sigterm_handler_is_named_once(
    handlers: StopRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """An entry point that installs its own SIGTERM handler takes the stop away from the run: said once."""
    assert handlers.agreed() is None and capsys.readouterr().err == ""  # the launcher's own: nothing to say

    def on_term(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGTERM, on_term)
    os.kill(os.getpid(), signal.SIGTERM)
    assert handlers.agreed() is None  # the run did not hear it
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SIGTERM's handler was replaced after the launcher installed its own" in err
    assert "test_runtime_stop.test_an_entry_points_own_sigterm_handler_is_named_once.<locals>.on_term" in err
    assert "no longer hears SIGTERM (preemption, the time limit, hpctrain cancel)" in err
    handlers.agreed()
    assert capsys.readouterr().err == "", "once"
