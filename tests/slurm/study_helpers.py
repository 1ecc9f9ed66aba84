"""A finished smoke study on the test cluster, for the study tests and the ones built on them.

``run_smoke_study`` submits ``jobs/study_smoke_cpu.yaml`` (the smoke job on 1
and 2 nodes x 2 CPU tasks, one Slurm job per point) with ``--wait`` and hands
back the completed study directory; reports and status checks read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .hpctrain_cli import CliResult, cli_env, data_sets, make_dataset, submit_json, task_logs

if TYPE_CHECKING:
    from .conftest import SlurmCluster

STUDY_SPEC = "jobs/study_smoke_cpu.yaml"


@dataclass
class SmokeStudy:
    env: dict[str, str]  # the CLI environment the study was submitted with (its job registry included)
    submitted: CliResult
    study_dir: Path
    runs: list[dict[str, Any]]  # submit --json's "runs": job_id, run_dir, label, world_size

    def check_submitted(self) -> None:
        logs = "\n".join(task_logs(Path(run["run_dir"])) for run in self.runs)
        assert self.submitted.returncode == 0, f"{self.submitted}\n{logs}"


def run_smoke_study(tmp_path: Path, cluster: SlurmCluster, *overrides: str) -> SmokeStudy:
    """Make a tiny dataset, submit the smoke study with ``--wait``, return it once both points ended."""
    env = cli_env(cluster, tmp_path / "state")
    data = make_dataset(env, tmp_path / "data")
    submitted, report = submit_json(
        env, STUDY_SPEC, *data_sets(data, tmp_path / "runs", *overrides), "--wait", timeout=600
    )
    return SmokeStudy(env, submitted, Path(report["study_dir"]), report["runs"])
