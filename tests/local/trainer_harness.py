"""Shared set-up for the trainer tests: a tiny dataset, specs, hand-built task contexts, 2-rank runs.

Multi-rank scenarios live here (not in the test modules) so spawned processes
can import them by name; each rank writes its results as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from forked_ranks import start_ranks

from hpctrain.dataset.generate import make_dataset
from hpctrain.jobspec.models import JobSpec
from hpctrain.runtime.context import TaskContext, TaskEnv
from hpctrain.runtime.stop import StopRequest
from hpctrain.trainer.trainer import Trainer
from tests.net_helpers import free_port

DATASET = {"classes": 4, "per_class": 16, "image_size": 32}


def make_data(root: Path) -> Path:
    make_dataset(root, **DATASET)
    return root


def job_spec(data_root: Path, *, trainer: dict | None = None, checkpoint: dict | None = None) -> JobSpec:
    """A spec for resnet18 on 32 px images, 8 per batch, a few steps per epoch."""
    trainer_section = {
        "arch": "resnet18",
        "strategy": "single",
        "batch_size": 8,
        "epochs": 1,
        "max_steps_per_epoch": 3,
        "log_every_steps": 2,
        **(trainer or {}),
    }
    return JobSpec.model_validate(
        {
            "name": "trainer-test",
            "trainer": trainer_section,
            "data": {"root": str(data_root), "image_size": 32, "val_resize": 36, "workers": 0},
            "checkpoint": checkpoint or {},
        }
    )


def task_env(rank: int = 0, world_size: int = 1, *, one_task_per_node: bool = False) -> TaskEnv:
    """Every rank on one node, or (``one_task_per_node``) each rank pretending to be its own node."""
    nodes = world_size if one_task_per_node else 1
    return TaskEnv(
        global_rank=rank,
        world_size=world_size,
        local_rank=0 if one_task_per_node else rank,
        local_world_size=world_size // nodes,
        node_rank=rank if one_task_per_node else 0,
        num_nodes=nodes,
        hostnames=tuple(f"node{i}" for i in range(nodes)) if one_task_per_node else ("localhost",),
        master_addr="127.0.0.1",
        master_port=29500,
        job_id="4242",
        restart_count=0,
        source="single" if world_size == 1 else "submitit-local",
    )


def context(
    run_dir: Path, spec: JobSpec, *, rank: int = 0, world_size: int = 1, device: str = "cpu", **env: bool
) -> TaskContext:
    return TaskContext(
        env=task_env(rank, world_size, **env),
        spec=spec,
        run_dir=Path(run_dir),
        device=torch.device(device),
        stop=StopRequest(),
    )


def stop_at(global_step: int, reason: str = "timeout", rank: int | None = None) -> Callable[[Trainer], None]:
    """An on_step hook raising a stop request (on ``rank`` only, or every rank) after ``global_step``."""

    def hook(trainer: Trainer) -> None:
        if trainer.progress.global_step == global_step and rank in (None, trainer.env.global_rank):
            trainer.ctx.stop.request(reason)  # type: ignore[arg-type]

    return hook


def train(
    run_dir: Path,
    spec: JobSpec,
    *,
    rank: int = 0,
    world_size: int = 1,
    stop_after: int | None = None,
    stop_rank: int | None = None,
) -> dict[str, Any]:
    hook = stop_at(stop_after, rank=stop_rank) if stop_after is not None else None
    return Trainer(context(run_dir, spec, rank=rank, world_size=world_size), on_step=hook).fit()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- several ranks ----------------------------------------------------------------------------------------------
def run_ranks(scenario: str | Callable[..., Any], world_size: int, out_dir: Path, **kwargs: Any) -> list[Any]:
    """Run ``scenario(rank, world_size, **kwargs)`` in ``world_size`` spawned gloo ranks; their results.

    ``scenario`` names one of this module's SCENARIOS, or is a module-level function of another harness.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    start_ranks(_rank_main, (world_size, free_port(), scenario, out_dir, kwargs), world_size)
    return [json.loads((out_dir / f"rank-{rank}.json").read_text()) for rank in range(world_size)]


