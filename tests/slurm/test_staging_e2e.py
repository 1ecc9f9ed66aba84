"""Node-local staging on the real cluster: one copy per node, every rank reads it, a rerun skips the copy.

The test cluster's nodes share this machine's disk, so the stage dir names the
node (``{node}``): each node gets its own folder, as on a real cluster where
``$SLURM_TMPDIR`` is a node's local disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.contract.rundir import summary_path

from .hpctrain_cli import cli_env, hpctrain, task_logs, task_output

if TYPE_CHECKING:
    from .conftest import SlurmCluster

SMOKE_SPEC = "jobs/smoke_2x2_cpu.yaml"


def test_each_node_stages_once_and_a_rerun_reuses_the_copy(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    env = cli_env(slurm_cluster, tmp_path / "state")
    data, stage = tmp_path / "data", tmp_path / "stage"
    made = hpctrain(env, "make-dataset", str(data), "--classes", "4", "--per-class", "16", "--image-size", "32")
    assert made.returncode == 0, made

    def submit() -> Path:
        done = hpctrain(
            env, "submit", SMOKE_SPEC, "--set", f"data.root={data}", "--set", f"output_dir={tmp_path / 'runs'}",
            "--set", "data.stage=node", "--set", f"data.stage_dir={stage}/{{node}}", "--set", "trainer.epochs=1",
            "--wait", "--json", timeout=300,
        )  # fmt: skip
        run_dir = Path(done.json()["run_dir"])
        assert done.returncode == 0, f"{done}\n{task_logs(run_dir)}"
        return run_dir

    first = submit()
    summary = json.loads(summary_path(first).read_text())
    assert summary["status"] == "completed" and summary["skipped_samples"] == 0, summary
    nodes = sorted(p.name for p in stage.iterdir())
    assert nodes == ["n1", "n2"], nodes
    for node in nodes:
        (copy,) = (stage / node).iterdir()
        assert (copy / "STAGED").is_file()
        assert len(list(copy.rglob("*.jpg"))) == len(list(data.rglob("*.jpg")))
    output = task_output(first)
    assert output.count("MB/s") == 2, output  # one copy per node, by its first task
    assert output.count("reading the staged copy") == 4, output  # every rank trains on it

    second = task_output(submit())
    assert "MB/s" not in second and second.count("staged already") == 2, second
