"""``tracking.live`` under ``launcher: torchrun``: the node task that hosts global rank 0 runs the one sender.

A ``script:`` job on the task API (``hpctrain.task``), 2 gloo ranks on CPU, run as Slurm runs it: the
node task (programs/script_torchrun.py's ``ScriptTorchrunNode``, one per node) in a Slurm task's
environment, starting real torchrun and its ranks. The tracker is a real ``mlflow server`` (SQLite store,
started here on 127.0.0.1 and stopped after), or a port where nothing listens. Slurm's commands are
stubs that know no job, so nothing here reaches the test cluster; a preemption ends as Slurm ends it
(the ranks wait for the job's end, the node task is SIGKILLed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from task_harness import clean_env

from hpctrain.jobspec.models import JobSpec
from tests.net_helpers import free_port
from tests.tracking_helpers import last_values, mlflow_server

pytestmark = pytest.mark.local_dist
mlflow = pytest.importorskip("mlflow")
BIN = Path(sys.executable).parent
TRACKING_ID = "0123456789abcdef"
STEPS = 6

LOOP = """
import sys, time
from pathlib import Path
import torch
from torch import nn
from torch.utils.data import TensorDataset
from hpctrain import task

torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
loader = task.ElasticLoader(data, batch_size=4, seed=0)
model = task.ddp(nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
ckpt = task.Checkpointer(model=model, optimizer=optimizer, data=loader, every_steps=2)
for step, batches in loader.steps(ckpt.load(), STEPS):
    optimizer.zero_grad()
    for x, y in task.accumulate(model, batches):
        (nn.functional.mse_loss(model(x), y) / len(batches)).backward()
    optimizer.step()
    task.log(step + 1, loss=100.0 + step)
    ckpt.maybe_save(step + 1)
go, deadline = Path(sys.argv[1]), time.monotonic() + 400
while not go.exists() and time.monotonic() < deadline:  # the test ends the run once it saw the steps
    time.sleep(0.2)
"""

# The same loop, slow and long, stopping (a checkpoint, exit 0) when hpctrain asks it to.
STOPPABLE = (
    LOOP.replace("STEPS", "1000")
    .replace(
        "    optimizer.zero_grad()",
        "    if task.should_stop():\n        ckpt.save(step)\n        sys.exit(0)\n"
        "    time.sleep(0.2)\n    optimizer.zero_grad()",
    )
    .split("go, deadline")[0]
)

NODE = """
import json, sys
from hpctrain.programs.script_torchrun import ScriptTorchrunNode

job = json.loads(open(sys.argv[1]).read())
ScriptTorchrunNode(job["spec"], job["run_dir"], job["code"], None)()
"""

NO_SUCH_JOB = "#!/bin/sh\necho 'Invalid job id specified' >&2\nexit 1\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not (BIN / "mlflow").exists():
        pytest.skip("the mlflow server is not installed (pip install mlflow)")
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


def slurm_node_env(tmp_path: Path) -> dict[str, str]:
    """One Slurm task on one node, as sbatch + srun give it to the node task; Slurm's commands stubbed."""
    stubs = tmp_path / "slurm-bin"
    stubs.mkdir()
    for command in ("scontrol", "squeue", "sacct"):
        (stubs / command).write_text(NO_SUCH_JOB)
        (stubs / command).chmod(0o755)
    env = clean_env()
    (tmp_path / "node-tmp").mkdir()
    env.update(
        TMPDIR=str(tmp_path / "node-tmp"),  # the node task's state folder goes here (see state_folders)
        SLURM_JOB_ID="424242", SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_LOCALID="0", SLURM_NODEID="0",
        SLURM_JOB_NODELIST="localhost", SLURM_JOB_NUM_NODES="1", SLURM_TASKS_PER_NODE="1",
        HPCTRAIN_ALLOW_LOOPBACK_MASTER="1", PATH=f"{stubs}{os.pathsep}{env.get('PATH', '')}",
    )  # fmt: skip
    return env


def start_node_task(tmp_path: Path, uri: str, loop: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """The node task of a live-tracked script job under torchrun; (its process, the run dir, the go file)."""
    run, go = tmp_path / "run", tmp_path / "go"
    run.mkdir()
    (tmp_path / "loop.py").write_text(loop)
    spec = JobSpec.model_validate({
        "name": "live_torchrun", "cluster": "local", "output_dir": str(tmp_path), "launcher": "torchrun",
        "resources": {"nodes": 1, "tasks_per_node": 2, "time": "00:10:00"},
        "distributed": {"backend": "gloo", "master_port": free_port()},
        "script": {"path": str(tmp_path / "loop.py"), "args": [str(go)]},
        "tracking": {"mlflow": {"tracking_uri": uri, "experiment": "torchrun"}, "live": True, "live_interval_s": 5},
    }).model_dump(mode="json")  # fmt: skip
    (run / "spec.yaml").write_text(json.dumps(spec))
    (run / "run.json").write_text(json.dumps({"tracking_id": TRACKING_ID}))  # as submit leaves it
    code = {"file": str(tmp_path / "loop.py"), "module": None, "script_dir": str(tmp_path), "python_path": None}
    (tmp_path / "job.json").write_text(json.dumps({"spec": spec, "run_dir": str(run), "code": code}))
    (tmp_path / "node.py").write_text(NODE)
    command = [sys.executable, str(tmp_path / "node.py"), str(tmp_path / "job.json")]
    log = (tmp_path / "node.log").open("wb")
    node = subprocess.Popen(command, env=slurm_node_env(tmp_path), stdout=log, stderr=subprocess.STDOUT)
    return node, run, go


def state_folders(tmp_path: Path, timeout_s: float = 0.0) -> list[Path]:
    """The node task's state folders in its TMPDIR, once none is left or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = sorted((tmp_path / "node-tmp").glob("hpctrain-torchrun-*"))
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


def senders(run: Path) -> list[psutil.Process]:
    """The run's live senders on this machine (``python -m hpctrain.tracking.live RUN ...``).

    Each a fresh ``psutil.Process``, not ``process_iter``'s: that one caches a Process per PID across calls
    (and tests), so a PID that an earlier process held and a sender holds now came back as the earlier
    process's object, the sender's command line read through it, and its ``ppid()`` raised NoSuchProcess
    ("PID has been reused") for a sender that was running (rehearsal 17)."""
    found = []
    for pid in psutil.pids():
        try:
            process = psutil.Process(pid)
            cmdline = process.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # ended (or not ours to read) between the listing and the look
        if "hpctrain.tracking.live" in cmdline and str(run) in cmdline:
            found.append(process)
    return found


def steps_in_mlflow(uri: str) -> list[tuple[int, float]]:
    client = mlflow.tracking.MlflowClient(uri)
    experiment = client.get_experiment_by_name("torchrun")
    if experiment is None:
        return []
    runs = client.search_runs([experiment.experiment_id], f"tags.`hpctrain.tracking_id` = '{TRACKING_ID}'")
    assert len(runs) <= 1, "one MLflow run per hpctrain run"
    return sorted((m.step, m.value) for run in runs for m in client.get_metric_history(run.info.run_id, "train/loss"))


def logged(run: Path) -> int:
    """How many steps the run has logged."""
    metrics = run / "metrics.jsonl"
    return len(last_values(metrics)) if metrics.exists() else 0


# A hang guard, not a timing: rehearsal 20 (the unit and local tiers at nice 10 beside three Slurm legs) took
# 2 minutes from the node task's start to the loop's 6th step (two torch imports) and timed out at 150 s.
WAIT_S = 360


def wait_for(condition: Any, what: str, node: subprocess.Popen[bytes], log: Path, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert node.poll() is None, f"the node task ended before {what}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)


def test_the_node_task_of_rank_0_sends_each_step_live_once_and_its_sender_ends_with_it(
    server: str, tmp_path: Path
) -> None:
    node, run, go = start_node_task(tmp_path, server, LOOP.replace("STEPS", str(STEPS)))
    log = tmp_path / "node.log"
    try:
        # every step reaches MLflow while both ranks are still in the loop (the run is not over: live)
        wait_for(lambda: {step for step, _ in steps_in_mlflow(server)} == set(range(1, STEPS + 1)),
                 "MLflow to have every step", node, log)  # fmt: skip
        assert Counter(step for step, _ in steps_in_mlflow(server)) == dict.fromkeys(range(1, STEPS + 1), 1)
        assert len(state_folders(tmp_path)) == 1  # the ranks' results go there, in TMPDIR
        [sender] = senders(run)  # one per run, not one per rank ...
        assert sender.ppid() == node.pid  # ... started by the node task, not by a torchrun worker
        go.touch()
        assert node.wait(timeout=WAIT_S) == 0, log.read_text()[-3000:]
    finally:
        go.touch()
        node.kill()
    assert senders(run) == []  # it ended with the node task
    assert state_folders(tmp_path) == []  # the node task's own end removed it
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == STEPS
    history = steps_in_mlflow(server)
    assert Counter(step for step, _ in history) == dict.fromkeys(range(1, STEPS + 1), 1)  # each step once
    assert dict(history) == last_values(run / "metrics.jsonl")
    live = json.loads((run / ".hpctrain" / "tracking" / "live.json").read_text())
    assert live["through"] == {"mlflow": STEPS} and live["syncs"] >= 2
    said = (run / ".hpctrain" / "tracking" / "live.log").read_text()
    # the run's end was sent: the node task said so on the sender's stdin, or (here, a local run, which the
    # sender can see has ended) its own sync saw it first; inside a Slurm job only the task's word can
    # (tests/slurm/test_torchrun_e2e.py checks that the tracker run ends FINISHED there)
    assert "ended: completed" in said, said


def test_a_preempted_node_task_takes_its_sender_along_and_a_server_down_never_held_the_ranks(
    tmp_path: Path,
) -> None:
    """A preemption: SIGTERM, the ranks checkpoint and wait for Slurm to end the job, which it does (SIGKILL)."""
    node, run, _ = start_node_task(tmp_path, f"http://127.0.0.1:{free_port()}", STOPPABLE)  # nothing listens
    log = tmp_path / "node.log"
    live = run / ".hpctrain" / "tracking" / "live.json"
    summary = run / "summary.json"
    try:
        wait_for(lambda: live.exists() and json.loads(live.read_text())["failed_syncs"] >= 1 and len(senders(run)) == 1,
                 "the sender to fail a sync", node, log)  # fmt: skip
        steps_before = logged(run)
        wait_for(lambda: logged(run) >= steps_before + 5, "more steps", node, log)  # the ranks go on regardless
        node.send_signal(signal.SIGTERM)  # as Slurm preempts the job: its node task passes it on to the ranks
        wait_for(lambda: json.loads(summary.read_text()).get("status") == "stopped", "the ranks to stop", node, log)
        [sender] = senders(run)
        assert len(state_folders(tmp_path)) == 1
        node.kill()  # Slurm ends the job (KillWait is over)
        node.wait(timeout=30)
        sender.wait(timeout=60)  # the parent's death signal; its last sync is bounded
    finally:
        node.kill()
    assert senders(run) == []
    assert state_folders(tmp_path, timeout_s=20) == [], "the SIGKILLed node task's reaper left its state folder"
    assert json.loads(summary.read_text())["stop_reason"] == "preempted"
    assert json.loads(live.read_text())["through"] == {"mlflow": -1}  # nothing claimed sent
