"""Multi-rank scenarios for the pipeline tests (spawned gloo ranks import them by name; each writes JSON)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torchvision
import trainer_harness
from torch import nn
from trainer_harness import job_spec, task_env, train

from hpctrain.jobspec.models import Pipeline as PipelineSpec
from hpctrain.trainer.precision import Precision
from hpctrain.trainer.step import TrainStep
from hpctrain.trainer.strategies.pipeline import Pipeline

BATCH, IMAGE, CLASSES = 8, 32, 4


def run_ranks(scenario: str, world_size: int, out_dir: Path, **kwargs: Any) -> list[Any]:
    """Run one of this module's SCENARIOS in ``world_size`` spawned gloo ranks (trainer_harness.run_ranks)."""
    return trainer_harness.run_ranks(SCENARIOS[scenario], world_size, out_dir, **kwargs)


def batch(replica: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Replica ``replica``'s batch: uint8 images as a loader yields them, and labels."""
    gen = torch.Generator().manual_seed(100 + replica)
    images = torch.randint(0, 256, (BATCH, 3, IMAGE, IMAGE), generator=gen, dtype=torch.uint8)
    return images, torch.randint(0, CLASSES, (BATCH,), generator=gen)


def reference_grads(model: nn.Module, replicas: int, microbatches: int) -> tuple[dict[str, torch.Tensor], float]:
    """The unsplit model's gradients of the mean loss over every replica's micro-batches (BatchNorm sees
    one micro-batch at a time, as in the pipeline), and that mean loss."""
    from hpctrain.trainer.batches import batch_to_device

    criterion = nn.CrossEntropyLoss()
    model.zero_grad()
    losses = []
    for replica in range(replicas):
        images, targets = batch_to_device(*batch(replica), torch.device("cpu"))
        for x, y in zip(images.chunk(microbatches), targets.chunk(microbatches), strict=True):
            loss = criterion(model(x), y)
            (loss / (microbatches * replicas)).backward()
            losses.append(float(loss.detach()))
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return grads, sum(losses[:microbatches]) / microbatches  # replica 0's mean loss: what rank 0 reports


def scenario_grads(rank: int, world_size: int, *, stages: int, schedule: str, microbatches: int) -> dict[str, Any]:
    """One pipeline step (lr 0) vs the unsplit model: loss and every parameter's gradient."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=CLASSES)
    reference = copy.deepcopy(model)
    ref_grads, ref_loss = reference_grads(reference, world_size // stages, microbatches)

    cfg = PipelineSpec(stages=stages, microbatches=microbatches, schedule=schedule)
    strategy = Pipeline(cfg, "resnet18", BATCH, IMAGE)
    device = torch.device("cpu")
    strategy.check(task_env(rank, world_size), device)
    stage = strategy.wrap(model, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0)
    step = TrainStep(
        stage, model, optimizer, scheduler, Precision("fp32", device), nn.CrossEntropyLoss(), strategy, device
    )
    sums = strategy.train_step(step)(*batch(rank // stages))

    compared, worst = [], 0.0
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        compared.append(name)
        worst = max(worst, float((param.grad - ref_grads[name]).abs().max() / (ref_grads[name].abs().max() + 1e-12)))
    return {
        "compared": compared,
        "worst_relative_diff": worst,
        "loss": float(sums[2] / sums[3]) if float(sums[3]) else None,
        "reference_loss": ref_loss,
        "split": strategy.split,
    }


def scenario_train(
    rank: int, world_size: int, *, data_root: str, run_dir: str, trainer: dict, resume: bool = True
) -> dict[str, Any]:
    """Train with the pipeline, then (``resume``) again in the same run directory with one more epoch."""
    spec = job_spec(Path(data_root), trainer={"strategy": "pipeline", **trainer})
    first = train(Path(run_dir), spec, rank=rank, world_size=world_size)
    if not resume:
        return {"first": first}
    more = {**trainer, "epochs": trainer["epochs"] + 1}
    spec = job_spec(Path(data_root), trainer={"strategy": "pipeline", **more})
    resumed = train(Path(run_dir), spec, rank=rank, world_size=world_size)
    return {"first": first, "resumed": resumed}


SCENARIOS: dict[str, Callable[..., Any]] = {"grads": scenario_grads, "train": scenario_train}
