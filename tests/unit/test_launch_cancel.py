"""``hpctrain cancel`` with real signals, inside a PID namespace so that a bug can hit nothing outside it.

The namespace holds a bystander (a process that is not the run's), a local
run's controller, and run directories crafted as a hostile user would: job
ids -1, 0 and 1, the bystander's PID with and without a (forged) proof, a
finished run, and a study whose point reaches one of them through ``../``.
Every cancel must leave the bystander alive; only the real run is stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, os, subprocess, sys, time
from pathlib import Path

import psutil

from hpctrain.contract.rundir import atomic_write_text, write_run_info
from hpctrain.contract.process_tokens import RUN_DIR_ENV, RUN_TOKEN_ENV

root = Path(sys.argv[1])
TOKEN = "a" * 32


def sleeper(token=None, serves=None):
    env = {k: v for k, v in os.environ.items() if k not in (RUN_TOKEN_ENV, RUN_DIR_ENV)}
    if token:
        env[RUN_TOKEN_ENV] = token
    if serves:
        env[RUN_DIR_ENV] = str(root / "runs" / serves)  # the run directory a controller serves
    return subprocess.Popen(["sleep", "300"], env=env)


def run_dir(name, job_id, proc=None, token=TOKEN, status="running", start_shift=0.0):
    folder = root / "runs" / name
    folder.mkdir(parents=True)
    info = {"name": name, "job_id": job_id, "job_ids": [job_id], "backend": "local"}
    if proc is not None:
        start = psutil.Process(proc.pid).create_time() + start_shift
        info["local_process"] = {"pid": proc.pid, "start_time": start, "token": token}
    write_run_info(folder, info)
    atomic_write_text(folder / "summary.json", json.dumps({"status": status}))
    return folder


def cancel(folder):
    result = subprocess.run(
        [sys.executable, "-m", "hpctrain", "cancel", str(folder), "--timeout", "10"],
        capture_output=True, text=True, timeout=120,
    )
    return {"code": result.returncode, "out": result.stdout, "err": result.stderr}


bystander = sleeper()
controller = sleeper(TOKEN, "real")
orphan = sleeper(TOKEN, "real")  # a task left behind by its controller: carries its token and run directory
finished = sleeper("b" * 32, "finished")
hostile = {
    "minus_one": run_dir("minus-one", "-1"),
    "zero": run_dir("zero", "0"),
    "one": run_dir("one", "1"),
    "old_record": run_dir("old-record", str(bystander.pid)),
    "forged": run_dir("forged", str(bystander.pid), bystander, token="c" * 32),
    "reused": run_dir("reused", str(bystander.pid), bystander, token="d" * 32, start_shift=-50.0),
    "finished": run_dir("finished", str(finished.pid), finished, token="b" * 32, status="completed"),
}
study = root / "runs" / "study"
study.mkdir()
(study / "study.json").write_text(json.dumps({"kind": "study", "name": "s", "points": [
    {"label": "p1", "run_dir": "../minus-one", "job_id": "-1"},
    {"label": "p2", "run_dir": "../old-record", "job_id": str(bystander.pid)},
]}))
results = {}
for name, folder in hostile.items():
    results[name] = cancel(folder)
    results[name]["alive"] = [p.poll() is None for p in (bystander, controller, orphan, finished)]
    assert all(results[name]["alive"]), results
results["study"] = cancel(study)
results["bystander_after_hostile"] = bystander.poll() is None and finished.poll() is None
results["controller_after_hostile"] = controller.poll() is None
results["real"] = cancel(run_dir("real", str(controller.pid), controller))
deadline = time.monotonic() + 30
while (controller.poll() is None or orphan.poll() is None) and time.monotonic() < deadline:
    time.sleep(0.1)
results["controller_stopped"] = controller.poll() is not None
results["orphan_stopped"] = orphan.poll() is not None
results["bystander_alive"] = bystander.poll() is None and finished.poll() is None
print(json.dumps(results))
"""


@pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root for a PID namespace"
)
def test_cancel_signals_only_the_proven_run_inside_a_pid_namespace(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(SCRIPT)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HOME": str(tmp_path / "home"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "HPCTRAIN_CONFIG_DIR": str(tmp_path / "config"),
    }
    command = ["unshare", "--fork", "--pid", "--mount-proc", sys.executable, str(tmp_path / "script.py"), str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout.strip().splitlines()[-1])

    for name in ("minus_one", "zero", "one"):
        assert results[name]["code"] != 0 and "not the process id" in results[name]["err"], results[name]
    assert results["old_record"]["code"] != 0 and "nothing proves" in results["old_record"]["err"]
    for name in ("forged", "reused"):
        assert results[name]["code"] == 0 and "already ended" in results[name]["out"], results[name]
    assert "already ended (its summary is final)" in results["finished"]["out"]
    assert results["study"]["code"] != 0  # refused: by the points' confinement, or by the per-run checks
    for name in (*("minus_one", "zero", "one", "old_record", "forged", "reused", "finished"), "study"):
        assert "Traceback" not in results[name]["err"], results[name]
    assert results["bystander_after_hostile"] and results["controller_after_hostile"]

    assert results["real"]["code"] == 0 and "CANCELLED" in results["real"]["out"], results["real"]
    assert results["controller_stopped"] and results["orphan_stopped"] and results["bystander_alive"]
