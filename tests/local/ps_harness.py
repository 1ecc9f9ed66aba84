"""Scenarios for the parameter-server tests: spawned gloo ranks that also form an RPC group.

Each training run gets its own RPC rendezvous port (TaskEnv.master_port + 1), so
one process can train, stop and resume in turn.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from forked_ranks import start_ranks
from trainer_harness import context, job_spec, stop_at

from hpctrain.trainer.trainer import Trainer
from tests.net_helpers import free_port

PS_TRAINER = {"arch": "resnet18", "epochs": 2, "max_steps_per_epoch": 2, "deterministic": True}


def rpc_base_port() -> int:
    """A port p with p + 1 free: the RPC rendezvous of a run whose master_port is p."""
    while True:
        port = free_port() - 1
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


def train_ps(
    run_dir: Path,
    trainer: dict[str, Any],
    rank: int,
    world_size: int,
    *,
    port: int,
    data_root: str,
    stop_after: int | None = None,
    stop_rank: int | None = None,
) -> dict[str, Any]:
    """One run of the trainer on this rank, its RPC rendezvous at ``port`` + 1."""
    spec = job_spec(Path(data_root), trainer=trainer)
    ctx = context(run_dir, spec, rank=rank, world_size=world_size)
    ctx = dataclasses.replace(ctx, env=dataclasses.replace(ctx.env, master_port=port))
    hook = stop_at(stop_after, rank=stop_rank) if stop_after is not None else None
    return Trainer(ctx, on_step=hook).fit()


def scenario_sync(rank: int, world_size: int, *, data_root: str, base_dir: str, ports: list[int]) -> dict[str, Any]:
    """ps sync (1 server + workers), uninterrupted, then stopped on the last worker and resumed."""
    trainer = {**PS_TRAINER, "strategy": "ps"}
    base, last = Path(base_dir), world_size - 1
    full = train_ps(base / "ps-full", trainer, rank, world_size, port=ports[0], data_root=data_root)
    stopped = train_ps(
        base / "ps-split", trainer, rank, world_size, port=ports[1], data_root=data_root, stop_after=1, stop_rank=last
    )
    resumed = train_ps(base / "ps-split", trainer, rank, world_size, port=ports[2], data_root=data_root)
    return {"full": full, "stopped": stopped, "resumed": resumed}


def scenario_run(
    rank: int, world_size: int, *, data_root: str, base_dir: str, ports: list[int], strategy: str = "ddp", **more: Any
) -> dict[str, Any]:
    """One run of PS_TRAINER (with ``more`` settings) under ``strategy``."""
    trainer = {**PS_TRAINER, **more, "strategy": strategy}
    return train_ps(Path(base_dir) / strategy, trainer, rank, world_size, port=ports[0], data_root=data_root)


def scenario_async(rank: int, world_size: int, *, data_root: str, base_dir: str, ports: list[int]) -> dict[str, Any]:
    """ps async with two servers and two workers, long enough to learn the generated classes."""
    trainer = {
        "arch": "resnet18",
        "strategy": "ps",
        "ps": {"servers": 2, "mode": "async", "max_staleness": 1},
        "epochs": 6,
        "max_steps_per_epoch": None,
        "lr": 0.05,
        "schedule": "constant",
    }
    return train_ps(Path(base_dir) / "ps-async", trainer, rank, world_size, port=ports[0], data_root=data_root)


SCENARIOS = {"sync": scenario_sync, "run": scenario_run, "async": scenario_async}


def run_ranks(scenario: str, world_size: int, out_dir: Path, runs: int = 1, **kwargs: Any) -> list[Any]:
    """``scenario`` in ``world_size`` spawned gloo ranks, given ``runs`` RPC ports; each rank's result."""
    out_dir.mkdir(parents=True, exist_ok=True)
    kwargs["ports"] = [rpc_base_port() for _ in range(runs)]
    start_ranks(_rank_main, (world_size, free_port(), scenario, out_dir, kwargs), world_size)
    return [json.loads((out_dir / f"rank-{rank}.json").read_text()) for rank in range(world_size)]


def _rank_main(rank: int, world_size: int, port: int, scenario: str, out_dir: Path, kwargs: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        result = SCENARIOS[scenario](rank, world_size, **kwargs)
    finally:
        dist.destroy_process_group()
    (out_dir / f"rank-{rank}.json").write_text(json.dumps(result))
