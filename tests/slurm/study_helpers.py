"""A finished smoke study on the test cluster, for the study tests and the ones built on them.

``run_smoke_study`` submits ``jobs/study_smoke_cpu.yaml`` (the smoke job on 1
and 2 nodes x 2 CPU tasks, one Slurm job per point) with ``--wait`` and hands
back the completed study directory; reports and status checks read it.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .hpctrain_cli import CliResult, cli_env, data_sets, make_dataset, submit_json, task_logs

if TYPE_CHECKING:
    import pytest

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


# The shared study trains 3 epochs (9 steps a point): the report's table needs steady-state rates.
SHARED_STUDY_SETS = ("trainer.epochs=3",)


def shared_smoke_study(tmp_path_factory: pytest.TempPathFactory, cluster: SlurmCluster) -> SmokeStudy:
    """The one smoke study of a pytest session, its xdist workers included: the first module to ask
    submits it (``run_smoke_study``), the others wait on a lock beside it and read what it recorded. The
    study and report tests only read the finished study (the report adds its own folder), so they share
    it: two studies (four jobs, twelve rank starts) cost a Slurm leg's shared half ~1 minute more."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # popen-gwN's parent: the one folder of this session's workers
    record = root / "shared-smoke-study.json"
    with open(root / "shared-smoke-study.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if the study raises
        if record.is_file():
            saved = json.loads(record.read_text())
            saved["submitted"]["args"] = tuple(saved["submitted"]["args"])
            return SmokeStudy(saved["env"], CliResult(**saved["submitted"]), Path(saved["study_dir"]), saved["runs"])
        folder = root / "shared-smoke-study"
        folder.mkdir()
        study = run_smoke_study(folder, cluster, *SHARED_STUDY_SETS)
        saved = dataclasses.asdict(study)
        saved["study_dir"] = str(study.study_dir)
        record.write_text(json.dumps(saved))
        return study
