"""The per-task reaper ends everything a dead task started, and nothing else.

A fake task starts the kinds of processes that survive ``proctrack/linuxproc``
(a child that called ``setsid``, a double-forked daemon that ignores SIGTERM,
a plain forked child, an exec'd child), then the test SIGKILLs the task the
way Slurm would and checks the detached watcher reaps them all.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from hpctrain.contract import process_tokens
from hpctrain.jobscript.sbatch_script import python_command
from hpctrain.runtime import cleanup

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")

FAKE_TASK = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time

    out, mode = sys.argv[1], sys.argv[2]
    if mode == "set-later":  # started without the token: set it the way the launcher would
        os.environ["HPCTRAIN_TASK_TOKEN"] = sys.argv[3]

    def forever(ignore_term=False):
        if ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)

    pids = {}
    pid = os.fork()
    if pid == 0:
        forever()
    pids["forked_child"] = pid

    pid = os.fork()
    if pid == 0:
        os.setsid()
        forever()
    pids["setsid_child"] = pid

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            forever(ignore_term=True)
        os._exit(0)
    os.close(w)
    pids["daemon"] = int(os.read(r, 64))
    os.waitpid(pid, 0)

    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    pids["exec_child"] = subprocess.Popen([sys.executable, "-c", code], start_new_session=True).pid
    # A detached grandchild started through exec: double fork from a fresh interpreter.
    code = "import os, time\\nif os.fork(): os._exit(0)\\nos.setsid()\\nprint(os.getpid(), flush=True)\\ntime.sleep(99)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pids["exec_daemon"] = int(proc.stdout.readline())
    proc.wait()

    with open(out + ".tmp", "w") as f:
        json.dump(pids, f)
    os.rename(out + ".tmp", out)
    forever()
    """
)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if not _gone(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if not _gone(p)]


def _kill_quietly(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process of the same user that carries no token (or another task's token)."""
    env = dict(os.environ, HPCTRAIN_TASK_TOKEN=process_tokens.new_token())
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
    yield proc
    proc.kill()
    proc.wait()


def _start_task(tmp_path: Path, token: str, mode: str) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    script = tmp_path / "fake_task.py"
    script.write_text(FAKE_TASK)
    out = tmp_path / "pids.json"
    env = {k: v for k, v in os.environ.items() if k != process_tokens.TOKEN_ENV}
    if mode == "exec-time":  # what `python -m hpctrain.runtime.cleanup exec ...` gives a task
        env[process_tokens.TOKEN_ENV] = token
    task = subprocess.Popen([sys.executable, str(script), str(out), mode, token], env=env, start_new_session=True)
    deadline = time.monotonic() + 20
    while not out.exists():
        assert task.poll() is None, "the fake task died while starting its children"
        assert time.monotonic() < deadline, "the fake task did not start its children"
        time.sleep(0.05)
    return task, json.loads(out.read_text())


@pytest.mark.parametrize("mode", ["exec-time", "set-later"])
def test_reaper_ends_everything_the_task_started(tmp_path: Path, sleeper: subprocess.Popen[bytes], mode: str) -> None:
    token = process_tokens.new_token()
    task, pids = _start_task(tmp_path, token, mode)
    log = tmp_path / "reaper.log"
    reaper = cleanup.start_reaper(token, task.pid, poll_s=0.2, grace_s=2.0, log_path=log)
    try:
        assert not _gone(reaper)
        assert process_tokens.TOKEN_ENV not in psutil.Process(reaper).environ()
        assert psutil.Process(reaper).ppid() != os.getpid(), "the watcher must not stay the task's child"
        time.sleep(1.5)  # let the watcher see the forked children once (set-later mode)
        task.send_signal(signal.SIGKILL)
        task.wait()
        left = _wait_gone(list(pids.values()), timeout_s=10)
        assert not left, f"survivors {left} of {pids}; reaper log:\n{log.read_text() if log.exists() else ''}"
        assert not _wait_gone([reaper], timeout_s=10), "the reaper did not exit"
        assert sleeper.poll() is None, "a process without this token was killed"
    finally:
        _kill_quietly([*pids.values(), reaper])


def test_reaper_exits_at_once_when_nothing_is_left(tmp_path: Path) -> None:
    token = process_tokens.new_token()
    task = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    reaper = cleanup.start_reaper(token, task.pid, poll_s=0.1)
    try:
        task.kill()
        task.wait()
        start = time.monotonic()
        assert not _wait_gone([reaper], timeout_s=5)
        assert time.monotonic() - start < 3
    finally:
        _kill_quietly([reaper])


def test_kill_token_processes_directly(sleeper: subprocess.Popen[bytes]) -> None:
    token = process_tokens.new_token()
    env = dict(os.environ, HPCTRAIN_TASK_TOKEN=token)
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env),
        subprocess.Popen([sys.executable, "-c", stubborn], env=env, start_new_session=True),
    ]
    try:
        time.sleep(0.5)  # let the stubborn one install its handler
        found = {p.pid for p in process_tokens.find_token_processes(token)}
        assert found == {p.pid for p in procs}
        killed = process_tokens.kill_token_processes(token, grace_s=1.0)
        assert set(killed) == found
        for proc in procs:
            proc.wait(timeout=5)
        assert procs[0].returncode == -signal.SIGTERM
        assert procs[1].returncode == -signal.SIGKILL
        assert sleeper.poll() is None
    finally:
        _kill_quietly([p.pid for p in procs])


