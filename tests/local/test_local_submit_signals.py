"""``hpctrain submit --local`` stopped by Ctrl-C, SIGTERM or SIGHUP, or killed, takes its whole run along.

A real two-rank DDP run with a data-loader worker per rank; once it trains,
the submitting command gets the signal. Afterwards no process may carry the
run's token (``HPCTRAIN_RUN_TOKEN``, which the controller, the tasks and
their workers inherit), the command exits 128 + the signal, and the run
stopped as a cancel does: its summary says so and a checkpoint is kept.
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
import yaml

from hpctrain.contract.process_tokens import RUN_TOKEN_ENV
from hpctrain.contract.rundir import run_info_path, summary_path

pytestmark = pytest.mark.local_dist

REPO = Path(__file__).resolve().parents[2]


def write_spec(tmp_path: Path, data_root: Path) -> Path:
    spec = {
        "name": "sigterm",
        "cluster": "local",
        "output_dir": str(tmp_path / "runs"),
        "resources": {"nodes": 1, "tasks_per_node": 2, "time": "00:30:00"},
        "trainer": {"arch": "resnet18", "strategy": "ddp", "batch_size": 4, "epochs": 200, "log_every_steps": 1},
        "data": {"root": str(data_root), "image_size": 32, "val_resize": 36, "workers": 1},
    }
    path = tmp_path / "sigterm.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def processes_with(token: str) -> list[int]:
    """PIDs whose exec-time environment carries the run token (found by token, never by name)."""
    found = []
    needle = f"{RUN_TOKEN_ENV}={token}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def wait_for(condition, timeout_s: float, what: str):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout_s  # a hang guard, not a timing assertion
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def training_started(run_root: Path) -> Path | None:
    for metrics in run_root.glob("sigterm/*/metrics.jsonl"):
        if '"train_step"' in metrics.read_text(errors="replace"):
            return metrics.parent
    return None


def start_training(tmp_path: Path, data_root: Path) -> tuple[subprocess.Popen[str], Path, str, list[int]]:
    """``submit --local`` of a run that trains long; returns once every process of it runs."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    env["HPCTRAIN_CONFIG_DIR"] = str(tmp_path / "config")
    command = [sys.executable, "-m", "hpctrain", "submit", str(write_spec(tmp_path, data_root)), "--local"]
    submitter = subprocess.Popen(
        [*command, "--no-preflight"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the test's own process group never sees the signals
        # Ctrl-C's Python handler even where this test runs as a background job (CI's tiers do), which starts
        # with SIGINT ignored and would hand that on
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
    )
    try:
        run_dir = wait_for(lambda: training_started(tmp_path / "runs"), 300, "the first training step")
        token = json.loads(run_info_path(run_dir).read_text())["local_process"]["token"]
        # controller, two tasks, a loader worker each (the per-task reapers do not carry it)
        before = wait_for(lambda: (found := processes_with(token)) and len(found) >= 5 and found, 120, "workers")
    except BaseException:
        os.killpg(submitter.pid, signal.SIGKILL)
        submitter.wait()
        raise
    return submitter, run_dir, token, before


@pytest.mark.parametrize(
    ("signum", "to_group"), [(signal.SIGTERM, False), (signal.SIGHUP, False), (signal.SIGINT, True)]
)
def test_a_terminated_local_submit_leaves_no_process_of_the_run(
    tmp_path: Path, data_root: Path, signum: signal.Signals, to_group: bool
) -> None:
    """SIGINT goes to the submitter's whole process group, as a terminal's Ctrl-C does: the run's controller
    leads a group of its own, so the submitter alone gets it and stops the run as it does on SIGTERM."""
    submitter, run_dir, token, before = start_training(tmp_path, data_root)
    try:
        if to_group:
            os.killpg(submitter.pid, signum)
        else:
            submitter.send_signal(signum)
        out, err = submitter.communicate(timeout=240)
    finally:
        if submitter.poll() is None:
            os.killpg(submitter.pid, signal.SIGKILL)
            submitter.wait()
    assert submitter.returncode == 128 + signum, out + err
    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    assert "Traceback" not in err and f"{name}: the local run {run_dir} was stopped; it saved a checkpoint" in err
    assert f"'hpctrain resume {run_dir} --local'" in err
    assert processes_with(token) == [], f"left running of {before}"
    summary = json.loads(summary_path(run_dir).read_text())
    assert summary["status"] == "stopped" and summary.get("stop_reason") == "cancelled", summary
    assert any(run_dir.glob("checkpoints/*")), "the stop checkpoint is kept"


def test_a_killed_local_submit_takes_its_run_along(tmp_path: Path, data_root: Path) -> None:
    """SIGKILL leaves no handler a chance: the controller's parent-death signal stops the run."""
    submitter, run_dir, token, before = start_training(tmp_path, data_root)
    submitter.kill()
    submitter.communicate(timeout=60)
    try:
        wait_for(lambda: not processes_with(token), 240, "the run to stop after its submitter died")
    finally:
        for pid in processes_with(token):
            os.kill(pid, signal.SIGKILL)  # carries the run's token: the test's own run
    summary = json.loads(summary_path(run_dir).read_text())
    assert summary["status"] == "stopped", summary  # saved and stopped, as after a preemption


def test_a_local_run_whose_rank_zero_was_killed_is_failed_and_the_watch_ends(tmp_path: Path, data_root: Path) -> None:
    """As after the out-of-memory killer: rank 0 cannot write its summary, which stays 'running'."""
    import psutil

    submitter, run_dir, token, _ = start_training(tmp_path, data_root)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    try:
        controller = psutil.Process(int(json.loads(run_info_path(run_dir).read_text())["job_id"]))
        (rank0,) = [t for t in controller.children() if t.environ().get("SUBMITIT_LOCAL_GLOBALID") == "0"]
        rank0.kill()
        watch = subprocess.run(
            [sys.executable, "-m", "hpctrain", "status", str(run_dir), "--watch", "--interval", "2"],
            capture_output=True, text=True, env=env, timeout=240,
        )  # fmt: skip
        status = subprocess.run(
            [sys.executable, "-m", "hpctrain", "status", str(run_dir), "--json"],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        submitter.communicate(timeout=120)
    finally:
        if submitter.poll() is None:
            os.killpg(submitter.pid, signal.SIGKILL)
            submitter.wait()
    assert watch.returncode == 1 and watch.stdout.rstrip().endswith("run status: failed"), watch.stdout + watch.stderr
    shown = json.loads(status.stdout)
    assert shown["status"] == "failed" and "killed" in shown["failed_reason"]
    left = summary_path(run_dir)  # what rank 0 left: no final word
    assert not left.exists() or json.loads(left.read_text())["status"] == "running"
    assert processes_with(token) == []
