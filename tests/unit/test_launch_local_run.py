"""A local run's PID is signalled only once it is proven to be the run's (launch/local_run.py).

Every test that could signal stubs the signalling calls so that a bug fails
the test instead of killing the test machine's processes; the real signals
are sent in test_launch_cancel.py, inside a PID namespace.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from hpctrain.cli.main import main
from hpctrain.contract.process_tokens import RUN_DIR_ENV, RUN_TOKEN_ENV
from hpctrain.contract.rundir import (
    atomic_write_text,
    cancel_marker_path,
    submitit_dir,
    summary_path,
    trial_dir,
    write_run_info,
)
from hpctrain.errors import RunDirError
from hpctrain.launch import local_run
from hpctrain.launch.cancel import cancel_run
from hpctrain.observe.run_status import run_status
from hpctrain.observe.watch import watch
from hpctrain.runtime.cleanup import reaper_environ

TOKEN = "0123456789abcdef0123456789abcdef"


def start_sleeper(token: str | None = None, serves: Path | None = None) -> subprocess.Popen[bytes]:
    """``sleep``, as a local run's controller would carry ``token`` for the run directory ``serves``."""
    env = {key: value for key, value in os.environ.items() if key not in (RUN_TOKEN_ENV, RUN_DIR_ENV)}
    if token is not None:
        env[RUN_TOKEN_ENV] = token
    if serves is not None:
        env[RUN_DIR_ENV] = os.path.realpath(serves)
    return subprocess.Popen(["sleep", "300"], env=env)


def run_path(tmp_path: Path) -> Path:
    """Where :func:`local_run_dir` puts the run."""
    return tmp_path / "runs" / "demo" / "r1"


