"""Two local gloo ranks: DDP trains one model (same weights everywhere, exact validation over both
shards), and dp with one task per node keeps its tasks in step by averaging gradients by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_harness import job_spec, make_data, run_ranks, train

from hpctrain.contract.rundir import checkpoints_dir, summary_path
from hpctrain.trainer.checkpoint import CheckpointManager

pytestmark = pytest.mark.local_dist


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("two_ranks")
    data_root = make_data(tmp / "data")
    run_dir = tmp / "ddp"
    ranks = run_ranks("ddp", 2, tmp / "out", data_root=str(data_root), run_dir=str(run_dir), dp_run_dir=str(tmp / "dp"))
    return data_root, run_dir, ranks


def test_ddp_ranks_train_identical_models(two_ranks: tuple[Path, Path, list[dict[str, Any]]]) -> None:
    data_root, run_dir, ranks = two_ranks
    results = [r["ddp"] for r in ranks]
    assert [r["status"] for r in results] == ["completed", "completed"]
    assert [r["global_rank"] for r in results] == [0, 1]
    assert results[0]["weights_sha256"] == results[1]["weights_sha256"]
    assert results[0]["val_top1"] == results[1]["val_top1"]
    summary = json.loads(summary_path(run_dir).read_text())
    assert summary["world_size"] == 2 and summary["strategy"] == "ddp" and summary["global_step"] == 4
    assert summary["global_batch_size"] == 16 and summary["weights_sha256"] == results[0]["weights_sha256"]

    # Exact validation: one process evaluating the final checkpoint sees the same accuracy as the two shards.
    torch.set_num_threads(1)
    spec = job_spec(data_root, trainer={"evaluate_only": True, "epochs": 2})
    alone = train(run_dir, spec)
    assert alone["val_top1"] == results[0]["val_top1"] and alone["val_top5"] == results[0]["val_top5"]
    assert alone["weights_sha256"] == results[0]["weights_sha256"]


def test_multi_node_dp_trains_like_ddp(tmp_path: Path) -> None:
    """dp across nodes (buffers broadcast, gradients averaged by hand) gives ddp's weights after 4 steps."""
    data_root = make_data(tmp_path / "data")
    ranks = run_ranks("dp_like_ddp", 2, tmp_path / "out", data_root=str(data_root), base_dir=str(tmp_path))
    for result in ranks:
        assert result["ddp"]["global_step"] == result["dp"]["global_step"] == 4
        assert result["dp"]["global_batch_size"] == result["ddp"]["global_batch_size"] == 16
    ddp = CheckpointManager(checkpoints_dir(tmp_path / "ddp")).load()["model"]
    dp = CheckpointManager(checkpoints_dir(tmp_path / "dp")).load()["model"]
    assert ddp.keys() == dp.keys()
    for name, tensor in ddp.items():
        if tensor.is_floating_point():
            torch.testing.assert_close(dp[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
        else:
            assert torch.equal(dp[name], tensor), name


def test_multi_node_dp_keeps_tasks_in_step(two_ranks: tuple[Path, Path, list[dict[str, Any]]]) -> None:
    dp = [r["dp"] for r in two_ranks[2]]
    assert [r["status"] for r in dp] == ["completed", "completed"]
    assert dp[0]["num_nodes"] == 2 and dp[0]["global_batch_size"] == 16
    assert dp[0]["weights_sha256"] == dp[1]["weights_sha256"]
