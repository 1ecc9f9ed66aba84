"""runtime/script/process.py: a script's stop signal and heartbeat thread, from the wrapper's variables."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctrain.contract.rundir import heartbeat_path
from hpctrain.contract.script_env import HANG_TIMEOUT_VAR, HEARTBEAT_INTERVAL_VAR, STOP_SIGNAL_VAR
from hpctrain.errors import DistributedSetupError
from hpctrain.runtime import heartbeat
from hpctrain.runtime.script import process
from hpctrain.runtime.script.process import install_stop_signal, seconds, start_script_monitor, stop_signal
from hpctrain.runtime.stop import StopRequest


@pytest.mark.parametrize(("value", "expected"), [(None, "SIGTERM"), ("INT", "SIGINT"), ("sigusr1", "SIGUSR1")])
def test_the_stop_signal_is_one_of_the_offered(value: str | None, expected: str) -> None:
    assert stop_signal({} if value is None else {STOP_SIGNAL_VAR: value}).name == expected


def test_another_stop_signal_is_refused_by_name() -> None:
    with pytest.raises(DistributedSetupError, match="HPCTRAIN_STOP_SIGNAL='HUP' is not one of TERM, INT, USR1"):
        stop_signal({STOP_SIGNAL_VAR: "HUP"})


def test_the_stop_signal_becomes_a_stop_request() -> None:
    stop = StopRequest()
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        assert install_stop_signal(stop, signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.local_reason == "preempted"
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.fixture
def usr1() -> Iterator[None]:
    """SIGUSR1 at its default for the test (an earlier test may have left a handler), put back after it."""
    previous = signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGUSR1, previous)


def test_the_scripts_own_handler_still_runs_after_hpctrains_note(usr1: None) -> None:
    """A script's own graceful stop is kept: hpctrain notes the stop, then calls it, and says so once."""
    own: list[int] = []

    def save_and_flag(signum: int, frame: object) -> None:
        own.append(signum)

    signal.signal(signal.SIGUSR1, save_and_flag)
    said: list[str] = []
    stop = StopRequest()
    handler = install_stop_signal(stop, signal.SIGUSR1, say=said.append)
    assert handler is not None and signal.getsignal(signal.SIGUSR1) is handler
    assert said == [
        "SIGUSR1 already has this process's own handler (test_runtime_script_process."
        "test_the_scripts_own_handler_still_runs_after_hpctrains_note.<locals>.save_and_flag): it still runs, "
        "after hpctrain.task notes the stop for task.should_stop()"
    ]
    os.kill(os.getpid(), signal.SIGUSR1)
    assert own == [signal.SIGUSR1] and stop.local_reason == "preempted" and stop.term_signals == 1
    assert handler.check() and len(said) == 1  # still hpctrain's: nothing more to say


def test_an_exception_from_the_scripts_handler_reaches_the_script_after_the_note(usr1: None) -> None:
    def leave(signum: int, frame: object) -> None:
        raise SystemExit(0)  # a script whose handler saves and exits

    signal.signal(signal.SIGUSR1, leave)
    stop = StopRequest()
    install_stop_signal(stop, signal.SIGUSR1, say=lambda text: None)
    with pytest.raises(SystemExit):
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(1)  # the handler runs between bytecodes: at the latest here
    assert stop.local_reason == "preempted"


def test_a_first_call_from_another_thread_says_why_the_stop_signal_is_not_heard(usr1: None) -> None:
    said: list[str] = []
    found: list[object] = []
    thread = threading.Thread(
        target=lambda: found.append(install_stop_signal(StopRequest(), signal.SIGUSR1, say=said.append)),
        name="loader",
    )
    thread.start()
    thread.join()
    assert found == [None] and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    assert len(said) == 1 and "thread 'loader', not the main thread" in said[0] and "SIGUSR1" in said[0]
    assert "hpctrain cancel), which ends the process at once (no stop checkpoint)" in said[0]