def _rank_main(
    rank: int, world_size: int, port: int, scenario: str | Callable[..., Any], out_dir: Path, kwargs: dict
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        run = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
        result = run(rank, world_size, **kwargs)
    finally:
        dist.destroy_process_group()
    (out_dir / f"rank-{rank}.json").write_text(json.dumps(result))


def scenario_ddp(rank: int, world_size: int, *, data_root: str, run_dir: str, dp_run_dir: str) -> dict[str, Any]:
    """DDP over all ranks, then dp with one task per (pretend) node: gradients averaged by hand."""
    spec = job_spec(Path(data_root), trainer={"strategy": "ddp", "epochs": 2, "max_steps_per_epoch": 2})
    ddp = train(Path(run_dir), spec, rank=rank, world_size=world_size)
    spec = job_spec(Path(data_root), trainer={"strategy": "dp", "epochs": 1, "max_steps_per_epoch": 2})
    ctx = context(Path(dp_run_dir), spec, rank=rank, world_size=world_size, one_task_per_node=True)
    return {"ddp": ddp, "dp": Trainer(ctx).fit()}


def scenario_resume(rank: int, world_size: int, *, data_root: str, base_dir: str, stop_after: int) -> dict[str, Any]:
    """Uninterrupted vs stopped (on rank 1 only) and resumed, both deterministic ddp (dropout: RNG matters)."""
    trainer = {
        "arch": "mobilenet_v3_small",
        "strategy": "ddp",
        "epochs": 2,
        "deterministic": True,
        "max_steps_per_epoch": 3,
    }
    spec = job_spec(Path(data_root), trainer=trainer)
    base = Path(base_dir)
    full = train(base / "full", spec, rank=rank, world_size=world_size)
    stopped = train(base / "split", spec, rank=rank, world_size=world_size, stop_after=stop_after, stop_rank=1)
    resumed = train(base / "split", spec, rank=rank, world_size=world_size)
    return {"full": full, "stopped": stopped, "resumed": resumed}


def scenario_dp_like_ddp(rank: int, world_size: int, *, data_root: str, base_dir: str) -> dict[str, Any]:
    """The same deterministic training as ddp over all ranks, and as dp with one task per (pretend) node."""
    trainer = {"epochs": 2, "max_steps_per_epoch": 2, "deterministic": True}
    base = Path(base_dir)
    spec = job_spec(Path(data_root), trainer={**trainer, "strategy": "ddp"})
    ddp = train(base / "ddp", spec, rank=rank, world_size=world_size)
    spec = job_spec(Path(data_root), trainer={**trainer, "strategy": "dp"})
    dp = Trainer(context(base / "dp", spec, rank=rank, world_size=world_size, one_task_per_node=True)).fit()
    return {"ddp": ddp, "dp": dp}


def scenario_elastic(
    rank: int,
    world_size: int,
    *,
    data_root: str,
    run_dir: str,
    stop_after: int | None = None,
    batch_size: int = 4,
    arch: str = "resnet18",
    float64: bool = True,
    every_steps: int = 100,
    keep_last: int = 2,
    epochs: int = 2,
) -> dict[str, Any]:
    """One attempt of a deterministic ddp run in float64; also the samples of every (epoch, step) this rank saw.

    float64, so that what differs by summation order alone stays far below a tight tolerance: resnet18's
    BatchNorm over 4 samples of 1x1 maps amplifies float32 rounding a hundredfold per step. ``float64=False``:
    float32, as users train.
    """
    from hpctrain.trainer import batches, data

    to_model_input = batches.to_model_input
    if float64:
        batches.to_model_input = lambda *args, **kwargs: to_model_input(*args, **kwargs).double()  # type: ignore[assignment]
        torch.set_default_dtype(torch.float64)

    trainer = {
        "arch": arch,
        "strategy": "ddp",
        "epochs": epochs,
        "batch_size": batch_size,
        "max_steps_per_epoch": 4,
        "deterministic": True,
    }
    checkpoint = {"every_steps": every_steps, "keep_last": keep_last}
    spec = job_spec(Path(data_root), trainer=trainer, checkpoint=checkpoint)
    seen: list[list[int]] = []
    original = data.ResumableDistributedSampler.batches

    def recording(sampler: data.ResumableDistributedSampler) -> Any:
        first = sampler.consumed_samples // (sampler.micro_batches * sampler.batch_size)
        steps = [first + step for step, parts in enumerate(sampler.step_parts()) for _ in parts]
        for step, batch in zip(steps, original(sampler), strict=True):
            seen.append([sampler.epoch, step, *batch])
            yield batch

    data.ResumableDistributedSampler.batches = recording  # type: ignore[method-assign]
    try:
        summary = train(Path(run_dir), spec, rank=rank, world_size=world_size, stop_after=stop_after)
    finally:
        data.ResumableDistributedSampler.batches = original  # type: ignore[method-assign]
        batches.to_model_input = to_model_input  # type: ignore[assignment]
        torch.set_default_dtype(torch.float32)
    return {"summary": summary, "seen": seen}


SCENARIOS: dict[str, Callable[..., Any]] = {
    "elastic": scenario_elastic,
    "ddp": scenario_ddp,
    "resume": scenario_resume,
    "dp_like_ddp": scenario_dp_like_ddp,
}
