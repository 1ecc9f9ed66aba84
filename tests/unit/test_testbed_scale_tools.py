"""scale-smoke's helpers: check-ranks (every rank on its node, counted by the report) and job-memory.

scale-smoke itself needs the 16-node cluster and most of the machine's memory
(docs/testing.md), so it is not run here; what it decides with is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from tests.cluster_scripts import CLUSTER_DIR, load_cluster_script

check_ranks = load_cluster_script("check-ranks")


def status_of(layout: dict[str, list[int]], phase: str = "done") -> dict[str, Any]:
    rows = [{"rank": rank, "node": node, "phase": phase} for node, ranks in layout.items() for rank in ranks]
    return {"status": "completed", "ranks": rows}


def report_of(nodes: int, devices: int) -> dict[str, Any]:
    return {"table": [{"nodes": nodes, "devices": devices}]}


def hal_layout(nodes: int = 16, tasks: int = 4) -> dict[str, list[int]]:
    return {f"n{node + 1}": list(range(node * tasks, (node + 1) * tasks)) for node in range(nodes)}


def test_sixty_four_ranks_on_sixteen_nodes_pass() -> None:
    assert check_ranks.problems(16, 4, status_of(hal_layout()), report_of(16, 64)) == []


def test_another_instances_nodes_are_checked_by_its_prefix(tmp_path: Path) -> None:
    """CI runs the scale smoke on cluster instance 2 (nodes l1..): ``slurm-cluster client-env`` exports the
    prefix, and the command takes it from there."""
    layout = {f"l{node + 1}": [2 * node, 2 * node + 1] for node in range(16)}
    assert check_ranks.problems(16, 2, status_of(layout), report_of(16, 32), prefix="l") == []
    assert any(
        p.startswith("ranks per node") for p in check_ranks.problems(16, 2, status_of(layout), report_of(16, 32))
    )
    status, report = tmp_path / "status.json", tmp_path / "report.json"
    status.write_text(json.dumps(status_of(layout)))
    report.write_text(json.dumps(report_of(16, 32)))
    command = [sys.executable, str(CLUSTER_DIR / "check-ranks"), "16", "2", str(status), str(report)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HPCTRAIN_TEST_NODE_PREFIX": "l"})
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done


def test_a_missing_rank_and_its_node_are_named() -> None:
    layout = hal_layout()
    layout["n16"].remove(63)
    found = check_ranks.problems(16, 4, status_of(layout), report_of(16, 64))
    assert "status lists 63 ranks, not 0..63" in found
    assert any("'n16': 3" in problem for problem in found)


def test_ranks_on_the_wrong_nodes_unfinished_ranks_and_a_miscounting_report_are_named() -> None:
    layout = {"n1": [0, 1, 2, 3], "n2": [4, 5, 6, 7]}  # 8 ranks, but on 2 of the 4 nodes asked for
    found = check_ranks.problems(4, 2, status_of(layout, phase="train"), report_of(4, 4))
    assert any(problem.startswith("ranks per node") for problem in found)
    assert "ranks not done: [0, 1, 2, 3, 4, 5, 6, 7]" in found
    assert "report table: 4 nodes, 4 devices" in found


def test_check_ranks_command_exits_non_zero_with_the_problem(tmp_path: Path) -> None:
    status, report = tmp_path / "status.json", tmp_path / "report.json"
    status.write_text(json.dumps(status_of(hal_layout(2, 2))))
    report.write_text(json.dumps(report_of(2, 3)))
    done = subprocess.run(
        [sys.executable, str(CLUSTER_DIR / "check-ranks"), "2", "2", str(status), str(report)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout.strip()) == (1, "report table: 2 nodes, 3 devices")
    missing = subprocess.run(
        [sys.executable, str(CLUSTER_DIR / "check-ranks"), "2", "2", str(tmp_path / "none.json"), str(report)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1 and "cannot read" in missing.stdout


def test_job_memory_counts_a_ranks_private_memory_apart_from_its_reaper() -> None:
    job_id = f"test-{uuid.uuid4().hex}"
    env = {**os.environ, "SLURM_JOB_ID": job_id}
    no_job = {key: value for key, value in os.environ.items() if key != "SLURM_JOB_ID"}

    def holding(mib: int) -> str:  # a process that writes MIB MiB and keeps them a few seconds
        return f"import time; held = bytearray({mib} << 20); held[::4096] = b'x' * len(held[::4096]); time.sleep(4)"

    # A rank (submitit's entry in its command line) and its reaper, which runs without SLURM_*.
    rank = subprocess.Popen([sys.executable, "-c", holding(64), "submitit.core._submit"], env=env)
    reaper_argv = ["hpctrain.runtime.cleanup", "watch", "--pid", str(rank.pid)]
    reaper = subprocess.Popen([sys.executable, "-c", holding(24), *reaper_argv], env=no_job)
    stranger = subprocess.Popen([sys.executable, "-c", holding(24), "submitit.core._submit"], env=no_job)
    try:
        done = subprocess.run(
            [sys.executable, str(CLUSTER_DIR / "job-memory"), job_id, "--interval", "0.2", "--timeout", "60"],
            capture_output=True,
            text=True,
            timeout=120,  # a hang guard: it ends when the job's processes have
        )
    finally:
        for process in (rank, reaper, stranger):
            process.kill()
            process.wait()
    line = done.stdout.strip()
    assert done.returncode == 0 and line.startswith(f"job-memory: job {job_id}:"), done.stdout + done.stderr
    assert " 1 ranks, " in line  # not the stranger, whose environment names no job
    median = int(line.split("anonymous per rank median ")[1].split(" MiB")[0])
    assert 64 <= median < 200
    other = int(line.split("other processes ")[1].split(" MiB")[0])
    assert 24 <= other < 64
