"""Node-local staging on the real cluster: one copy per node, every rank reads it, gone once the run ends.

The test cluster's nodes share this machine's disk, so the stage dir names the
node (``{node}``): each node gets its own folder, as on a real cluster where
``$SLURM_TMPDIR`` is a node's local disk. A stage dir is never created, so
the test makes each node's. (A requeued attempt reusing its copy:
``test_shared_fs_e2e``.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpctrain.contract.rundir import summary_path

from .hpctrain_cli import cli_env, data_sets, make_dataset, submit_json, task_logs, task_output

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# Safe beside other tests on the one cluster (conftest.py: slurm_shared; scripts/test.sh runs these two at a time).
pytestmark = pytest.mark.slurm_shared

SMOKE_SPEC = "jobs/smoke_2x2_cpu.yaml"


def test_each_node_stages_once_into_its_own_folder_removed_when_the_run_ends(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    env = cli_env(slurm_cluster, tmp_path / "state")
    data, stage = tmp_path / "data", tmp_path / "stage"
    for node in slurm_cluster.nodes:
        (stage / node).mkdir(parents=True)
    make_dataset(env, data)
    staged = ("data.stage=node", "trainer.epochs=1")

    def submit() -> Path:
        sets = data_sets(data, tmp_path / "runs", *staged, f"data.stage_dir={stage}/{{node}}")
        done, report = submit_json(env, SMOKE_SPEC, *sets, "--wait", timeout=300)
        run_dir = Path(report["run_dir"])
        assert done.returncode == 0, f"{done}\n{task_logs(run_dir)}"
        return run_dir

    first = submit()
    summary = json.loads(summary_path(first).read_text())
    assert summary["status"] == "completed" and summary["skipped_samples"] == 0, summary
    output = task_output(first)
    assert output.count("hpctrain: staged ") == 2, output  # one copy per node, by its first task
    assert output.count("reading the staged copy") == 4, output  # every rank trains on it
    for node in sorted(p.name for p in stage.iterdir()):
        (mine,) = (stage / node).iterdir()  # the user's own folder, mode 0700 ...
        assert mine.name.startswith("hpctrain-") and mine.stat().st_mode & 0o777 == 0o700
        assert list(mine.iterdir()) == [], list(mine.iterdir())  # ... and the job's copy gone with the run
    assert output.count("(the run has ended)") == 2, output  # by each node's last task

    sets = data_sets(data, tmp_path / "runs", *staged, f"data.stage_dir={tmp_path / 'nowhere'}/{{node}}")
    missing, report = submit_json(env, SMOKE_SPEC, *sets, "--wait", timeout=300)
    assert missing.returncode != 0 and "does not exist" in task_output(Path(report["run_dir"]))
    assert not (tmp_path / "nowhere").exists()  # never created