def test_exec_wrapper_puts_a_fresh_token_in_the_exec_time_environment() -> None:
    code = "import os; print(open(f'/proc/{os.getpid()}/environ', 'rb').read().count(b'HPCTRAIN_TASK_TOKEN='))"
    command = python_command(sys.executable) + f" -c {code!r}"
    env = {k: v for k, v in os.environ.items() if k != process_tokens.TOKEN_ENV}
    out = subprocess.run(command, shell=True, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_ensure_task_token_keeps_an_existing_one() -> None:
    environ: dict[str, str] = {}
    token = cleanup.ensure_task_token(environ)
    assert environ[process_tokens.TOKEN_ENV] == token
    assert cleanup.ensure_task_token(environ) == token


def test_reaper_environment_has_no_token_and_no_slurm() -> None:
    env = cleanup.reaper_environ(
        {"PATH": "/bin", "SLURM_JOB_ID": "7", "HPCTRAIN_TASK_TOKEN": "abc", "OTHER": "xabcx"}, "abc"
    )
    assert env == {"PATH": "/bin"}


FAKE_NODE_TASK = textwrap.dedent(
    """
    import subprocess, sys, time
    from hpctrain.programs.torchrun_node import TorchrunNodeLauncher, make_state_dir
    from hpctrain.runtime import node_dirs

    state = node_dirs.planned("torchrun")  # in the test's TMPDIR, as run() names it
    TorchrunNodeLauncher({}, "/nonexistent").start_reaper(remove_dirs=(state,))
    make_state_dir(state)
    (state / "torchrun-logs").mkdir()
    # A worker (it carries the token) still writing in the folder when the node task dies.
    code = "import itertools, sys, time\\nfor i in itertools.count():"
    code += " open(f'{sys.argv[1]}/x-{i % 50}', 'w').write('x'); time.sleep(0.01)"
    worker = subprocess.Popen([sys.executable, "-c", code, str(state)])
    print(state, worker.pid, flush=True)
    time.sleep(600)
    """
)


def test_a_sigkilled_torchrun_node_task_leaves_no_state_folder(tmp_path: Path) -> None:
    temp = tmp_path / "node-tmp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (process_tokens.TOKEN_ENV, "SLURM_TMPDIR")}
    env["TMPDIR"] = str(temp)
    task = subprocess.Popen(
        [sys.executable, "-c", FAKE_NODE_TASK], env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    worker = 0
    try:
        state, pid = task.stdout.readline().split()  # type: ignore[union-attr]
        worker = int(pid)
        assert Path(state).parent == temp and Path(state, "torchrun-logs").is_dir()
        time.sleep(0.3)
        task.send_signal(signal.SIGKILL)  # no finally runs: Slurm's last kill, the OOM killer
        task.wait()
        assert not _wait_gone([worker], timeout_s=10), "the reaper did not end the worker"
        deadline = time.monotonic() + 10
        while Path(state).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(temp.iterdir()) == [], "the killed node task's state folder was left on the node"
    finally:
        task.kill()
        _kill_quietly([worker] if worker else [])


PID_REUSE = """
import json, os, subprocess, sys, time
from hpctrain.contract import process_tokens

token = process_tokens.new_token()
earlier = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
time.sleep(0.3)
assert process_tokens.find_token_processes(token) == []  # the caller has looked at every process once
earlier.kill()
earlier.wait()
with open("/proc/sys/kernel/ns_last_pid", "w") as f:  # the kernel gives the earlier one's PID to the next
    f.write(str(earlier.pid - 1))
env = dict(os.environ, HPCTRAIN_TASK_TOKEN=token)
later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
time.sleep(0.3)
try:
    found = [p.pid for p in process_tokens.find_token_processes(token)]
    killed = process_tokens.kill_token_processes(token, grace_s=2.0)
    time.sleep(0.2)
    ended = later.poll()
finally:
    later.kill()
print(json.dumps(dict(same_pid=later.pid == earlier.pid, found=found, killed=killed, pid=later.pid, ended=ended)))
"""


@pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root for a PID namespace"
)
def test_a_token_process_on_a_reused_pid_is_found_and_ended(tmp_path: Path) -> None:
    """A long-lived caller looked at every process once; then a PID ended and the kernel gave it to a process
    of the run. psutil's process_iter would hand back its old object for that PID (never re-checked since
    psutil 6), the new process was not found, and it outlived the cleanup."""
    (tmp_path / "script.py").write_text(PID_REUSE)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    command = ["unshare", "--fork", "--pid", "--mount-proc", sys.executable, str(tmp_path / "script.py")]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["same_pid"], out
    assert out["found"] == [out["pid"]] and out["killed"] == [out["pid"]] and out["ended"] == -signal.SIGTERM, out
