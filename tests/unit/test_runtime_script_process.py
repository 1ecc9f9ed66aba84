"""runtime/script/process.py: a script's stop signal and heartbeat thread, from the wrapper's variables."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from hpctrain.contract.rundir import heartbeat_path
from hpctrain.contract.script_env import HANG_TIMEOUT_VAR, HEARTBEAT_INTERVAL_VAR, STOP_SIGNAL_VAR
from hpctrain.errors import DistributedSetupError
from hpctrain.runtime import heartbeat
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
