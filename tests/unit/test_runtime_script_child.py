"""The script's process (hpctrain/runtime/script/child.py): its own session, a stop that reaches its whole
group, signals it starts with ignored, its last lines read back, its silence measured. Real small processes
(sh and python, no torch)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from hpctrain.runtime.script.child import (
    ExitStatus,
    OutputTail,
    ScriptProcess,
    Silence,
    ignored_signals,
    launch_argv,
)
from tests.process_helpers import alive, wait_until

# A script that starts a child in its group, writes both PIDs, and exits 0 on SIGTERM (its child too).
FAMILY = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
time.sleep(60)
"""


def test_exit_status_words() -> None:
    assert ExitStatus.of(0).ok and ExitStatus.of(0).describe() == "exited with code 0"
    assert ExitStatus.of(3).describe() == "exited with code 3"
    assert ExitStatus.of(-9).describe() == "killed by SIGKILL" and not ExitStatus.of(-9).ok


def test_what_the_script_starts_with_ignored() -> None:
    assert ignored_signals("USR2", "TERM") == ["USR2"]
    assert ignored_signals("USR2", "USR1") == ["USR2", "TERM"]  # Slurm's own SIGTERM must not kill it first
    assert launch_argv(["py", "x.py"], []) == ["py", "x.py"]
    assert launch_argv(["py", "a b"], ["USR2"])[-2:] == ["py", "a b"]


def test_the_stop_signal_reaches_the_scripts_whole_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    process = ScriptProcess([sys.executable, "-c", FAMILY, str(pids)], dict(os.environ), str(tmp_path))
    process.start()
    wait_until(lambda: pids.exists() and pids.read_text())
    script, child = map(int, pids.read_text().split())
    assert os.getpgid(script) == script == process.pid and os.getpgid(child) == script
    assert os.getsid(script) == script != os.getsid(0), "a session of its own"
    assert process.signal_group(signal.SIGTERM)
    wait_until(lambda: process.poll() is not None)
    assert process.poll() == ExitStatus(0, None)
    wait_until(lambda: not alive(child))  # the child got the signal too, not only the script
    process.kill_group()
    assert not process.signal_group(0), "nothing of the group is left"


def test_the_time_limit_signal_is_ignored_but_the_stop_signal_is_not(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = "import signal,sys,time; signal.signal(signal.SIGUSR1, lambda *a: sys.exit(5)); "
    code += "open(sys.argv[1], 'w').close(); time.sleep(60)"
    ignored = ignored_signals("USR2", "USR1")
    process = ScriptProcess([sys.executable, "-c", code, str(ready)], dict(os.environ), str(tmp_path), ignored)
    process.start()
    wait_until(ready.exists)
    process.signal_group(signal.SIGUSR2)
    process.signal_group(signal.SIGTERM)
    time.sleep(0.3)
    assert process.poll() is None, "the time-limit signal and (with stop_signal USR1) SIGTERM are ignored"
    process.signal_group(signal.SIGUSR1)
    wait_until(lambda: process.poll() is not None)
    assert process.poll() == ExitStatus(5, None)


def test_a_script_that_ignores_its_stop_signal_is_killed_as_a_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    ignoring = FAMILY.replace("lambda *a: sys.exit(0)", "signal.SIG_IGN")
    process = ScriptProcess([sys.executable, "-c", ignoring, str(pids)], dict(os.environ), str(tmp_path))
    process.start()
    wait_until(lambda: pids.exists() and pids.read_text())
    script, child = map(int, pids.read_text().split())
    process.signal_group(signal.SIGTERM)
    time.sleep(0.2)
    assert process.poll() is None
    process.kill_group()
    assert process.poll() == ExitStatus(None, "SIGKILL")
    wait_until(lambda: not alive(child))


def test_the_last_lines_are_what_was_written_since_the_mark(tmp_path: Path) -> None:
    log = tmp_path / "task.err"
    with open(log, "w") as handle:
        handle.write("an earlier attempt's line\n")
        handle.flush()
        tail = OutputTail(handle.fileno())
        tail.mark()
        handle.write("".join(f"line {n}\n" for n in range(30)) + "\n  \n" + "x" * 1000 + "\n")
        handle.flush()
        lines = tail.lines(3)
    assert lines == ["line 28", "line 29", "x" * 400], "the last non-blank lines, each bounded"


def test_no_last_lines_from_a_pipe() -> None:
    read, write = os.pipe()
    try:
        tail = OutputTail(write)
        tail.mark()
        os.write(write, b"hello\n")
        assert tail.lines() == []
    finally:
        os.close(read)
        os.close(write)


def test_silence_counts_from_the_last_byte_or_heartbeat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    log, beat = tmp_path / "log", tmp_path / "rank-00000.json"
    with open(log, "w") as handle:
        silence = Silence(beat, fds=(handle.fileno(),))
        now[0] = 130.0
        assert silence.seconds() == 30.0
        handle.write("x")
        handle.flush()
        assert silence.seconds() == 0.0
        now[0] = 150.0
        beat.write_text("{}")
        assert silence.seconds() == 0.0, "a heartbeat is a sign of life"
        now[0] = 170.0
        assert silence.seconds() == 20.0
    read, write = os.pipe()
    try:
        assert Silence(None, fds=(write,)).seconds() is None, "cannot be measured on a pipe"
    finally:
        os.close(read)
        os.close(write)
