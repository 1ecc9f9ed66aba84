"""dp's parallel loss: per-chunk losses reduced to the whole batch's mean, and the spec/trainer refusals.

Outputs split into chunks of unequal size stand in for the replicas' outputs
(on CPU the per-GPU losses run in a loop instead of parallel_apply); the
multi-GPU comparison with plain DataParallel is in tests/local/test_dp_parallel_loss_gpu.py.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.cross_checks import check_resolved
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.profiles import BUILTIN_PROFILES
from hpctrain.trainer.evaluation import batch_sums
from hpctrain.trainer.strategies import build_strategy
from hpctrain.trainer.strategies.dp import DataParallel
from hpctrain.trainer.strategies.dp_loss import DataParallelModel, parallel_loss, parallel_sums, scatter_like

CHUNKS = [5, 5, 3]  # what DataParallel gives 13 samples on 3 GPUs


def batch(classes: int = 7, n: int = 13) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(n, classes, generator=generator, dtype=torch.float64)
    return logits, torch.randint(0, classes, (n,), generator=generator)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_chunked_loss_and_gradient_equal_the_whole_batch(smoothing: float) -> None:
    criterion = nn.CrossEntropyLoss(label_smoothing=smoothing)
    logits, targets = batch()
    plain_in = logits.clone().requires_grad_()
    plain = criterion(plain_in, targets)
    plain.backward()
    chunked_in = logits.clone().requires_grad_()
    chunked = parallel_loss(criterion, tuple(chunked_in.split(CHUNKS)), targets)
    chunked.backward()
    torch.testing.assert_close(chunked, plain)
    torch.testing.assert_close(chunked_in.grad, plain_in.grad)


def test_an_unweighted_average_of_chunk_means_would_differ() -> None:
    """Why the weights matter: the last chunk is smaller, so averaging the chunk means is a different loss."""
    criterion = nn.CrossEntropyLoss()
    logits, targets = batch()
    means = [criterion(o, t) for o, t in zip(logits.split(CHUNKS), targets.split(CHUNKS), strict=True)]
    assert not torch.isclose(torch.stack(means).mean(), criterion(logits, targets))
    assert torch.isclose(parallel_loss(criterion, tuple(logits.split(CHUNKS)), targets), criterion(logits, targets))


def test_chunked_sums_equal_the_whole_batch() -> None:
    criterion = nn.CrossEntropyLoss()
    logits, targets = batch()
    loss = parallel_loss(criterion, tuple(logits.split(CHUNKS)), targets)
    chunked = parallel_sums(tuple(logits.split(CHUNKS)), targets, loss)
    plain = batch_sums(logits.float(), targets, criterion(logits, targets).float())
    torch.testing.assert_close(chunked, plain)


def test_one_tensor_takes_the_plain_path() -> None:
    criterion = nn.CrossEntropyLoss()
    logits, targets = batch()
    assert torch.equal(parallel_loss(criterion, logits, targets), criterion(logits, targets))
    loss = criterion(logits, targets)
    assert torch.equal(parallel_sums(logits, targets, loss), batch_sums(logits.float(), targets, loss.float()))


def test_targets_are_cut_in_order_into_the_outputs_sizes() -> None:
    logits, targets = batch()
    parts = scatter_like(targets, tuple(logits.split(CHUNKS)))
    assert [p.shape[0] for p in parts] == CHUNKS
    assert torch.cat(parts).equal(targets)


def test_targets_that_do_not_match_the_outputs_are_an_error() -> None:
    logits, targets = batch()
    with pytest.raises(ValueError, match="12 samples but there are 13 targets"):
        scatter_like(targets, tuple(logits[:12].split(4)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_without_gpus_the_model_returns_one_tensor() -> None:
    """On CPU DataParallel calls the module directly: parallel loss degenerates to plain dp."""
    model = DataParallelModel(nn.Linear(4, 3))
    model.train()
    assert isinstance(model(torch.randn(6, 4)), torch.Tensor)


def spec(**trainer: object) -> JobSpec:
    return JobSpec.model_validate(
        {"name": "a", "resources": {"gpus_per_node": 2}, "data": {"root": "/d"}, "trainer": trainer}
    )


def test_dp_reads_the_setting() -> None:
    strategy = build_strategy(spec(strategy="dp", dp_parallel_loss=True))
    assert isinstance(strategy, DataParallel) and strategy.parallel_loss
    assert not build_strategy(spec(strategy="dp")).parallel_loss


@pytest.mark.parametrize("strategy", ["ddp", "single"])
def test_other_strategies_refuse_it(strategy: str) -> None:
    bad = spec(strategy=strategy, dp_parallel_loss=True)
    problems = [p for p in check_resolved(bad, BUILTIN_PROFILES["hal"]) if p.key == "trainer.dp_parallel_loss"]
    assert problems and "trainer.strategy: dp" in problems[0].message
    with pytest.raises(TrainingConfigError, match="only dp computes the loss per GPU"):
        build_strategy(bad)


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="with 2 GPUs the benchmark measures")
def test_the_benchmark_says_it_needs_two_gpus(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Run as its command line runs it, in this process: a child would import torch again (~5 CPU s)."""
    script = Path(__file__).parents[2] / "benchmarks" / "dp_parallel_loss.py"
    monkeypatch.setattr(sys, "argv", [str(script)])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 2
    stderr = capsys.readouterr().err
    assert "needs >= 2 CUDA devices" in stderr and "nothing measured" in stderr