def test_a_second_install_takes_over_the_scripts_handler_once(usr1: None) -> None:
    """hpctrain.task resolved again (a new session) chains to the script's handler, not to its own old one."""
    own: list[int] = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: own.append(signum))
    first, second = StopRequest(), StopRequest()
    install_stop_signal(first, signal.SIGUSR1, say=lambda text: None)
    said: list[str] = []
    install_stop_signal(second, signal.SIGUSR1, say=said.append)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert own == [signal.SIGUSR1] and second.term_signals == 1 and first.term_signals == 0
    assert len(said) == 1 and "<lambda>" in said[0]


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGINT])
def test_a_default_disposition_is_replaced_without_a_word(signum: signal.Signals) -> None:
    """SIG_DFL (which would end the script) and Python's KeyboardInterrupt for SIGINT are not the script's own."""
    previous = signal.signal(signum, signal.SIG_DFL if signum == signal.SIGUSR1 else signal.default_int_handler)
    try:
        said: list[str] = []
        stop = StopRequest()
        handler = install_stop_signal(stop, signum, say=said.append)
        assert handler is not None and handler.previous is None and said == []
        os.kill(os.getpid(), signum)  # no KeyboardInterrupt, no end: a stop request
        assert stop.local_reason == "preempted"
    finally:
        signal.signal(signum, previous)


def test_an_ignored_stop_signal_becomes_a_stop_request_and_says_so(usr1: None) -> None:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    said: list[str] = []
    stop = StopRequest()
    install_stop_signal(stop, signal.SIGUSR1, say=said.append)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert stop.local_reason == "preempted"
    assert said == [
        "SIGUSR1 was ignored in this process; hpctrain.task now notes it as a stop request instead (processes "
        "started from here on no longer inherit the ignore)"
    ]


def test_a_handler_installed_after_hpctrains_is_named_once(usr1: None) -> None:
    said: list[str] = []
    handler = install_stop_signal(StopRequest(), signal.SIGUSR1, say=said.append)
    assert handler is not None and handler.check() and said == []

    def mine(signum: int, frame: object) -> None: ...

    signal.signal(signal.SIGUSR1, mine)
    assert not handler.check() and not handler.check()
    assert len(said) == 1
    assert said[0].startswith("SIGUSR1's handler was replaced after hpctrain.task installed its own (")
    assert "mine): task.should_stop() hears the job's stop signal only if that handler calls" in said[0]
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    fresh = install_stop_signal(StopRequest(), signal.SIGUSR1, say=said.append)
    assert fresh is not None
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    assert not fresh.check()
    assert said[-1] == (
        "SIGUSR1 was set to SIG_IGN after hpctrain.task installed its handler: task.should_stop() no longer "
        "hears the job's stop signal"
    )


def test_a_signal_during_the_handover_runs_the_scripts_handler_exactly_once(
    usr1: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal just before the swap goes to the script's handler alone; one just after, to hpctrain's note and
    then the script's: each signal once to the script, none lost, none twice."""
    own: list[int] = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: own.append(signum))
    real = signal.signal

    def swap_between_two_signals(signum: int, handler: object) -> object:
        os.kill(os.getpid(), signum)
        time.sleep(0.05)  # delivered here, before the swap
        found = real(signum, handler)  # type: ignore[arg-type]
        os.kill(os.getpid(), signum)
        time.sleep(0.05)  # delivered here: after the swap, before install_stop_signal set what it calls on
        return found

    monkeypatch.setattr(process.signal, "signal", swap_between_two_signals)
    stop = StopRequest()
    install_stop_signal(stop, signal.SIGUSR1, say=lambda text: None)
    assert own == [signal.SIGUSR1, signal.SIGUSR1] and stop.term_signals == 1


def test_seconds_are_positive_numbers_or_off() -> None:
    assert seconds({"X": "2.5"}, "X") == 2.5
    assert seconds({"X": "0"}, "X") is None and seconds({}, "X") is None
    with pytest.raises(DistributedSetupError, match="X='-1' is not a number of seconds"):
        seconds({"X": "-1"}, "X")


def test_the_monitor_writes_heartbeats_into_the_run_only(tmp_path: Path) -> None:
    env = {HEARTBEAT_INTERVAL_VAR: "0.2", HANG_TIMEOUT_VAR: "600"}
    assert start_script_monitor(tmp_path / "missing", env, rank=0, node="n1", pid=1, job_id="j") is None
    monitor = start_script_monitor(tmp_path, env, rank=3, node="n1", pid=os.getpid(), job_id="j")
    assert monitor is not None and monitor.watchdog is not None and monitor.interval_s == 0.2
    heartbeat.step(1)
    deadline = time.monotonic() + 10
    while not heartbeat_path(tmp_path, 3).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    monitor.stop()
    assert '"phase": "done"' in heartbeat_path(tmp_path, 3).read_text()
