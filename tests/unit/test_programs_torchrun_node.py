"""launcher: torchrun without processes: the sbatch request, the torchrun command, torchrun's failure report.

Everything here is a pure function or a file in a temp folder; the real thing
runs in tests/slurm/test_torchrun_e2e.py.
"""

from __future__ import annotations

import os
import pickle
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hpctrain.contract.srun_report import first_task_failure
from hpctrain.errors import SpecError
from hpctrain.jobscript.parameters import slurm_parameters
from hpctrain.jobspec.load import load_job
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.profiles import BUILTIN_PROFILES, apply_profile
from hpctrain.launch.task_programs import task_launchers
from hpctrain.programs.launcher import TaskLauncher
from hpctrain.programs.torchrun_node import (
    PEER_FAILURE,
    PEER_FAILURE_EXIT,
    TorchrunNodeLauncher,
    WorkerFailure,
    WorkerWatch,
    death_reason,
    failure_line,
    root_cause,
    torchrun_command,
    worker_environ,
    worker_pids,
)
from hpctrain.runtime.task_env import derive_task_env

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
EXAMPLE = REPO / "jobs" / "smoke_2x2_torchrun_cpu.yaml"

# What torch 2.14's torchrun printed when local rank 1 of 2 was killed with SIGKILL.
TORCHRUN_REPORT = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
hpctrain.programs.torchrun_worker FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-23_02:09:32
  host      : n2
  rank      : 2 (local_rank: 0)
  exitcode  : -15 (pid: 7582)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 7582
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_02:09:32
  host      : n2
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 7583)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 7583
======================================================
"""


@pytest.fixture(autouse=True)
def builtin_profiles_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCTRAIN_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.chdir(REPO)


def torchrun_spec(**spec: Any) -> JobSpec:
    spec.setdefault("name", "job")
    spec.setdefault("data", {"root": "/d"})
    spec.setdefault("launcher", "torchrun")
    return apply_profile(JobSpec.model_validate(spec), BUILTIN_PROFILES["slurm"])


def node_task_env(node: int, **extra: str) -> dict[str, str]:
    """The environment of the node task of node ``node`` in a 2-node job (one Slurm task per node)."""
    return {
        "SLURM_JOB_ID": "1234",
        "SLURM_PROCID": str(node),
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": str(node),
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        **extra,
    }


def test_one_slurm_task_per_node_with_the_cpus_of_all_its_processes() -> None:
    spec = torchrun_spec(resources={"nodes": 2, "tasks_per_node": 4, "cpus_per_task": 3, "gpus_per_node": 4})
    params = slurm_parameters(spec, BUILTIN_PROFILES["slurm"], Path("/runs/X"))
    assert (params["nodes"], params["ntasks_per_node"], params["cpus_per_task"]) == (2, 1, 12)
    assert params["gpus_per_node"] == 4  # the node task holds every GPU; torchrun hands them out
    assert spec.world_size == 8  # tasks_per_node still counts processes


def test_srun_is_the_default_and_unchanged() -> None:
    spec = torchrun_spec(launcher="srun", resources={"nodes": 2, "tasks_per_node": 4, "cpus_per_task": 3})
    params = slurm_parameters(spec, BUILTIN_PROFILES["slurm"], Path("/runs/X"))
    assert (params["ntasks_per_node"], params["cpus_per_task"]) == (4, 3)
    assert JobSpec.model_validate({"name": "j"}).launcher == "srun"


def test_the_golden_script_starts_one_node_task_per_node() -> None:
    lines = (GOLDEN / "smoke_2x2_torchrun_cpu.sbatch").read_text().splitlines()
    for expected in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=2"):
        assert expected in lines
    srun = next(line for line in lines if line.startswith("srun "))
    assert "--kill-on-bad-exit=1" in shlex.split(srun)


def test_the_torchrun_command_of_each_node() -> None:
    spec = torchrun_spec(resources={"nodes": 2, "tasks_per_node": 2}, distributed={"timeout_s": 120})
    first = derive_task_env(node_task_env(0, SLURM_RESTART_COUNT="1"))
    command = torchrun_command(first, spec, Path("/tmp/state"), python="PY")
    assert command[:3] == ["PY", "-m", "torch.distributed.run"]
    assert command[-3:] == ["-m", "hpctrain.programs.torchrun_worker", "/tmp/state"]
    assert "--nnodes=2" in command and "--nproc-per-node=2" in command
    assert "--rdzv-backend=c10d" in command and "--rdzv-id=1234" in command
    # The endpoint is the first node and the port srun tasks would use for this attempt of the job.
    assert f"--rdzv-endpoint=n1:{first.master_port}" in command
    assert "--rdzv-conf=is_host=1,join_timeout=120" in command
    # Slurm's requeue is the restart mechanism; SIGTERM and USR1/2 are the workers' own.
    assert "--max-restarts=0" in command
    assert "--signals-to-handle=SIGINT,SIGHUP,SIGQUIT" in command
    second = torchrun_command(derive_task_env(node_task_env(1, SLURM_RESTART_COUNT="1")), spec, Path("/s"))
    assert "--rdzv-conf=is_host=0,join_timeout=120" in second
    assert f"--rdzv-endpoint=n1:{first.master_port}" in second


def test_workers_get_their_share_of_the_node_tasks_cpus() -> None:
    child = worker_environ(node_task_env(0, SLURM_CPUS_PER_TASK="8"), tasks_per_node=4)
    assert (child["HPCTRAIN_LAUNCHER"], child["OMP_NUM_THREADS"]) == ("torchrun", "2")
    assert worker_environ(node_task_env(0, SLURM_CPUS_PER_TASK="8", OMP_NUM_THREADS="5"), 4)["OMP_NUM_THREADS"] == "5"


def test_torchruns_root_cause_becomes_a_line_rank_0_understands() -> None:
    failure = root_cause("earlier attempt noise\n" + TORCHRUN_REPORT)
    assert failure == WorkerFailure(rank=3, local_rank=1, exitcode=-9, signal_name="SIGKILL")
    parsed = first_task_failure(failure_line("n2", failure.rank, failure.reason))
    assert parsed is not None
    assert (parsed.rank, parsed.node, parsed.reason) == (3, "n2", "Killed")


def test_exit_codes_in_srun_words() -> None:
    assert WorkerFailure(1, 1, 1, "").reason == "Exited with exit code 1"
    assert WorkerFailure(1, 1, -15, "SIGTERM").reason == "Killed by SIGTERM"
    report = TORCHRUN_REPORT.replace("-9 (pid: 7583)  (SIGKILL)", f"{PEER_FAILURE_EXIT} (pid: 7583)")
    assert root_cause(report) == WorkerFailure(3, 1, PEER_FAILURE_EXIT, "")
    assert root_cause("torchrun exited without a report") is None


def test_submission_picks_the_node_task_only_for_slurm(tmp_path: Path) -> None:
    job = load_job(EXAMPLE)
    (node,) = task_launchers(job, [tmp_path], "slurm")
    assert isinstance(node, TorchrunNodeLauncher)
    (local,) = task_launchers(job, [tmp_path], "local")  # --local starts the ranks itself, as always
    assert type(local) is TaskLauncher
    assert pickle.loads(pickle.dumps(node)).spec_data == job.spec.model_dump(mode="json")


@pytest.mark.parametrize("strategy", ["dp", "hogwild", "single"])
def test_one_process_per_node_strategies_are_refused(tmp_path: Path, strategy: str) -> None:
    overrides = [f"trainer.strategy={strategy}", "resources.tasks_per_node=1", f"data.root={tmp_path}"]
    if strategy != "dp":
        overrides.append("resources.nodes=1")
    with pytest.raises(SpecError) as raised:
        load_job(EXAMPLE, overrides)
    problems = {problem.key: problem.message for problem in raised.value.problems}
    assert "launcher: srun" in problems["launcher"], problems


def test_an_entrypoint_may_use_torchrun_and_launcher_cannot_be_swept(tmp_path: Path) -> None:
    job = load_job(EXAMPLE, ["entrypoint=pkg.mod:main", f"data.root={tmp_path}"])
    assert job.spec.launcher == "torchrun"
    with pytest.raises(SpecError) as raised:
        load_job(EXAMPLE, ["sweep={launcher: [srun, torchrun]}", f"data.root={tmp_path}"])
    assert "sweep.launcher: only" in str(raised.value)


def test_why_a_worker_ended(tmp_path: Path) -> None:
    (tmp_path / "result-0.pkl").write_bytes(b"")
    (tmp_path / "exit-1").touch()
    (tmp_path / "failed-2").write_text(PEER_FAILURE)
    (tmp_path / "failed-3").write_text("ValueError: bad\nvalue")
    assert [death_reason(tmp_path, rank) for rank in range(4)] == [None, None, None, "ValueError: bad\nvalue"]
    assert death_reason(tmp_path, 4) == "Killed (ended without a result or an error)"
    parsed = first_task_failure(failure_line("n1", 3, "ValueError: bad\nvalue"))
    assert parsed is not None and (parsed.rank, parsed.reason) == (3, "ValueError: bad value")


FAKE_TORCHRUN = """
import os, subprocess, sys, time
workers = [
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, "RANK": str(rank)})
    for rank in (6, 7)
]
print(" ".join(str(w.pid) for w in workers), flush=True)
for worker in workers:
    worker.wait()
