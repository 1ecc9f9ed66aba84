"""hpctrain.task's context, stop flag, metrics and summary in one process: local, script and entry point.

A script's process is simulated with the variables a ``script:`` job's wrapper
sets (contract/script_env.py); an entry point with a registered TaskContext.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hpctrain import task
from hpctrain.contract import script_env
from hpctrain.contract.metrics import parse_metric_lines
from hpctrain.contract.rundir import checkpoints_dir, heartbeat_path, metrics_path, summary_path
from hpctrain.errors import DistributedSetupError, HpctrainError
from hpctrain.jobspec.models import JobSpec
from hpctrain.runtime.context import TaskContext, TaskEnv, register_context
from hpctrain.runtime.run_summary import finish_summary
from hpctrain.runtime.stop import StopRequest
from hpctrain.task import session as task_session

pytestmark = pytest.mark.usefixtures("task_local")


def script_run(monkeypatch: pytest.MonkeyPatch, run_dir: Path, **extra: str) -> None:
    run_dir.mkdir(exist_ok=True)
    values = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        script_env.RUN_DIR_VAR: str(run_dir),
        script_env.CHECKPOINT_DIR_VAR: str(run_dir / "ckpt"),
        script_env.RESTART_COUNT_VAR: "2",
        script_env.JOB_ID_VAR: "4711",
        script_env.STOP_SIGNAL_VAR: "USR1",
        script_env.HEARTBEAT_INTERVAL_VAR: "0.2",
        **extra,
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def wait_for(probe: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)
    assert probe(), "timed out"  # type: ignore[operator]


def test_outside_hpctrain_the_working_directory_is_the_run(tmp_path: Path) -> None:
    info = task.context()
    assert (info.rank, info.world_size, info.mode, info.is_main) == (0, 1, "local", True)
    assert info.run_dir == tmp_path and info.checkpoint_dir == checkpoints_dir(tmp_path)
    assert str(info.device) == ("cuda:0" if torch.cuda.is_available() else "cpu")
    assert task.should_stop() is None
    os.kill(os.getpid(), signal.SIGTERM)  # torchrun and a plain srun stop a process with SIGTERM
    assert task.should_stop() == "preempted"
    assert not summary_path(tmp_path).exists()  # no run of hpctrain's: no summary


def test_a_script_reads_its_run_and_stops_on_its_signal(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    run = tmp_path / "run"
    script_run(monkeypatch, run, RANK="0", WORLD_SIZE="1")
    info = task.context()
    assert (info.mode, info.run_dir, info.checkpoint_dir) == ("script", run, run / "ckpt")
    assert (info.restart_count, info.job_id) == (2, "4711")
    summary = json.loads(summary_path(run).read_text())
    assert (summary["status"], summary["job_id"], summary["restarts"]) == ("running", "4711", 2)
    task.step(1)
    wait_for(lambda: heartbeat_path(run, 0).is_file())  # its heartbeat thread runs
    assert task.should_stop() is None
    os.kill(os.getpid(), signal.SIGUSR1)  # what the wrapper sends the script's process group
    assert task.should_stop() == "preempted" and task.stop_reason() == "preempted"
    assert task.stopped(note="x") == {"note": "x", "status": "stopped", "stop_reason": "preempted"}
    summary = json.loads(summary_path(run).read_text())
    assert (summary["status"], summary["stop_reason"]) == ("stopped", "preempted")


def test_a_script_stopped_by_hpctrain_cancel_says_cancelled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from hpctrain.contract.cancel_marker import write_cancel_marker

    run = tmp_path / "run"
    script_run(monkeypatch, run, **{script_env.STOP_SIGNAL_VAR: "TERM"})
    task.context()
    write_cancel_marker(run, ["4711"])
    os.kill(os.getpid(), signal.SIGTERM)
    assert task.should_stop() == "cancelled"


def test_script_variables_that_make_no_sense_are_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script_run(monkeypatch, tmp_path / "a", **{script_env.STOP_SIGNAL_VAR: "KILL"})
    with pytest.raises(DistributedSetupError, match="HPCTRAIN_STOP_SIGNAL='KILL' is not one of TERM, INT, USR1"):
        task.context()
    task_session.reset()
    script_run(monkeypatch, tmp_path / "b", RANK="two")
    with pytest.raises(DistributedSetupError, match="RANK='two' is not a whole number"):
        task.context()
    task_session.reset()
    monkeypatch.delenv("RANK")  # a script run once per node (mp.spawn) before its workers joined the group
    script_run(monkeypatch, tmp_path / "c")
    monkeypatch.delenv("RANK")
    with pytest.raises(DistributedSetupError, match="after torch.distributed.init_process_group"):
        task.context()


def test_log_writes_records_the_readers_take(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    run = tmp_path / "run"
    script_run(monkeypatch, run)
    task.log(1, epoch=0, loss=torch.tensor(2.5), lr=0.1, images=64)
    task.log(2, epoch=0, loss=float("nan"))
    records, notes = parse_metric_lines(metrics_path(run).read_bytes().splitlines(keepends=True))
    assert [(r["kind"], r["global_step"], r["epoch"], r["loss"]) for r in records] == [
        ("train_step", 1, 0, 2.5),
        ("train_step", 2, 0, None),  # NaN is left out by readers
    ]
    assert records[0]["lr"] == 0.1 and records[0]["images"] == 64 and notes
    with pytest.raises(HpctrainError, match="'time' is a field of the record itself"):
        task.log(3, time=1.0)
    with pytest.raises(HpctrainError, match="loss='high' is not a number"):
        task.log(3, loss="high")
    with pytest.raises(HpctrainError, match="step must be a whole number"):
        task.log(-1, loss=1.0)
    task.set_summary(epochs=3, steps_per_epoch=6, best=0.9)
    assert json.loads(summary_path(run).read_text())["best"] == 0.9
    with pytest.raises(HpctrainError, match="status is hpctrain's to set"):
        task.set_summary(status="completed")


def test_only_rank_zero_writes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    run = tmp_path / "run"
    script_run(monkeypatch, run, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1")
    assert task.context().rank == 1
    task.log(1, loss=1.0)
    task.set_summary(x=1)
    assert not metrics_path(run).exists() and not summary_path(run).exists()


def test_an_entry_point_gets_the_launchers_context(tmp_path: Path) -> None:
    env = TaskEnv(0, 1, 0, 1, 0, 1, ("n1",), "n1", 29500, "88", 1, "slurm")
    stop = StopRequest()
    spec = JobSpec.model_validate({"name": "x", "entrypoint": "m:f"})
    register_context(TaskContext(env=env, spec=spec, run_dir=tmp_path, device=torch.device("cpu"), stop=stop))
    info = task.context()
    assert (info.mode, info.job_id, info.restart_count, info.hostname) == ("entrypoint", "88", 1, "n1")
    assert info.checkpoint_dir == checkpoints_dir(tmp_path)
    stop.note_timeout()  # the launcher's handlers feed the context's own stop request
    assert task.should_stop() == "timeout"
    task.log(3, loss=1.0)
    finish_summary(tmp_path, "88", {"status": "completed"})  # what the launcher does once main() returned
    summary = json.loads(summary_path(tmp_path).read_text())
    assert (summary["status"], summary["global_step"], summary["hostnames"]) == ("completed", 3, ["n1"])


def test_stopped_without_an_agreed_stop_is_a_mistake() -> None:
    with pytest.raises(HpctrainError, match="never agreed to stop"):
        task.stopped()


def test_the_public_face_is_lazy_and_complete() -> None:
    code = "import sys, hpctrain.task as t; assert 'torch' not in sys.modules; print(sorted(t.__all__))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.replace("'", '"')) == sorted(task._PUBLIC)  # type: ignore[attr-defined]
    for name in task.__all__:
        assert getattr(task, name) is not None
    with pytest.raises(AttributeError):
        task.nothing  # type: ignore[attr-defined]  # noqa: B018


def test_several_ranks_without_a_group_that_cannot_be_formed_stop_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Rank 1 of 2 with no process group never trains alone: the collective parts form the group or say why not."""
    script_run(monkeypatch, tmp_path / "run", RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_PORT="http")
    assert task.context().world_size == 2  # asking who it is needs no group
    with pytest.raises(
        DistributedSetupError, match=r"hpctrain.task.ddp\(\): .*rank 1 of 2, but no process group"
    ) as err:
        task.ddp(torch.nn.Linear(2, 2))
    assert "init_process_group()" in (err.value.hint or "")
    with pytest.raises(DistributedSetupError, match=r"hpctrain.task.should_stop\(\): "):
        task.should_stop()


