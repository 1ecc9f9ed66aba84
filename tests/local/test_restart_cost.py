"""A run stopped by its signal and resumed records both starts, and ``plan`` then charges the measured restart.

The real programs on this machine: ``hpctrain submit --local`` (the launcher on one gloo CPU rank, the
built-in trainer), SIGTERM to the submitter once the start's first step is recorded (the run saves and
stops, as after a preemption), ``hpctrain resume --local``, the same stop, then ``hpctrain plan --json``
of the spec. What is asserted: two start lines, each paired with its own first step, costs between 0 and
the test's own guard, the second a restart that resumed the saved step; the plan's restart cost is
that restart's, said to be measured; report and status show the starts.
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

from hpctrain.contract.rundir import summary_path
from hpctrain.contract.starts import read_starts

pytestmark = pytest.mark.local_dist

REPO = Path(__file__).resolve().parents[2]
GUARD_S = 300  # a hang guard, not a timing assertion


def write_spec(tmp_path: Path, data_root: Path) -> Path:
    spec = {
        "name": "restarts",
        "cluster": "local",
        "output_dir": str(tmp_path / "runs"),
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:30:00"},
        "trainer": {"arch": "resnet18", "batch_size": 4, "epochs": 200, "log_every_steps": 1},
        "data": {"root": str(data_root), "image_size": 32, "val_resize": 36, "workers": 0},
    }
    path = tmp_path / "restarts.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def environ(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    env["HPCTRAIN_CONFIG_DIR"] = str(tmp_path / "config")
    return env


def wait_for(condition, what: str):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def steps_logged(run_dir: Path) -> int:
    try:
        return (run_dir / "metrics.jsonl").read_text(errors="replace").count('"train_step"')
    except OSError:
        return 0


def run_then_stop(command: list[str], env: dict[str, str], run_dir_of, starts: int) -> Path:  # noqa: ANN001
    """Start ``command``; once its run recorded ``starts`` first steps and logged 3 more steps, SIGTERM it."""
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        run_dir = wait_for(run_dir_of, "the run directory")
        before = steps_logged(run_dir) if starts > 1 else 0
        wait_for(lambda: sum(s.done is not None for s in read_starts(run_dir)) >= starts, "the first step")
        wait_for(lambda: steps_logged(run_dir) >= before + 3, "three logged steps")
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=GUARD_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM, out + err
    assert json.loads(summary_path(run_dir).read_text())["status"] == "stopped"
    return run_dir


def test_a_stopped_and_resumed_run_records_two_starts_and_plan_measures_them(tmp_path: Path, data_root: Path) -> None:
    spec, env = write_spec(tmp_path, data_root), environ(tmp_path)
    hpctrain = [sys.executable, "-m", "hpctrain"]

    def the_run() -> Path | None:
        return next((p.parent for p in (tmp_path / "runs").glob("restarts/*/spec.yaml")), None)

    run_dir = run_then_stop([*hpctrain, "submit", str(spec), "--local", "--no-preflight"], env, the_run, 1)
    stopped_at = json.loads(summary_path(run_dir).read_text())["global_step"]
    run_then_stop([*hpctrain, "resume", str(run_dir), "--local"], env, lambda: run_dir, 2)

    first, again = read_starts(run_dir)
    assert first.first and not again.first and first.job_id and again.job_id
    assert first.first_step == 1 and first.began < first.done < again.began < again.done  # type: ignore[operator]
    assert again.step_before == stopped_at and again.first_step == stopped_at + 1  # resumed the stop's checkpoint
    assert again.redone_steps == 0
    for start in (first, again):
        assert start.startup_s is not None and 0 < start.startup_s < GUARD_S

    planned = subprocess.run(
        [*hpctrain, "plan", str(spec), "--json"], env=env, capture_output=True, text=True, timeout=GUARD_S
    )
    assert planned.returncode == 0, planned.stdout + planned.stderr
    restart = json.loads(planned.stdout)["restart"]
    assert restart["basis"] == "restarts" and restart["measured"] and restart["starts"] == 1
    assert restart["seconds"] == pytest.approx(again.cost_s(), abs=0.1)
    assert "measured: median of 1 restart of 1 earlier run(s)" in restart["source"]

    status = subprocess.run(
        [*hpctrain, "status", str(run_dir), "--json"], env=env, capture_output=True, text=True, timeout=GUARD_S
    )
    assert json.loads(status.stdout)["last_start"].startswith("start 2 (restart, job ")
    report = subprocess.run([*hpctrain, "report", str(run_dir)], env=env, capture_output=True, timeout=GUARD_S)
    assert report.returncode == 0
    text = (run_dir / "report" / "report.md").read_text()
    assert "start 1 (first start" in text and "start 2 (restart" in text