def cancel_cli(run_dir: Path, timeout_s: float) -> int:
    """``hpctrain cancel RUN --timeout S`` in this process."""
    return main(["cancel", str(run_dir), "--timeout", str(timeout_s)])


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def no_signals(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Record, instead of send, every signal the code under test tries."""
    sent: list[tuple] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(("kill", pid, sig)))
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append(("killpg", pgid, sig)))
    monkeypatch.setattr(psutil.Process, "send_signal", lambda self, sig: sent.append(("send", self.pid, sig)))
    return sent


def record_of(proc: subprocess.Popen[bytes], token: str = TOKEN) -> local_run.LocalProcess:
    return local_run.LocalProcess(proc.pid, psutil.Process(proc.pid).create_time(), token)


def local_run_dir(tmp_path: Path, job_id: object, record: local_run.LocalProcess | None = None, **extra) -> Path:
    run_dir = run_path(tmp_path)
    run_dir.mkdir(parents=True, exist_ok=True)
    info = {"name": "demo", "job_id": job_id, "job_ids": [job_id], "backend": "local", **extra}
    if record is not None:
        info[local_run.RECORD_KEY] = record.as_json()
    write_run_info(run_dir, info)
    return run_dir


def write_summary(run_dir: Path, status: str) -> None:
    atomic_write_text(summary_path(run_dir), json.dumps({"status": status, "global_step": 3}))


# ---------------------------------------------------------------- the proof


@pytest.mark.parametrize(
    ("value", "pid"),
    [("4242", 4242), (4242, 4242), ("-1", None), (-1, None), ("0", None), (0, None), ("1", None), (1, None),
     ("abc", None), ("", None), (None, None), (True, None), ("12.5", None), (2**40, None), (" 77 ", 77)],
)  # fmt: skip
def test_only_a_whole_number_above_one_is_a_pid(value: object, pid: int | None) -> None:
    assert local_run.valid_pid(value) == pid


def test_a_live_process_with_the_runs_token_start_time_and_directory_is_the_runs(
    tmp_path: Path, sleepers: list
) -> None:
    sleepers.append(proc := start_sleeper(TOKEN, tmp_path))
    record = record_of(proc)
    assert local_run.run_process(record) is not None
    info = {"job_id": str(proc.pid), local_run.RECORD_KEY: record.as_json()}
    assert local_run.liveness(info, tmp_path) == "running"
    assert local_run.liveness(info, tmp_path / "elsewhere") == "gone"  # run.json read from another folder


def test_a_reused_pid_is_not_the_runs(sleepers: list) -> None:
    sleepers.append(stranger := start_sleeper())  # no token: what a reused PID looks like
    assert local_run.run_process(record_of(stranger)) is None
    sleepers.append(other := start_sleeper("f" * 32))  # another run's token
    assert local_run.run_process(record_of(other)) is None
    sleepers.append(same := start_sleeper(TOKEN))  # the token, but another start time
    moved = record_of(same)
    assert local_run.run_process(local_run.LocalProcess(moved.pid, moved.start_time - 5, TOKEN)) is None


def test_an_ended_process_is_gone(tmp_path: Path, sleepers: list) -> None:
    proc = start_sleeper(TOKEN, tmp_path)
    record = record_of(proc)
    proc.kill()
    proc.wait(timeout=10)
    assert local_run.run_process(record) is None
    assert local_run.liveness({"job_id": str(proc.pid), local_run.RECORD_KEY: record.as_json()}, tmp_path) == "gone"


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "nonsense",
        {"pid": 4243, "start_time": 1.0, "token": TOKEN},  # names another PID than job_id
        {"pid": 4242, "start_time": float("nan"), "token": TOKEN},
        {"pid": 4242, "start_time": True, "token": TOKEN},
        {"pid": 4242, "start_time": 1.0, "token": "not-hex"},
        {"pid": -1, "start_time": 1.0, "token": TOKEN},
    ],
)
def test_a_malformed_record_proves_nothing(raw: object) -> None:
    assert local_run.parse_record({"job_id": "4242", local_run.RECORD_KEY: raw}, Path("/runs/r1")) is None


def test_the_reaper_does_not_carry_the_run_token() -> None:
    assert RUN_TOKEN_ENV not in reaper_environ({RUN_TOKEN_ENV: TOKEN, "PATH": "/bin"}, "task-token")


# ---------------------------------------------------------------- cancel refuses


@pytest.mark.parametrize("job_id", ["-1", "0", "1", "abc", -1, ""])
def test_cancel_refuses_a_job_id_that_is_not_one_process(
    tmp_path: Path, no_signals: list, job_id: object, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = local_run_dir(tmp_path, job_id)
    with pytest.raises(RunDirError, match=r"run\.json: job_id .* not the process id"):
        cancel_run(run_dir, timeout_s=1)
    assert no_signals == [] and not cancel_marker_path(run_dir).exists()


def test_cancel_refuses_an_old_record_whose_pid_is_alive(tmp_path: Path, sleepers: list, no_signals: list) -> None:
    sleepers.append(proc := start_sleeper())
    run_dir = local_run_dir(tmp_path, str(proc.pid))  # run.json of an older hpctrain: no proof
    with pytest.raises(RunDirError, match="nothing proves that process") as caught:
        cancel_run(run_dir, timeout_s=1)
    assert "ps -o pid" in (caught.value.hint or "")
    assert no_signals == [] and proc.poll() is None


def test_cancel_of_a_run_whose_pid_was_reused_signals_nothing(
    tmp_path: Path, sleepers: list, no_signals: list, capsys: pytest.CaptureFixture[str]
) -> None:
    sleepers.append(stranger := start_sleeper())
    stale = local_run.LocalProcess(stranger.pid, psutil.Process(stranger.pid).create_time() - 100, TOKEN)
    run_dir = local_run_dir(tmp_path, str(stranger.pid), stale)
    write_summary(run_dir, "running")
    assert cancel_cli(run_dir, 1) == 0
    assert no_signals == [] and "already ended" in capsys.readouterr().out


def test_cancel_of_a_finished_run_signals_nothing(
    tmp_path: Path, sleepers: list, no_signals: list, capsys: pytest.CaptureFixture[str]
) -> None:
    sleepers.append(proc := start_sleeper(TOKEN, run_path(tmp_path)))  # even a proven process: the run said it ended
    run_dir = local_run_dir(tmp_path, str(proc.pid), record_of(proc))
    write_summary(run_dir, "completed")
    assert cancel_cli(run_dir, 1) == 0
    assert no_signals == [] and "already ended (its summary is final)" in capsys.readouterr().out


def test_cancel_stops_a_proven_run_and_what_carries_its_token(
    tmp_path: Path, sleepers: list, capsys: pytest.CaptureFixture[str]
) -> None:
    sleepers.append(controller := start_sleeper(TOKEN, run_path(tmp_path)))
    sleepers.append(orphan := start_sleeper(TOKEN, run_path(tmp_path)))  # a task or worker left: as the controller
    sleepers.append(bystander := start_sleeper())
    run_dir = local_run_dir(tmp_path, str(controller.pid), record_of(controller))
    write_summary(run_dir, "running")
    assert cancel_cli(run_dir, 10) == 0
    assert controller.wait(timeout=10) is not None and orphan.wait(timeout=10) is not None
    assert bystander.poll() is None
    assert "CANCELLED" in capsys.readouterr().out
    assert json.loads(cancel_marker_path(run_dir).read_text())["job_ids"] == [str(controller.pid)]


def test_cancel_of_a_local_sweep_stops_every_trial(
    tmp_path: Path, sleepers: list, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    for index in range(2):
        sleepers.append(proc := start_sleeper(f"{index}" * 32, trial_dir(sweep, index)))
        trial = local_run_dir(tmp_path / f"t{index}", str(proc.pid), record_of(proc, f"{index}" * 32))
        write_summary(trial, "running")
        trial.rename(trial_dir(sweep, index))
    first = sleepers[0]
    write_run_info(sweep, {"name": "demo", "job_id": str(first.pid), "backend": "local", "trials": 2})
    assert cancel_cli(sweep, 10) == 0
    assert all(proc.wait(timeout=10) is not None for proc in sleepers)
    assert "trial-000: CANCELLED" in capsys.readouterr().out


@pytest.mark.skipif(os.geteuid() != 0, reason="starts a process as another user")
def test_another_users_run_is_neither_failed_nor_signalled(tmp_path: Path, no_signals: list) -> None:
    env = {**os.environ, RUN_TOKEN_ENV: TOKEN, RUN_DIR_ENV: str(run_path(tmp_path))}
    proc = subprocess.Popen(["sleep", "300"], env=env, user=65534)  # nobody
    try:
        run_dir = local_run_dir(tmp_path, str(proc.pid), record_of(proc))
        write_summary(run_dir, "running")
        assert local_run.run_process(record_of(proc)) is None  # not ours: never proven
        assert run_status(run_dir)["status"] == "running"  # but not shown as dead either
        with pytest.raises(RunDirError, match="not yours"):
            cancel_run(run_dir, timeout_s=1)
        assert no_signals == [] and proc.poll() is None
    finally:
        subprocess.run(["kill", "-KILL", str(proc.pid)], check=True)  # os.kill is stubbed here
        proc.wait(timeout=10)


# ---------------------------------------------------------------- status of a dead local run


def test_a_local_run_whose_process_is_gone_is_failed_and_watch_ends(tmp_path: Path) -> None:
    proc = start_sleeper(TOKEN, run_path(tmp_path))
    record = record_of(proc)
    proc.kill()  # as the out-of-memory killer would: no summary written
    proc.wait(timeout=10)
    run_dir = local_run_dir(tmp_path, str(proc.pid), record)
    write_summary(run_dir, "running")
    status = run_status(run_dir)
    assert status["status"] == "failed" and status["slurm_state"] == local_run.GONE_STATE
    assert "killed" in status["failed_reason"]
    sleeps: list[float] = []
    out = io.StringIO()
    assert watch(run_dir, out=out, tty=False, sleep=sleeps.append) == 1
    assert sleeps == [] and "run status: failed" in out.getvalue()


def test_a_live_local_run_stays_running(tmp_path: Path, sleepers: list) -> None:
    sleepers.append(proc := start_sleeper(TOKEN, run_path(tmp_path)))
    run_dir = local_run_dir(tmp_path, str(proc.pid), record_of(proc))
    write_summary(run_dir, "running")
    status = run_status(run_dir)
    assert status["status"] == "running" and status["slurm_state"] == local_run.STATE


def test_a_local_job_carries_its_token_and_stop_ends_all_of_it(tmp_path: Path) -> None:
    import time

    from hpctrain.launch.submitit_executor import LocalExecutor

    executor = LocalExecutor(folder=submitit_dir(tmp_path))
    executor.update_parameters(tasks_per_node=2, timeout_min=5)
    executor.run_dir = tmp_path
    job = executor.submit(time.sleep, 120)
    record = job.local_process
    assert record.pid == int(job.job_id) and local_run.run_process(record) is not None
    deadline = time.monotonic() + 60  # hang guard: the controller starts its two tasks
    while len(local_run.run_processes(record)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(local_run.run_processes(record)) == 3  # controller and both tasks carry the token
    assert local_run.stop([record], timeout_s=30) in ("ended", "killed")
    assert local_run.run_processes(record) == [] and local_run.run_process(record) is None
    assert job.done()


# ---------------------------------------------------------------- hostile input (issue 30): the proof's reach


def test_a_copy_of_a_live_runs_run_json_elsewhere_cancels_nothing(
    tmp_path: Path, sleepers: list, capsys: pytest.CaptureFixture[str]
) -> None:
    sleepers.append(controller := start_sleeper(TOKEN, run_path(tmp_path)))
    real = local_run_dir(tmp_path, str(controller.pid), record_of(controller))
    write_summary(real, "running")
    copy = tmp_path / "mine" / "r1"
    copy.parent.mkdir()
    shutil.copytree(real, copy)  # run.json, summary and all: the same PID, start time and token
    assert cancel_cli(copy, 5) == 0
    assert "already ended (its process is gone)" in capsys.readouterr().out
    assert controller.poll() is None and not cancel_marker_path(real).exists()
    assert run_status(copy)["slurm_state"] == local_run.GONE_STATE  # not the real run's, whatever it says
    assert run_status(real)["slurm_state"] == local_run.STATE  # the real one is still proven


def test_an_inherited_task_token_is_never_adopted_so_a_tasks_clean_up_spares_who_carries_it(tmp_path: Path) -> None:
    from hpctrain.contract.process_tokens import TOKEN_ENV, TOKEN_PID_ENV

    hostile = "f" * 32
    inherited = {**os.environ, TOKEN_ENV: hostile, TOKEN_PID_ENV: "1"}
    # an unrelated process carrying that token (in its own environment: another program of the session)
    bystander = subprocess.Popen(["sleep", "300"], env={**inherited, "BYSTANDER": "1"})
    task = subprocess.run(  # a task started with the inherited token: it starts its reaper, then ends
        [sys.executable, "-c", (
            "from hpctrain.runtime.cleanup import ensure_task_token, start_reaper; import os; "
            "token = ensure_task_token(); "
            "print(token, os.environ['HPCTRAIN_TASK_TOKEN_PID'], start_reaper(token, poll_s=0.05, grace_s=0.5))"
        )],
        env=inherited, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    token, owner, reaper = task.stdout.split()
    try:
        assert token != hostile and owner != "1"  # a token of its own, made for its own PID
        deadline = time.monotonic() + 30  # a hang guard: the reaper reaps what carries the task's token and exits
        while _running(int(reaper)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(int(reaper)) and bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait(timeout=10)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_token_is_adopted_only_by_the_process_it_was_made_for() -> None:
    from hpctrain.contract.process_tokens import TOKEN_ENV, TOKEN_PID_ENV
    from hpctrain.runtime.cleanup import ensure_task_token

    mine = {TOKEN_ENV: TOKEN, TOKEN_PID_ENV: "4242"}
    assert ensure_task_token(dict(mine), pid=4242) == TOKEN
    environ = dict(mine)
    assert ensure_task_token(environ, pid=4243) != TOKEN and environ[TOKEN_PID_ENV] == "4243"
    assert ensure_task_token({TOKEN_ENV: TOKEN}, pid=4242) != TOKEN  # no owner recorded: not adopted
    controller = local_run.controller_environ(mine, "a" * 32, Path("/runs/r1"))
    assert TOKEN_ENV not in controller and TOKEN_PID_ENV not in controller  # a local run starts without it


# ---------------------------------------------------------------- submit --local under SIGTERM/SIGHUP


class EndlessJob:
    """A local job that runs until signalled: ``done()`` sends this process the signal under test."""

    job_id = "4242"

    def __init__(self, tmp_path: Path, signum: int) -> None:
        self.paths = type("Paths", (), {"stdout": tmp_path / "4242_%t_log.out"})()
        self.signum = signum

    def done(self) -> bool:
        os.kill(os.getpid(), self.signum)  # the handler under test turns this into _Terminated
        return False


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_submit_local_stops_its_run_on_ctrl_c_sigterm_and_sighup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], signum: int
) -> None:
    from hpctrain.launch import follow
    from hpctrain.launch.submission import SubmittedRun

    stopped: list[SubmittedRun] = []
    monkeypatch.setattr(follow, "stop_local", lambda submitted, timeout_s: stopped.append(submitted))
    # Ctrl-C as a terminal's shell gives it: Python's handler (a background job of a script, as CI's unit tier
    # is, starts with SIGINT ignored, where no Ctrl-C can come and the signal sent below would be lost)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before = {one: signal.getsignal(one) for one in follow.STOPS}
        submitted = SubmittedRun("4242", tmp_path, "local", [EndlessJob(tmp_path, signum)], [tmp_path])
        assert follow.follow_local(submitted, stream=io.StringIO()) == 128 + signum
        assert stopped == [submitted]  # as hpctrain cancel: the tasks save, then stop (Ctrl-C included)
        assert {one: signal.getsignal(one) for one in follow.STOPS} == before
    finally:
        signal.signal(signal.SIGINT, previous_int)
    err = capsys.readouterr().err
    assert f"{follow.stop_name(signum)}: stopping the run's processes; they save a checkpoint first" in err


@pytest.mark.parametrize(("code", "name"), [(130, "Ctrl-C"), (143, "SIGTERM"), (129, "SIGHUP")])
def test_a_local_run_stopped_by_a_signal_ends_the_sequence_with_its_exit_code(
    tmp_path: Path, code: int, name: str
) -> None:
    """Ctrl-C, SIGTERM and SIGHUP are told alike: one word (stopped), whether it saved, one resume hint."""
    from hpctrain.contract.rundir import checkpoints_dir
    from hpctrain.errors import RunStopped
    from hpctrain.launch.submit import _raise_for_stop

    with pytest.raises(RunStopped) as stopped:
        _raise_for_stop(code, tmp_path)
    assert stopped.value.exit_code == code
    unsaved = "it had saved no checkpoint yet (resuming starts it from the beginning)"
    assert stopped.value.message == f"{name}: the local run {tmp_path} was stopped; {unsaved}"
    assert (stopped.value.hint or "").startswith(f"'hpctrain resume {tmp_path} --local'")
    step = checkpoints_dir(tmp_path) / "step-00000011"
    step.mkdir(parents=True)
    (step / "state.pt").write_bytes(b"x")
    files = {"state.pt": {"size": 1, "sha256": "-"}}
    (step / "meta.json").write_text(json.dumps({"format_version": 1, "global_step": 11, "files": files}))
    with pytest.raises(RunStopped) as saved:
        _raise_for_stop(code, tmp_path)
    assert saved.value.message.endswith("was stopped; it saved a checkpoint at step 11")
    _raise_for_stop(1, tmp_path)  # a run that ended by itself, however: no stop