OWN_STOP_SCRIPT = """
import signal, sys, time
OWN = []
signal.signal(signal.SIGTERM, lambda signum, frame: OWN.append(signum))  # the script's own graceful stop
from hpctrain import task
task.log(1, loss=1.0)  # its first hpctrain.task call (not task.context()): it installs the task API's handler
print("ready", flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    if reason := task.should_stop():
        time.sleep(0.2)  # a second signal would be counted meanwhile
        print(f"stopped reason={reason} own={len(OWN)} status={task.stopped()['status']}", flush=True)
        sys.exit(0)
    time.sleep(0.02)
sys.exit(3)
"""


def test_a_script_with_its_own_stop_handler_keeps_it_and_should_stop_hears_the_signal(tmp_path: Path) -> None:
    """A real script process: its own SIGTERM handler, then hpctrain.task; the wrapper's SIGTERM reaches both."""
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "own_stop.py").write_text(OWN_STOP_SCRIPT)
    variables = {"RANK": "0", "WORLD_SIZE": "1", script_env.RUN_DIR_VAR: str(run), script_env.STOP_SIGNAL_VAR: "TERM"}
    env = {**os.environ, **variables, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.Popen(
        [sys.executable, str(tmp_path / "own_stop.py")],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGTERM)  # what the wrapper sends the script's process group
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, err
    assert out == "stopped reason=preempted own=1 status=stopped\n"  # once to each: hpctrain's note, its handler
    assert err.count("hpctrain.task: SIGTERM already has this process's own handler (__main__.<lambda>)") == 1
    assert json.loads(summary_path(run).read_text())["status"] == "stopped"
