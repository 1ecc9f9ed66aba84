"""Starting a child (hpctrain/contract/child_process.py): it ends when its parent is SIGKILLed, and a stop
signal that lands during the start waits until the child exists, then arrives; nothing hangs. Real small
processes: a parent script that starts a child with :func:`start_child`, signalled as a user would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.contract.child_process import STOP_SIGNALS
from tests.process_helpers import alive, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")

MARK = "hpctrain-child-process-test"  # in the child's argv: the test signals only a process that carries it

# Starts a sleeping child, says its PID, and sleeps until it is killed.
PARENT = f"""
import sys, time
from hpctrain.contract.child_process import start_child
child = start_child([sys.executable, "-c", "import time; time.sleep(120)", "{MARK}"])
print(child.pid, flush=True)
time.sleep(120)
"""

# A stop signal sent to itself from inside the fork handlers, i.e. in the middle of the start. The handler
# notes whether the child already existed then; the child prints the stop signals it has blocked at exec.
DURING_THE_START = """
import os, signal, subprocess, sys
from hpctrain.contract.child_process import start_child
signum = int(sys.argv[1])
seen = []
def handler(number, frame):
    children = open(f"/proc/self/task/{os.getpid()}/children").read().split()
    seen.append("delivered after the child started" if children else "delivered before the child existed")
    if number == signal.SIGINT:
        raise KeyboardInterrupt
signal.signal(signum, handler)
os.register_at_fork(before=lambda: os.kill(os.getpid(), signum))
blocked = "import signal; print(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))"
try:
    child = start_child([sys.executable, "-c", blocked], stdout=subprocess.PIPE, text=True)
except KeyboardInterrupt:
    print("interrupted", seen, "children left:", open(f"/proc/self/task/{os.getpid()}/children").read().split())
    sys.exit(0)
print(seen, "child blocked:", child.communicate()[0].strip())
print("parent blocked:", sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))
"""


def carries_mark(pid: int) -> bool:
    try:
        return MARK in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def test_the_child_ends_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        child = int(parent.stdout.readline())  # type: ignore[union-attr]
        assert alive(child) and carries_mark(child)
        parent.kill()  # SIGKILL: no handler, no clean-up of its own
        parent.wait(timeout=30)
        wait_until(lambda: not alive(child), timeout=30)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child and alive(child) and carries_mark(child):
            os.kill(child, signal.SIGKILL)
        parent.stdout.close()  # type: ignore[union-attr]


@pytest.mark.parametrize("signum", sorted(STOP_SIGNALS), ids=lambda s: signal.Signals(s).name)
def test_a_stop_signal_during_the_start_arrives_after_it(signum: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", DURING_THE_START, str(int(signum))], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    if signum == signal.SIGINT:  # the handler raised: the new child is killed and reaped, not left behind
        assert done.stdout.strip() == "interrupted ['delivered after the child started'] children left: []"
    else:
        lines = done.stdout.splitlines()
        assert lines == [
            "['delivered after the child started'] child blocked: []",  # the child starts with the old mask
            "parent blocked: []",
        ], done.stdout + done.stderr
