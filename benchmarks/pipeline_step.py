"""Step time of ``strategy: pipeline`` (2 gloo ranks on CPU) against one process training the whole model.

Baseline: the unsplit model, one process, the same batch (``single``). For each schedule and number of
micro-batches it prints the pipeline's mean step time, its ratio to single, and the bubble fraction
(stages - 1) / (microbatches + stages - 1) that the schedule leaves idle, and each stage's CPU
seconds per step (their sum against single's is the pipelining overhead). Every process gets
``--threads`` threads, so a 2-stage pipeline uses twice the cores of single: the ideal ratio is
about 0.5 plus the bubble and the activation sends.

    .venv/bin/python benchmarks/pipeline_step.py --arch resnet50 --image-size 128 --batch 32 --threads 4
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchvision
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpctrain.jobspec.models import Pipeline as PipelineSpec  # noqa: E402
from hpctrain.runtime.context import TaskEnv  # noqa: E402
from hpctrain.trainer.precision import Precision  # noqa: E402
from hpctrain.trainer.step import TrainStep  # noqa: E402
from hpctrain.trainer.strategies.pipeline import Pipeline  # noqa: E402
from hpctrain.trainer.strategies.single import Single  # noqa: E402


def env(rank: int, world: int) -> TaskEnv:
    return TaskEnv(rank, world, rank, world, 0, 1, ("localhost",), "127.0.0.1", 29500, "0", 0, "single")


def make_step(args: argparse.Namespace, strategy, rank: int, world: int) -> TrainStep:  # noqa: ANN001
    torch.manual_seed(0)
    device = torch.device("cpu")
    model = torchvision.models.get_model(args.arch, weights=None, num_classes=100)
    strategy.check(env(rank, world), device)
    wrapped = strategy.wrap(model, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0)
    step = TrainStep(
        wrapped, model, optimizer, scheduler, Precision("fp32", device), nn.CrossEntropyLoss(), strategy, device
    )
    return strategy.train_step(step)


def timed(step, args: argparse.Namespace) -> tuple[float, float]:  # noqa: ANN001
    """Wall and CPU seconds per step of this process (CPU time is what a shared machine's load inflates least)."""
    images = torch.randint(0, 256, (args.batch, 3, args.image_size, args.image_size), dtype=torch.uint8)
    targets = torch.randint(0, 100, (args.batch,))
    for _ in range(args.warmup):
        step(images, targets)
    if dist.is_initialized():
        dist.barrier()
    started, cpu_started = time.perf_counter(), time.process_time()
    for _ in range(args.steps):
        step(images, targets)
    cpu = time.process_time() - cpu_started
    if dist.is_initialized():
        dist.barrier()
    return (time.perf_counter() - started) / args.steps, cpu / args.steps


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, schedule: str, micro: int, out: str) -> None:
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        cfg = PipelineSpec(stages=world, microbatches=micro, schedule=schedule, balance=args.balance)
        strategy = Pipeline(cfg, args.arch, args.batch, args.image_size)
        wall, cpu = timed(make_step(args, strategy, rank, world), args)
        Path(f"{out}.{rank}").write_text(json.dumps({"step_s": wall, "cpu_s": cpu, "split": strategy.split}))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--microbatches", default="1,2,4,8")
    parser.add_argument("--balance", choices=("params", "time"), default="params")
    parser.add_argument("--schedules", default="gpipe,1f1b")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    single, single_cpu = timed(make_step(args, Single(), 0, 1), args)
    print(f"{args.arch} {args.image_size}px batch {args.batch}, {args.threads} threads/process, balance {args.balance}")
    print(f"single: {single:.3f} s/step wall, {single_cpu:.3f} s/step CPU; load average {os.getloadavg()[0]:.1f}")
    print("| schedule | micro-batches | s/step | x single | CPU s/step per stage | CPU sum x single | bubble |")
    print("|---|---|---|---|---|---|---|")
    for schedule in args.schedules.split(","):
        for micro in (int(m) for m in args.microbatches.split(",")):
            if schedule == "1f1b" and micro < args.stages:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                out = str(Path(tmp) / "result.json")
                mp.spawn(rank_main, args=(args.stages, free_port(), args, schedule, micro, out), nprocs=args.stages)
                ranks = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(args.stages)]
            result = ranks[0]
            bubble = (args.stages - 1) / (micro + args.stages - 1)
            ratio = result["step_s"] / single
            cpus = [rank["cpu_s"] for rank in ranks]
            per_stage = " / ".join(f"{cpu:.3f}" for cpu in cpus)
            print(
                f"| {schedule} | {micro} | {result['step_s']:.3f} | {ratio:.2f} | {per_stage} | "
                f"{sum(cpus) / single_cpu:.2f} | {bubble:.2f} |",
                flush=True,
            )
    print("split:", "; ".join(result["split"]))


if __name__ == "__main__":
    main()