"""


def test_the_watch_hears_each_worker_start_and_names_the_first_that_dies_without_a_word(tmp_path: Path) -> None:
    """A stand-in for torchrun with two workers; rank 6 finishes, rank 7 is killed."""
    torchrun = subprocess.Popen([sys.executable, "-c", FAKE_TORCHRUN], stdout=subprocess.PIPE, text=True)
    try:
        assert torchrun.stdout is not None
        six, seven = (int(pid) for pid in torchrun.stdout.readline().split())
        reports: list[tuple[int, str]] = []
        started: list[int] = []
        watch = WorkerWatch(
            torchrun.pid, tmp_path, lambda rank, why: reports.append((rank, why)), poll_s=0.05, started=started.append
        )
        watch.start()
        deadline = time.monotonic() + 10
        while sorted(worker_pids(torchrun.pid)) != sorted([six, seven]) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the watch has seen both
        (tmp_path / "result-6.pkl").write_bytes(b"")
        os.kill(six, signal.SIGKILL)  # ended after leaving its result: not a failure
        os.kill(seven, signal.SIGKILL)
        torchrun.wait(timeout=10)
        watch.stop()
    finally:
        torchrun.kill()
        torchrun.wait()
    assert reports == [(7, "Killed (ended without a result or an error)")] and watch.reported
    assert sorted(started) == [6, 7]  # each once


def test_only_the_node_task_that_hosts_global_rank_0_starts_the_live_sender_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rendezvous, not Slurm's node number, puts rank 0 on a node: the node task learns it from its worker."""
    from hpctrain.programs import torchrun_node

    started: list[tuple[str, bool]] = []
    monkeypatch.setattr(
        torchrun_node, "start_live_sender", lambda spec, run_dir, is_main: started.append((run_dir, is_main)) or "p"
    )
    spec = torchrun_spec(resources={"nodes": 2, "tasks_per_node": 2})
    node = TorchrunNodeLauncher(spec.model_dump(mode="json"), "/runs/r")
    for rank in (2, 3):
        node.worker_started(spec, rank)
    assert started == [] and node.sender is None  # this node hosts ranks 2 and 3: no sender
    for rank in (1, 0, 0):  # rank 0 seen again (a second look): still one sender
        node.worker_started(spec, rank)
    assert started == [("/runs/r", True)] and node.sender == "p"


