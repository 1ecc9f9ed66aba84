"""Train step time per image of the CPU-capable strategies, as ratios to ``single`` measured in the same run.

Runs hpctrain's own Trainer on a quickstart-size generated dataset (10
classes x 120 JPEGs, ResNet-18 at 64 px, ``--batch-size`` per process, no
loader workers) with each strategy, in fresh processes:

* single: one process using every core of the machine;
* dp: the same, through ``nn.DataParallel`` (on CPU it has nothing to spread over);
* ddp: ``--processes`` ranks over gloo, the cores split between them;
* hogwild: ``--processes`` forked workers sharing one model.

Each run trains two short epochs (``--steps`` per epoch and process); the
rate is the second epoch's images/s of all processes together, as the trainer
reports it (validation not included). Rounds interleave the strategies, so
load from other jobs on a shared machine hits them alike; the ratios
(ms/image of the strategy / ms/image of single, same round) are the number to
read. Usage: ``python benchmarks/strategies.py [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hpctrain.dataset.generate import make_dataset
from hpctrain.jobspec.models import JobSpec
from hpctrain.runtime.context import TaskContext, TaskEnv
from hpctrain.runtime.stop import StopRequest
from hpctrain.runtime.task_env import one_node_env
from hpctrain.trainer.trainer import Trainer

STRATEGIES = ("single", "dp", "ddp", "hogwild")


def job_spec(args: argparse.Namespace, data_root: Path, strategy: str) -> JobSpec:
    trainer = {
        "arch": "resnet18",
        "strategy": strategy,
        "batch_size": args.batch_size,
        "epochs": 2,
        "max_steps_per_epoch": args.steps,
        "log_every_steps": args.steps,
        "hogwild_processes": args.processes,
        "lr": 0.1,
    }
    data = {"root": str(data_root), "image_size": 64, "val_resize": 72, "workers": 0}
    return JobSpec.model_validate({"name": "bench", "trainer": trainer, "data": data})


def task_env(rank: int, world_size: int, port: int) -> TaskEnv:
    return one_node_env("single" if world_size == 1 else "submitit-local", rank, world_size, rank, "bench", port)


def _rank_main(rank: int, world_size: int, port: int, spec: JobSpec, run_dir: str, threads: int) -> None:
    torch.set_num_threads(threads)
    if world_size > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        ctx = TaskContext(task_env(rank, world_size, port), spec, Path(run_dir), torch.device("cpu"), StopRequest())
        summary = Trainer(ctx).fit()
    finally:
        if world_size > 1:
            dist.destroy_process_group()
    if rank == 0:
        (Path(run_dir) / "bench.json").write_text(json.dumps({"images_per_s": summary["train_images_per_s"]}))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def images_per_s(args: argparse.Namespace, data_root: Path, strategy: str, run_dir: Path) -> float:
    """One fresh run of ``strategy``; the trainer's images/s of its second epoch, all processes together."""
    cores = len(os.sched_getaffinity(0))
    world = args.processes if strategy == "ddp" else 1
    threads = max(1, cores // world)  # hogwild splits the cores between its workers itself
    spec = job_spec(args, data_root, strategy)
    mp.spawn(_rank_main, args=(world, free_port(), spec, str(run_dir), threads), nprocs=world, join=True)
    return json.loads((run_dir / "bench.json").read_text())["images_per_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2, help="ddp ranks and hogwild workers")
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--steps", type=int, default=8, help="train steps per epoch and process")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores, resnet18 at 64 px, batch {args.batch_size} per process, {args.processes} processes")
    results: dict[str, list[float]] = {name: [] for name in args.strategies}
    with tempfile.TemporaryDirectory() as tmp:
        data_root = Path(tmp) / "data"
        make_dataset(data_root, classes=10, per_class=120, val_per_class=2, image_size=64)  # validation is not timed
        for round_index in range(args.repeats):
            rates = {}
            for name in args.strategies:
                rates[name] = images_per_s(args, data_root, name, Path(tmp) / f"{name}-{round_index}")
                results[name].append(rates[name])
            base = rates.get("single")
            line = ", ".join(
                f"{name} {1000 / rate:.1f} ms/image" + (f" ({base / rate:.2f}x single)" if base else "")
                for name, rate in rates.items()
            )
            print(f"round {round_index + 1}: {line}", flush=True)
    if "single" in results:
        print("ratio of ms/image to single, over the rounds (min-max):")
        for name, rates in results.items():
            ratios = [base / rate for base, rate in zip(results["single"], rates, strict=True)]
            ms = [1000 / rate for rate in rates]
            print(f"  {name:8} {min(ratios):.2f}-{max(ratios):.2f}x   ({min(ms):.1f}-{max(ms):.1f} ms/image)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
