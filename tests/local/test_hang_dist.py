"""Hang detection on CPU: three gloo ranks through the real TaskLauncher (one gets stuck), and the trainer's phases."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.contract.heartbeat_files import read_heartbeats
from hpctrain.contract.rundir import stack_dump_path
from hpctrain.contract.summary import read_summary
from hpctrain.runtime import heartbeat
from hpctrain.runtime.hang import HANG_EXIT_CODE
from tests.net_helpers import free_port

pytestmark = pytest.mark.local_dist

REPO_ROOT = Path(__file__).resolve().parents[2]
WORLD = 3
STUCK = 1

WORKER = """
import json, sys
from hpctrain.programs.launcher import TaskLauncher
TaskLauncher(json.loads(sys.argv[2]), sys.argv[1])()
"""


def start_ranks(tmp_path: Path, run_dir: Path, spec: dict) -> list[subprocess.Popen]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = str(free_port())
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_"))}
    base.update(
        PYTHONPATH=str(REPO_ROOT),
        WORLD_SIZE=str(WORLD),
        LOCAL_WORLD_SIZE=str(WORLD),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=port,
        TORCHELASTIC_RUN_ID="hangtest",
        HPCTRAIN_ALLOW_LOOPBACK_MASTER="1",
    )
    return [
        subprocess.Popen(
            [sys.executable, str(script), str(run_dir), json.dumps(spec)],
            env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO_ROOT,
        )
        for rank in range(WORLD)
    ]


def hang_spec(**args: object) -> dict:
    return {
        "name": "hang",
        "entrypoint": "tests.slurm.entrypoints:hang_on_rank",
        "entrypoint_args": {"rank": STUCK, "steps": 2, "compute_s": 0.3, "hang_s": 300, **args},
        "distributed": {"backend": "gloo", "timeout_s": 120, "hang_timeout_s": 3, "heartbeat_interval_s": 0.5},
    }


def test_a_stuck_rank_is_named_and_every_rank_ends(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    procs = start_ranks(tmp_path, run_dir, hang_spec())
    errs = []
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=110)  # far below the 300 s sleep and the 120 s gloo timeout
            errs.append(err.decode(errors="replace"))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    logs = "\n".join(f"--- rank {r}\n{e}" for r, e in enumerate(errs))

    assert [proc.returncode for proc in procs] == [HANG_EXIT_CODE] * WORLD, logs
    summary = read_summary(run_dir)
    assert summary is not None, logs
    assert summary.status == "failed"
    assert (summary.hung_rank, summary.hung_node, summary.hung_phase) == (
        STUCK,
        socket.gethostname(),
        "forward_backward",
    ), logs
    assert summary.failed_reason.startswith(f"hang: rank {STUCK} on node ")  # type: ignore[union-attr]
    for rank in range(WORLD):
        assert stack_dump_path(run_dir, rank).is_file(), logs
    assert "_stuck_before_collective" in stack_dump_path(run_dir, STUCK).read_text()
    beats = {beat.rank: beat for beat in read_heartbeats(run_dir)}
    assert sorted(beats) == list(range(WORLD))
    assert {beats[r].phase for r in range(WORLD) if r != STUCK} == {"allreduce"}
    assert all(beat.step == 2 and beat.job_id == "hangtest" for beat in beats.values())
    assert summary.hung_frozen_s is None  # stuck in Python: its heartbeat thread went on writing


def test_a_frozen_rank_is_named_with_the_phase_its_own_heartbeat_last_recorded(tmp_path: Path) -> None:
    """SIGSTOP of a rank's process stops its heartbeat thread too: the report must not trust its file's age."""
    pytest.importorskip("torch.distributed")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    procs = start_ranks(tmp_path, run_dir, hang_spec(freeze=True))
    errs = []
    try:
        for rank, proc in enumerate(procs):
            if rank != STUCK:
                _, err = proc.communicate(timeout=110)
                errs.append(err.decode(errors="replace"))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    logs = "\n".join(errs)
    assert [proc.returncode for rank, proc in enumerate(procs) if rank != STUCK] == [HANG_EXIT_CODE] * (WORLD - 1)
    summary = read_summary(run_dir)
    assert summary is not None and summary.status == "failed", logs
    own = {beat.rank: beat for beat in read_heartbeats(run_dir)}[STUCK]
    assert (summary.hung_rank, summary.hung_phase) == (STUCK, own.phase), logs
    assert summary.hung_frozen_s is not None and summary.hung_frozen_s > 0, logs
    assert f"hang: rank {STUCK} on node " in summary.failed_reason and "stopped responding" in summary.failed_reason


class PhaseLog(heartbeat.Recorder):
    """A recorder that also remembers every phase it entered, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.entered: list[str] = []

    def set_phase(self, name: str) -> str:
        if name != self.phase_name:
            self.entered.append(name)
        return super().set_phase(name)


def test_the_trainer_marks_its_phases_and_steps(
    tmp_path: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    from trainer_harness import job_spec, train

    log = PhaseLog()
    monkeypatch.setattr(heartbeat, "_recorder", log)
    result = train(tmp_path, job_spec(data_root))
    assert log.step_no == result["global_step"] == 3 and log.armed
    assert log.entered[:4] == ["data", "forward_backward", "optimizer", "data"]
    after_training = log.entered[log.entered.index("validation") :]
    assert after_training[:2] == ["validation", "checkpoint"]
    assert len(log.snapshot()["recent_step_times_s"]) == 2
