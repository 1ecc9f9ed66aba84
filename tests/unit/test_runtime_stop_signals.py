"""Stop signals from a process's first moment (runtime/stop_signals.py), in real processes.

Each scenario runs in a child Python: signals, masks and handlers are per
process, and a test must not leave a handler behind in pytest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpctrain.jobscript.sbatch_script import python_command
from hpctrain.runtime import stop_signals
from hpctrain.runtime.stop import StopRequest

# What submitit does before hpctrain runs: its own handlers, which drop SIGTERM ("Bypassing signal").
SUBMITIT_LIKE = """
import json, os, signal, sys
dropped = []
for signum in (signal.SIGTERM, signal.SIGUSR2):
    signal.signal(signum, lambda s, f: dropped.append(signal.Signals(s).name))
os.kill(os.getpid(), signal.SIGTERM)   # the preemption, while the task still imports
os.kill(os.getpid(), signal.SIGUSR2)   # the time-limit warning
os.kill(os.getpid(), signal.SIGTERM)
from hpctrain.runtime import stop_signals
recorder = stop_signals.listen()       # the task launcher's first line
print(json.dumps({"dropped": dropped, "counted": recorder.seen(), "seen_var": os.environ.get(stop_signals.SEEN_VAR)}))
"""


def run_python(code: str, *, wrapper: list[str] | None = None, env: dict[str, str] | None = None) -> dict:
    command = [*(wrapper or [sys.executable]), "-c", textwrap.dedent(code)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_signals_held_by_the_exec_wrapper_wait_for_the_task_to_listen() -> None:
    wrapper = python_command(hold_stop_signals=True).split()
    assert "--hold-stop-signals" in wrapper
    out = run_python(SUBMITIT_LIKE, wrapper=wrapper)
    # Held across exec: submitit's handlers never saw them, and none was lost (a second SIGTERM
    # pending at the same time is one signal: Linux keeps one of each).
    assert out["dropped"] == []
    assert out["counted"] == {"TERM": 1, "USR2": 1}


def test_without_the_hold_submitit_drops_them() -> None:
    out = run_python(SUBMITIT_LIKE, wrapper=python_command().split())
    assert out["dropped"] == ["SIGTERM", "SIGUSR2", "SIGTERM"] and out["counted"] == {}


def test_a_child_takes_over_what_its_parent_counted_and_does_not_pass_it_on() -> None:
    env = stop_signals.child_environ(dict(os.environ), {"TERM": 2, "USR1": 0})
    assert env[stop_signals.SEEN_VAR] == "TERM=2"
    out = run_python(SUBMITIT_LIKE.replace("os.kill", "(lambda *a: None)"), env=env)
    assert out["counted"] == {"TERM": 2} and out["seen_var"] is None


@pytest.mark.parametrize(
    ("text", "counts"),
    [("TERM=1,USR2=3", {"TERM": 1, "USR2": 3}), ("", {}), ("TERM=x,=2,USR1", {}), ("TERM=1,TERM=1", {"TERM": 2})],
)
def test_seen_counts_parse_leniently(text: str, counts: dict[str, int]) -> None:
    assert stop_signals.parse_seen(text) == counts
    assert stop_signals.parse_seen(stop_signals.format_seen(counts)) == counts


@pytest.mark.parametrize(("timeout_signal", "reason"), [("USR2", "timeout"), ("USR1", None)])
def test_hand_over_gives_the_stop_request_what_was_counted(
    monkeypatch: pytest.MonkeyPatch, timeout_signal: str, reason: str | None
) -> None:
    monkeypatch.setattr(stop_signals, "_recorder", stop_signals.Recorder({"USR2": 1}))
    stop = StopRequest()
    assert stop_signals.hand_over(stop, timeout_signal) == {"USR2": 1}
    assert stop.local_reason == reason  # the other USR signal is nobody's time limit
    monkeypatch.setattr(stop_signals, "_recorder", stop_signals.Recorder({"TERM": 1, "USR2": 2}))
    stop = StopRequest()
    stop_signals.hand_over(stop, "USR2")
    assert (stop.local_reason, stop.term_signals, stop.timeout_signals) == ("preempted", 1, 2)


RELAY = """
import json, os, signal, subprocess, sys, time
from hpctrain.runtime import stop_signals
COUNT = '''
import json, os, signal, sys, time
from hpctrain.runtime import stop_signals
open(sys.argv[1] + ".up", "w").close()
while not os.path.exists(sys.argv[1] + ".go"):
    time.sleep(0.01)
rec = stop_signals.listen()
print(json.dumps(rec.seen()), flush=True)
'''
folder = sys.argv[1]


def wait_sent(child):  # the relay has sent this child both signals (while it still holds them)
    deadline = time.monotonic() + 20
    while len(relay.sent.get(child.pid, {})) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)


stop_signals.listen()
stop_signals.hold()                        # children start held
early = subprocess.Popen([sys.executable, "-c", COUNT, folder + "/early"], stdout=subprocess.PIPE, text=True)
children = [early]
relay = stop_signals.Relay(lambda: [c.pid for c in children], (signal.SIGTERM, signal.SIGUSR2), poll_s=0.05).start()
while not os.path.exists(folder + "/early.up"):
    time.sleep(0.01)
os.kill(os.getpid(), signal.SIGTERM)       # reaches the early child
os.kill(os.getpid(), signal.SIGUSR2)
wait_sent(early)
stop_signals.hold()
late = subprocess.Popen([sys.executable, "-c", COUNT, folder + "/late"], stdout=subprocess.PIPE, text=True)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGUSR2})
children.append(late)                      # appears after the signals: gets them late, once
wait_sent(late)
for name in ("early", "late"):
    open(f"{folder}/{name}.go", "w").close()
out = {name: json.loads(c.communicate(timeout=30)[0]) for name, c in (("early", early), ("late", late))}
relay.stop()
print(json.dumps({**out, "sent": {str(k): v for k, v in relay.sent.items()}, "pids": [c.pid for c in children]}))
"""


def test_a_relay_gives_each_child_each_signal_once_also_a_child_that_came_late(tmp_path: Path) -> None:
    script = tmp_path / "relay.py"
    script.write_text(RELAY)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["early"] == {"TERM": 1, "USR2": 1}
    assert out["late"] == {"TERM": 1, "USR2": 1}
    term, usr2 = str(int(signal.SIGTERM)), str(int(signal.SIGUSR2))
    for pid in out["pids"]:
        assert out["sent"][str(pid)] == {term: 1, usr2: 1}


def test_a_module_run_under_stop_signals_counts_from_its_first_line(tmp_path: Path) -> None:
    (tmp_path / "first_line_mod.py").write_text(
        "import json, os, signal\n"
        "os.kill(os.getpid(), signal.SIGTERM)  # before any handler of its own\n"
        "from hpctrain.runtime import stop_signals\n"
        "print(json.dumps(stop_signals.recorded()))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain.runtime.stop_signals", "first_line_mod"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"TERM": 1}
