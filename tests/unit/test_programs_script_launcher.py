"""The script wrapper's story in one process (hpctrain/programs/script_launcher.py): a single task outside Slurm
runs small torch-free scripts to each end: completed, failed (named, with its last lines), stopped (the stop
signal passed on, or the script killed at its stop timeout), a stop before the script started, and the
silence watchdog."""

from __future__ import annotations

import os
import signal
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctrain.contract.summary import read_summary
from hpctrain.jobspec.models import JobSpec
from hpctrain.programs.script_launcher import ScriptLauncher
from hpctrain.runtime.script.outcome import ScriptFailed


@pytest.fixture(autouse=True)
def single_task(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A task of no launcher (one process), without the reaper (it would watch pytest), handlers restored."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_")) or name in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(ScriptLauncher, "start_reaper", lambda self: None)
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def launcher(tmp_path: Path, body: str, **script: object) -> ScriptLauncher:
    program = tmp_path / "train.py"
    program.write_text("import os, signal, sys, time\n" + body)
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    spec = JobSpec.model_validate({"name": "s", "script": {"path": str(program), **script}})
    code = {"file": str(program), "module": None, "script_dir": str(tmp_path), "python_path": None}
    return ScriptLauncher(spec.model_dump(mode="json"), str(run_dir), code)


def summary(tmp_path: Path) -> dict:
    found = read_summary(tmp_path / "run")
    assert found is not None
    return found.fields()


def test_a_script_that_exits_0_completes_in_the_run_directory(tmp_path: Path) -> None:
    body = "open('where', 'w').write(os.getcwd() + ' ' + os.environ['HPCTRAIN_RESTART_COUNT'] + ' ' + sys.argv[1])\n"
    result = launcher(tmp_path, body, args=["{rank}/{world_size}"])()
    assert result["result"] == {"status": "completed", "exit_code": 0}
    assert (tmp_path / "run" / "where").read_text() == f"{tmp_path / 'run'} 0 0/1"
    written = summary(tmp_path)
    assert (written["status"], written["restarts"], written["world_size"]) == ("completed", 0, 1)


def test_a_failed_script_is_named_with_its_exit_code_and_last_lines(tmp_path: Path) -> None:
    body = "print('loading', flush=True)\nprint('ValueError: bad shard 7', file=sys.stderr)\nsys.exit(3)\n"
    with pytest.raises(ScriptFailed, match="the script of rank 0 on localhost exited with code 3"):
        launcher(tmp_path, body)()
    written = summary(tmp_path)
    assert (written["status"], written["failed_rank"], written["failed_exit_code"]) == ("failed", 0, 3)
    assert written["failed_stderr"][-1] == "ValueError: bad shard 7"


def test_a_stop_is_passed_on_to_the_script_which_saves_and_exits(tmp_path: Path) -> None:
    body = (
        "signal.signal(signal.SIGINT, lambda *a: (open('saved', 'w').close(), sys.exit(0)))\n"
        "open('ready', 'w').close()\ntime.sleep(60)\n"
    )
    task = launcher(tmp_path, body, stop_signal="INT")
    stop_when_ready(tmp_path)
    started = time.monotonic()
    result = task()
    assert result["result"] == {"status": "stopped", "stop_reason": "preempted"}
    assert (tmp_path / "run" / "saved").exists() and time.monotonic() - started < 30
    assert (summary(tmp_path)["status"], summary(tmp_path)["stop_reason"]) == ("stopped", "preempted")


def test_a_script_that_ignores_the_stop_is_killed_at_its_stop_timeout(tmp_path: Path) -> None:
    body = "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nopen('ready', 'w').close()\ntime.sleep(60)\n"
    task = launcher(tmp_path, body, stop_timeout_s=1)
    stop_when_ready(tmp_path)
    started = time.monotonic()
    assert task()["result"]["status"] == "stopped"
    assert 1.0 <= time.monotonic() - started < 20, "killed once its stop timeout ran out"


def test_a_stop_before_the_script_started_never_starts_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install = ScriptLauncher.install_stop_handling

    def stopped_at_once(self: ScriptLauncher):  # noqa: ANN202 - a StopRequest
        stop = install(self)
        stop.note_timeout()  # as if the time-limit warning came in the task's first moment
        return stop

    monkeypatch.setattr(ScriptLauncher, "install_stop_handling", stopped_at_once)
    result = launcher(tmp_path, "open('started', 'w').close()\n")()
    assert result["result"] == {"status": "stopped", "stop_reason": "timeout"}
    assert not (tmp_path / "run" / "started").exists()


def test_a_silent_script_is_ended_as_hung(tmp_path: Path) -> None:
    if not stat.S_ISREG(os.fstat(2).st_mode):
        pytest.skip("the silence watchdog measures a log file; this test's output is no file (run with capture)")
    with pytest.raises(ScriptFailed, match="wrote nothing for"):
        launcher(tmp_path, "time.sleep(60)\n", silence_timeout_s=1)()
    written = summary(tmp_path)
    assert (written["status"], written["hung_rank"], written["hung_phase"]) == ("failed", 0, "silent")


def stop_when_ready(tmp_path: Path) -> None:
    """SIGTERM this process (the task) once the script says it is ready, as Slurm would."""

    def send() -> None:
        deadline = time.monotonic() + 30
        while not (tmp_path / "run" / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=send, daemon=True).start()


def test_a_scripts_own_error_ends_the_job_for_good_but_a_lost_peers_echo_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0's script exiting with its own error takes the job's Requeue flag away (``keep_ended``: with
    ``--requeue=expedite`` Slurm would hold the failed job); a broken connection may be a lost node: left
    to Slurm."""
    from hpctrain.runtime import requeue

    ended: list[int] = []
    monkeypatch.setattr(requeue, "keep_ended", lambda env, run=None: ended.append(env.global_rank))
    with pytest.raises(ScriptFailed):
        launcher(tmp_path, "print('RuntimeError: Connection reset by peer', file=sys.stderr)\nsys.exit(1)\n")()
    assert ended == []
    with pytest.raises(ScriptFailed):
        launcher(tmp_path, "print('ValueError: bad shard 7', file=sys.stderr)\nsys.exit(3)\n")()
    assert ended == [0]
