"""Helpers for the ``script:`` job tests: a folder of the test scripts as a user keeps it, specs, what a start did.

The scripts (``tests/slurm/scripts/``: plain PyTorch, gloo on CPU) are copied
into a folder of the cluster's unprivileged test user, outside any git tree, so
``submit`` snapshots that folder as it would a user's. Every script leaves in
its working directory (the run directory) ``steps.log`` (each step rank 0
trained, and each start: ``start RESTART FROM_STEP``) and
``env-RESTART-RANK.json`` (its arguments, folder and environment); see
``scripts/common.py``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from .hpctrain_cli import cli_env, hpctrain
from .stop_helpers import Run, preempt, wait_for, wait_requeued

if TYPE_CHECKING:
    from .conftest import SlurmCluster

SCRIPTS = Path(__file__).resolve().parent / "scripts"
SPREAD = {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1, "time": "00:10:00", "partition": "debug"}


@dataclass
class ScriptWorkspace:
    """The test user's folder: ``scripts/`` (the test scripts), ``specs/``, and where runs go."""

    env: dict[str, str]
    folder: Path

    @property
    def scripts(self) -> Path:
        return self.folder / "scripts"

    def spec(self, name: str, script: dict[str, Any], **sections: Any) -> Path:
        """A spec for a 2 x 2 CPU job running ``script`` (``path`` relative to ``scripts/``), without the burn-in."""
        script = {**script, "path": str(self.scripts / script["path"])}
        data: dict[str, Any] = {
            "name": name,
            "cluster": "slurm",
            "output_dir": str(self.folder / "runs"),
            "resources": dict(SPREAD),
            "distributed": {"timeout_s": 120},
            "signals": {"signal_delay_s": 60},
            # the burn-in's own test is test_node_loss_e2e.py's; here it would only add its seconds to each start
            "health": {"burn_in": {"enabled": False}},
            "script": script,
        }
        for key, value in sections.items():
            data[key] = {**data[key], **value} if isinstance(data.get(key), dict) else value
        path = self.folder / "specs" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(data))
        return path

    def submit(self, spec: Path, *options: str) -> Run:
        done = hpctrain(self.env, "submit", str(spec), "--json", *options, timeout=90)
        assert done.returncode == 0, done
        report = done.json()
        return Run(report["job_id"], Path(report["run_dir"]))


def make_script_workspace(cluster: SlurmCluster, tmp: Path, as_user: bool = True) -> ScriptWorkspace:
    """With ``as_user``, in a folder of the cluster's unprivileged test user, who submits and cancels."""
    folder = cluster.user_dir(tmp.name) if as_user else tmp
    scripts = folder / "scripts"
    scripts.mkdir()
    for source in SCRIPTS.glob("*.py"):
        shutil.copy2(source, scripts / source.name)
    return ScriptWorkspace(cli_env(cluster, folder / "state", as_user=as_user), folder)


def steps_trained(run_dir: Path) -> list[int]:
    """Every step rank 0 trained, in order, over all starts."""
    return [int(line.split()[1]) for line in _lines(run_dir / "steps.log") if line.startswith("step ")]


def starts(run_dir: Path) -> list[tuple[int, int]]:
    """(restart, the step it resumed from) of every start."""
    found = []
    for line in _lines(run_dir / "steps.log"):
        if line.startswith("start "):
            _, restart, step = line.split()
            found.append((int(restart), int(step)))
    return found


def env_report(run_dir: Path, restart: int, rank: int | str) -> dict[str, Any]:
    return json.loads((run_dir / f"env-{restart}-{rank}.json").read_text())


def has_checkpoint(run_dir: Path) -> bool:
    return (run_dir / "snapshot.pt").is_file()


def requeue_then_preempt_script(cluster: SlurmCluster, run: Run, tmp: Path, start_timeout: float) -> tuple[int, int]:
    """The time-limit signal (USR2) after the script's first checkpoint, then a job of the urgent partition once
    the second start trained two steps; each requeued start released at once. Returns the steps trained when
    the first and the second start stopped (the script's twin of ``stop_helpers.requeue_then_preempt``)."""
    wait_for(lambda: has_checkpoint(run.run_dir), "the script's first checkpoint", start_timeout, run)
    cluster.run("scancel", "--signal=USR2", run.job_id)
    wait_requeued(cluster, run.job_id, restarts=1, run=run)
    first_stop = len(steps_trained(run.run_dir))
    cluster.release(run.job_id)
    wait_for(lambda: len(steps_trained(run.run_dir)) > first_stop + 1, "steps of the second start", start_timeout, run)
    preemptor = preempt(cluster, tmp)  # two nodes, exclusive: one of the job's among them
    wait_requeued(cluster, run.job_id, restarts=2, timeout=90, run=run)
    second_stop = len(steps_trained(run.run_dir))
    cluster.release(run.job_id)
    assert cluster.wait_state(preemptor, timeout=60) == "COMPLETED"
    return first_stop, second_stop


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []
