"""hpctrain.task on several local gloo processes: resharding, a stopped script's exact resume, bad saves.

Each scenario rank is forked with the environment torchrun gives one (tests/local/task_harness.py);
the script test starts its ranks as torchrun does and adds the variables a ``script:`` job's wrapper sets.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from task_harness import logs, run_ranks, start_ranks, wait_ranks

from hpctrain.contract.rundir import checkpoints_dir, heartbeat_path, metrics_path, summary_path

pytestmark = pytest.mark.local_dist


def test_a_checkpoint_written_on_four_ranks_loads_on_two_and_on_six(tmp_path: Path) -> None:
    """An FSDP2-sharded model, its AdamW and a schedule, saved by 4 ranks, resharded onto 2 and onto 6."""
    directory = str(checkpoints_dir(tmp_path))
    saved = run_ranks("save_sharded", 4, tmp_path / "save", directory=directory)
    files = sorted(p.name for p in Path(saved[0]["path"]).iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp", "meta.json"]
    for world in (2, 6):
        loaded = run_ranks("load_sharded", world, tmp_path / f"load-{world}", directory=directory)
        for result in loaded:
            assert result["step"] == 3 and result["lr"] == saved[0]["lr"]
            assert result["state"] == saved[0]["state"], f"rank {result['rank']} of {world}"  # every value exact
            assert result["counter"] == -1  # per-rank state of 4 ranks is not given to 2 or 6


def script_env(run: Path, restart: int) -> dict[str, str]:
    """What a script: job's wrapper sets for its script (contract/script_env.py), stop signal USR1."""
    return {
        "HPCTRAIN_RUN_DIR": str(run),
        "HPCTRAIN_CHECKPOINT_DIR": str(checkpoints_dir(run)),
        "HPCTRAIN_RESTART_COUNT": str(restart),
        "HPCTRAIN_JOB_ID": "77",
        "HPCTRAIN_STOP_SIGNAL": "USR1",
        "HPCTRAIN_HEARTBEAT_INTERVAL_S": "1",
    }


def run_script(command: list[str], run: Path, restart: int, logs_to: Path, stop_after: int | None = None) -> None:
    procs = start_ranks(command, 2, env=script_env(run, restart), cwd=run, log_dir=logs_to)
    if stop_after is not None:
        # Signalled once the loop logged step ``stop_after`` (metrics lines stay; the step's checkpoint folder
        # is pruned a few steps later, so a poll starved by a busy machine could miss it and wait for nothing).
        deadline = time.monotonic() + 120
        while logged_steps(run) < stop_after:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), logs(logs_to)
            time.sleep(0.05)
        for proc in procs:
            os.killpg(proc.pid, signal.SIGUSR1)  # the wrapper signals each script's process group
    assert wait_ranks(procs, logs_to) == [0, 0], logs(logs_to)


def logged_steps(run: Path) -> int:
    """The newest step the loop logged (0 before the first)."""
    try:
        lines = metrics_path(run).read_text().splitlines()
    except FileNotFoundError:
        return 0
    return max((json.loads(line)["global_step"] for line in lines if line.endswith("}")), default=0)


def summary(run: Path) -> dict[str, Any]:
    return json.loads(summary_path(run).read_text())


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_script_stopped_by_its_signal_resumes_with_the_uninterrupted_weights(
    data_root: Path, tmp_path: Path, parallel: str
) -> None:
    """The example loop as a 2-rank script (DDP, and FSDP2 as docs/your-own-loop.md shows it): stopped after its
    first checkpoint and started again, it ends bit for bit with the uninterrupted run's weights."""
    example = ["-m", "hpctrain.examples.own_loop", "--data-root", str(data_root), "--epochs", "3"]
    command = [sys.executable, *example, "--parallel", parallel]
    full, split = tmp_path / "full", tmp_path / "split"
    full.mkdir(), split.mkdir()
    run_script(command, full, 0, tmp_path / "log-full")
    run_script(command, split, 0, tmp_path / "log-1", stop_after=2)
    stopped = summary(split)
    assert (stopped["status"], stopped["stop_reason"], stopped["restarts"]) == ("stopped", "preempted", 0)
    assert 2 <= stopped["global_step"] < summary(full)["global_step"]
    run_script(command, split, 1, tmp_path / "log-2")

    resumed = summary(split)
    assert resumed["restarts"] == 1 and resumed["global_step"] == summary(full)["global_step"] == 12
    assert resumed["weights_sha256"] == summary(full)["weights_sha256"]
    steps = [json.loads(line)["global_step"] for line in metrics_path(split).read_text().splitlines()]
    assert steps == list(range(1, 13))  # the second attempt went on at the step the first one stopped at
    beats = [json.loads(heartbeat_path(split, r).read_text()) for r in (0, 1)]
    assert [(b["step"], b["phase"], b["job_id"]) for b in beats] == [(12, "done", "77")] * 2


def test_a_save_not_every_rank_joins_fails_fast_and_names_the_ranks(tmp_path: Path) -> None:
    """Building the checkpointer is not a save: rank 1 builds it 7 s after rank 0 (CI #56 failed that build on a
    busy machine, where the skew outgrew a 5 s timeout). Ranks 0 and 2 save, rank 1 does not: rank 0 names rank 1
    alone (rank 2's word came, though gloo closed the group when the wait for rank 1 timed out), and rank 2 hears
    that rank 0 did not answer, in time."""
    directory = checkpoints_dir(tmp_path)
    results = run_ranks("bad_saves", 3, tmp_path / "out", directory=str(directory), timeout_s=5, late_s=7)
    for rank, result in enumerate(results):
        assert (
            f"save(step={5 + rank}) on rank {rank}: the ranks called it at different steps (5 to 7)"
            in (result["different_steps"])
        )
    alone = results[0]["alone"]
    assert "save(step=1) on rank 0: not every rank called it within 5 s (rank 1 did not)" in alone
    assert "`if rank == 0:`" in alone and results[0]["seconds"] < 30  # an error, not a hang
    told = results[2]["alone"]
    assert "save(step=1) on rank 2: not every rank called it within 5 s (rank 0 did not answer" in told
    assert results[2]["seconds"] < 30 and "alone" not in results[1]
    assert results[0]["folders"] == []  # nothing half-written is left


def test_an_async_copy_that_fails_on_one_rank_fails_that_save_on_every_rank_and_commits_nothing(tmp_path: Path) -> None:
    """The copy's failure is not agreed on in the save's stall: rank 1's write fails inside DCP's planning, which
    fails every rank's write, and the next call that waits for it (here the next save) raises on every rank."""
    directory = checkpoints_dir(tmp_path)
    results = run_ranks("async_copy_fails", 2, tmp_path / "out", directory=str(directory))
    for rank, result in enumerate(results):
        [error] = result["errors"]
        assert f"save of checkpoint step 4 under {directory} failed on rank {rank}" in error
        assert f"failed on rank {rank}: rank 1: DefaultCPUAllocator: not enough memory" in error  # who and why
        assert "Traceback" not in error  # one line per rank, not DCP's gathered tracebacks
        assert result["folders"] == ["step-00000002", "step-00000006"]  # no step 4, nothing half-written


def test_async_saves_hold_the_state_of_their_step_while_training_goes_on(tmp_path: Path) -> None:
    """Two DDP ranks train between async saves (their collectives run in the background, beside the loop's)."""
    directory = checkpoints_dir(tmp_path)
    for result in run_ranks("async_saves", 2, tmp_path / "out", directory=str(directory)):
        assert (result["step"], result["equal"]) == (6, True)
        assert result["folders"] == ["step-00000004", "step-00000006"]
