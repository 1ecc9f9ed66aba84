"""What a tracker received from a Slurm run, checked against the run directory.

Shared by the tests whose existing jobs also carry a tracker (CI time: no job of
their own): the one MLflow run of a run (``tracking.live`` from the nodes, or
``hpctrain sync`` from here) and the one W&B offline run, read back with W&B's
own reader. "Each step once" means metrics.jsonl's last value of each optimizer
step (the start that kept it), once.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from hpctrain.contract.rundir import metrics_path, tracking_dir
from tests.tracking_helpers import last_values, wandb_records

LIVE_INTERVAL_S = 5


def live_mlflow_sets(uri: str, experiment: str) -> tuple[str, ...]:
    """``--set`` values: the run goes to ``experiment`` at ``uri``, sent from the nodes as it trains."""
    return (
        f"tracking.mlflow.tracking_uri={uri}",
        f"tracking.mlflow.experiment={experiment}",
        "tracking.live=true",
        f"tracking.live_interval_s={LIVE_INTERVAL_S}",
    )


def tracking_id(run_dir: Path) -> str:
    return json.loads((run_dir / "run.json").read_text())["tracking_id"]


def live_state(run_dir: Path) -> dict[str, Any]:
    """``live.json``: what the last start's sender did."""
    return json.loads((tracking_dir(run_dir) / "live.json").read_text())


def live_steps_sent(run_dir: Path) -> int:
    """Steps the senders of every start sent, from their log (``mlflow: sent N, ...`` per sync).

    A lower bound, never more (docs/tracking.md): a sync writes its line only after its cursor recorded the
    steps, and cursors record each step once; a sender killed in between (SIGKILL: its node lost, or Slurm's
    KillWait over during its last sync) delivered and recorded steps it never wrote a line for."""
    log = (tracking_dir(run_dir) / "live.log").read_text()
    return sum(int(n) for n in re.findall(r"^\S+ mlflow: sent (\d+),", log, flags=re.MULTILINE))


def assert_live_steps_counted(run_dir: Path, total: int, *, others: int = 0) -> None:
    """The senders of the starts sent steps, and they with ``others`` (the login side's syncs' ``sent``)
    counted each of the ``total`` steps at most once: what is exact (each step once in the tracker) is
    checked there (:func:`assert_one_mlflow_run_each_step_once`); the counts are :func:`live_steps_sent`'s
    lower bound."""
    live = live_steps_sent(run_dir)
    log = (tracking_dir(run_dir) / "live.log").read_text()
    assert live > 0 and live + others <= total, f"live {live} + others {others} vs {total} steps:\n{log[-3000:]}"


def assert_one_mlflow_run_each_step_once(uri: str, experiment: str, run_dir: Path) -> Any:
    """The run is ONE MLflow run whose ``train/loss`` history has each step once, with its last value; that run."""
    import mlflow

    client = mlflow.tracking.MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r} at {uri}"
    [tracked] = client.search_runs([found.experiment_id])  # ONE run for every start of the job
    assert tracked.data.tags["hpctrain.tracking_id"] == tracking_id(run_dir), tracked.data.tags
    history = client.get_metric_history(tracked.info.run_id, "train/loss")
    expected = last_values(metrics_path(run_dir))
    assert Counter(m.step for m in history) == dict.fromkeys(expected, 1), "each optimizer step exactly once"
    assert {m.step: m.value for m in history} == expected, "the value of the start that kept the step"
    return tracked


def assert_one_wandb_run_each_step_once(run_dir: Path, project: str) -> list[dict[str, Any]]:
    """The run's W&B offline folder is ONE run (the tracking id) whose ``train/loss`` is each step once, with
    its last value; the history items."""
    folders = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(folders) == 1 and folders[0].name.endswith(tracking_id(run_dir)), folders
    records = wandb_records(run_dir / "wandb")
    [started] = [r["run"] for r in records if r["type"] == "run"]
    assert (started["run_id"], started["project"]) == (tracking_id(run_dir), project), started
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    losses = [(item["_step"], item["train/loss"]) for item in history if "train/loss" in item]
    assert losses == sorted(last_values(metrics_path(run_dir)).items()), "each step once, in order, its last value"
    return history
