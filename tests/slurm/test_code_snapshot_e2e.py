"""A job runs the code it was submitted with: an edit made while it waits reaches neither it nor its requeue."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpctrain.contract.rundir import code_dir, run_info_path
from tests.git_helpers import git

from .hpctrain_cli import cli_env, hpctrain, task_logs
from .stop_helpers import job_record, wait_for, wait_requeued

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# Safe beside other tests on the one cluster (conftest.py: slurm_shared; scripts/test.sh runs these two at a time).
pytestmark = pytest.mark.slurm_shared

ENTRY_SOURCE = '''
import time
from pathlib import Path

VERSION = {version!r}


def main(ctx, max_s: float = 120.0):
    """Record which code this attempt runs; wait for a stop on the first attempt, finish on the next."""
    attempt = ctx.env.restart_count
    Path(ctx.run_dir, f"seen-{{attempt}}-{{ctx.env.global_rank}}.txt").write_text(VERSION)
    if attempt > 0:
        return {{"status": "completed", "version": VERSION}}
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        reason = ctx.stop.agreed()
        if reason is not None:
            return {{"status": "stopped", "stop_reason": reason}}
        time.sleep(0.2)
    return {{"status": "completed", "version": VERSION}}
'''

SPEC = """
name: snapshot_e2e
cluster: slurm
output_dir: {runs}
entrypoint: snapcase_e2e.job:main
resources:
  nodes: 1
  tasks_per_node: 1
  gpus_per_node: 0
  cpus_per_task: 1
  time: "00:05:00"
  partition: debug
  slurm_extra:
    begin: now+10
distributed:
  backend: gloo
  timeout_s: 60
signals:
  signal_delay_s: 30
"""


def write_entry(repo: Path, version: str) -> None:
    (repo / "snapcase_e2e" / "job.py").write_text(ENTRY_SOURCE.format(version=version))


def test_edit_after_submit_reaches_neither_the_job_nor_its_requeue(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """... and the copy holds what the entry point imports, not the secrets of a dotfiles tree around it."""
    repo = tmp_path / "usercode"  # a dotfiles $HOME under git, the package in it
    (repo / "snapcase_e2e").mkdir(parents=True)
    (repo / "snapcase_e2e" / "__init__.py").write_text("")
    write_entry(repo, "as-submitted")
    (repo / ".ssh").mkdir()
    (repo / ".ssh" / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (repo / "notes.txt").write_text("private\n")
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("not the job's\n")
    (repo / "snapcase_e2e" / "shadow.py").symlink_to(outside)
    git(repo, "init", "-q")
    git(repo, "add", "snapcase_e2e")
    git(repo, "commit", "-q", "-m", "user code")  # .ssh/id_rsa, notes.txt: untracked, not ignored
    spec = tmp_path / "snapshot.yaml"
    spec.write_text(SPEC.format(runs=tmp_path / "runs"))
    # The live tree stays importable on the nodes too: only the copy's place first on sys.path protects the job.
    env = {**cli_env(slurm_cluster, tmp_path / "state"), "PYTHONPATH": f"{repo}:{slurm_cluster.env['PYTHONPATH']}"}

    submitted = hpctrain(env, "submit", str(spec), "--json")
    assert submitted.returncode == 0, submitted
    job_id, run_dir = submitted.json()["job_id"], Path(submitted.json()["run_dir"])
    write_entry(repo, "edited-after-submit")
    assert job_record(slurm_cluster, job_id).get("JobState") == "PENDING", "the edit must land while the job waits"

    info = json.loads(run_info_path(run_dir).read_text())["code_snapshot"]
    assert (info["git_commit"], info["git_dirty"]) == (git(repo, "rev-parse", "HEAD"), False), info
    copied = sorted(p.relative_to(code_dir(run_dir)).as_posix() for p in code_dir(run_dir).rglob("*"))
    assert copied == ["snapcase_e2e", "snapcase_e2e/__init__.py", "snapcase_e2e/job.py"], copied
    assert info["left_out"] == [f"snapcase_e2e/shadow.py: a symlink to {outside.resolve()}, outside {repo.resolve()}"]

    first = run_dir / "seen-0-0.txt"
    wait_for(lambda: first.is_file() or None, "the first attempt to start", 120)
    slurm_cluster.run("scancel", "--signal=USR2", job_id)  # the time-limit warning: stop, checkpoint, requeue
    wait_requeued(slurm_cluster, job_id, restarts=1, timeout=90)
    slurm_cluster.release(job_id)  # a requeued job waits for its new begin time; no need to here
    second = run_dir / "seen-1-0.txt"
    wait_for(lambda: second.is_file() or None, "the requeued attempt to start", 120)

    assert first.read_text() == "as-submitted", task_logs(run_dir)
    assert second.read_text() == "as-submitted", task_logs(run_dir)
    assert (code_dir(run_dir) / "snapcase_e2e" / "job.py").read_text().count("as-submitted") == 1


def test_no_snapshot_runs_the_live_tree(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    repo = tmp_path / "usercode"
    (repo / "snapcase_e2e").mkdir(parents=True)
    (repo / "snapcase_e2e" / "__init__.py").write_text("")
    write_entry(repo, "as-submitted")
    spec = tmp_path / "snapshot.yaml"
    spec.write_text(SPEC.format(runs=tmp_path / "runs"))
    env = {**cli_env(slurm_cluster, tmp_path / "state"), "PYTHONPATH": f"{repo}:{slurm_cluster.env['PYTHONPATH']}"}

    submitted = hpctrain(env, "submit", str(spec), "--json", "--no-snapshot")
    assert submitted.returncode == 0, submitted
    job_id, run_dir = submitted.json()["job_id"], Path(submitted.json()["run_dir"])
    write_entry(repo, "edited-after-submit")
    assert not code_dir(run_dir).exists()
    first = run_dir / "seen-0-0.txt"
    wait_for(lambda: first.is_file() or None, "the job to start", 120)
    assert first.read_text() == "edited-after-submit"
    hpctrain(env, "cancel", str(run_dir))
    assert job_id


def test_an_entry_point_that_cannot_take_ctx_fails_naming_it(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A decorated function passes the login node's check from source (a decorator may change a
    signature); the task binds the real one and fails with a message, not a raw TypeError."""
    repo = tmp_path / "usercode"
    (repo / "snapcase_e2e").mkdir(parents=True)
    (repo / "snapcase_e2e" / "__init__.py").write_text("")
    (repo / "snapcase_e2e" / "job.py").write_text(
        "import functools\n\n\ndef logged(f):\n    @functools.wraps(f)\n    def inner(*a, **k):\n"
        "        return f(*a, **k)\n    return inner\n\n\n@logged\ndef main():\n    return 1\n"
    )
    spec = tmp_path / "snapshot.yaml"
    spec.write_text(SPEC.format(runs=tmp_path / "runs").replace("    begin: now+10\n", "    comment: sig\n"))
    env = {**cli_env(slurm_cluster, tmp_path / "state"), "PYTHONPATH": f"{repo}:{slurm_cluster.env['PYTHONPATH']}"}
    submitted = hpctrain(env, "submit", str(spec), "--json")
    assert submitted.returncode == 0, submitted
    job_id, run_dir = submitted.json()["job_id"], Path(submitted.json()["run_dir"])
    assert slurm_cluster.wait_state(job_id, timeout=120) == "FAILED", task_logs(run_dir)
    logs = task_logs(run_dir)
    assert "entrypoint 'snapcase_e2e.job:main': hpctrain calls it as main(ctx), but its signature ()" in logs, logs
    assert "TypeError" not in logs, logs