def test_a_torchrun_worker_never_starts_a_sender_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Global rank 0's worker included: the node task does (torchrun ends a worker's process group)."""
    from hpctrain.programs import launcher
    from hpctrain.programs.script_torchrun import ScriptTorchrunWorker
    from hpctrain.programs.torchrun_worker import TorchrunWorker

    started: list[bool] = []
    monkeypatch.setattr(launcher, "start_live_sender", lambda spec, run_dir, is_main: started.append(is_main))
    spec = torchrun_spec()
    torchrun_vars = {
        **{"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"},
        **{"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "1234"},
        **{"MASTER_ADDR": "n1", "MASTER_PORT": "29500"},
    }
    rank_0 = derive_task_env({**node_task_env(0), **torchrun_vars, "HPCTRAIN_LAUNCHER": "torchrun"})
    assert rank_0.is_main
    data = spec.model_dump(mode="json")
    TorchrunWorker(data, "/runs/r", Path("/state")).start_tracker_sender(spec, rank_0)
    ScriptTorchrunWorker(data, "/runs/r", {}, None, Path("/state")).start_tracker_sender(spec, rank_0)
    assert started == []
    TaskLauncher(data, "/runs/r").start_tracker_sender(spec, rank_0)  # srun's rank 0 does
    assert started == [True]
