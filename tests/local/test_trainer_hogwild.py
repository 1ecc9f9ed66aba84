"""Hogwild: two forked CPU workers update one shared model, each on its own shard of the train set."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from trainer_harness import job_spec, task_env, train

from hpctrain.contract.rundir import checkpoints_dir, summary_path
from hpctrain.errors import TrainingConfigError
from hpctrain.task.weights import weights_sha256
from hpctrain.trainer.checkpoint import CheckpointManager
from hpctrain.trainer.data import ResumableDistributedSampler
from hpctrain.trainer.models import build_model
from hpctrain.trainer.strategies import check_strategy

pytestmark = pytest.mark.local_dist


def hogwild_spec(data_root: Path, **trainer: object):
    return job_spec(
        data_root,
        trainer={"strategy": "hogwild", "hogwild_processes": 2, "epochs": 2, "max_steps_per_epoch": 3, **trainer},
    )


def test_two_workers_train_disjoint_shards(data_root: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    result = train(tmp_path, hogwild_spec(data_root))
    assert result["status"] == "completed" and result["strategy"] == "hogwild"
    assert result["global_step"] == 12 and result["epochs_completed"] == 2  # 2 workers x 3 steps x 2 epochs
    assert result["global_batch_size"] == 16
    assert 0 < result["data_wait_fraction"] <= 1  # the workers' time waiting for batches, of their train time

    # Every worker took its own shard: worker i of 2 consumed the first samples of shard i, no overlap.
    train_len = 4 * 16
    epoch1 = []  # the report is the last epoch's
    for i in range(2):
        sampler = ResumableDistributedSampler(range(train_len), 2, i, seed=0)
        sampler.set_epoch(1)
        epoch1.append(list(sampler))
    for report in result["hogwild_workers"]:
        i = report["worker"]
        seen = epoch1[i][: report["samples"]]
        assert report["shard"] == [i, 2] and report["steps"] == 3 and report["samples"] == 24
        assert report["indices_sha256"] == hashlib.sha256(str(seen).encode()).hexdigest()
    assert not set(epoch1[0][:24]) & set(epoch1[1][:24])

    # The shared model really changed, and the workers' momentum came back for the checkpoint.
    torch.manual_seed(0)
    initial = build_model(job_spec(data_root).trainer, 4, image_size=32)
    assert weights_sha256(initial.state_dict()) != result["weights_sha256"]
    state = CheckpointManager(checkpoints_dir(tmp_path)).load()
    assert state["hogwild"]["processes"] == 2 and len(state["hogwild"]["workers"]) == 2
    assert state["hogwild"]["workers"][0]["optimizer"]["state"]


def test_hogwild_stops_and_resumes(data_root: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    spec = hogwild_spec(data_root, epochs=1, log_every_steps=1)
    from trainer_harness import context

    from hpctrain.trainer.trainer import Trainer

    ctx = context(tmp_path, spec)
    ctx.stop.request("preempted")  # already asked to stop: workers stop at their first step boundary
    stopped = Trainer(ctx).fit()
    assert stopped["status"] == "stopped" and stopped["stop_reason"] == "preempted"
    assert stopped["epochs_completed"] == 0
    resumed = train(tmp_path, spec)
    assert resumed["status"] == "completed" and resumed["epochs_completed"] == 1 and resumed["restarts"] == 1
    assert resumed["global_step"] == 6


def test_hogwild_refuses_cuda_and_several_tasks() -> None:
    with pytest.raises(TrainingConfigError, match="CPU-only"):
        check_strategy("hogwild", task_env(), torch.device("cuda", 0))
    with pytest.raises(TrainingConfigError, match="one task"):
        check_strategy("hogwild", task_env(0, 2), torch.device("cpu"))


def test_a_failing_worker_fails_the_run_with_its_traceback(
    data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hpctrain.trainer.strategies.hogwild as hogwild

    def broken_loaders(*args: object, **kwargs: object) -> None:
        raise ValueError("worker-side failure")

    monkeypatch.setattr(hogwild, "build_loaders", broken_loaders)  # forked workers inherit the patch
    with pytest.raises(RuntimeError, match="worker-side failure"):
        train(tmp_path, hogwild_spec(data_root, epochs=1))
    summary = json.loads(summary_path(tmp_path).read_text())
    assert summary["status"] == "failed" and "hogwild worker" in summary["error"]
