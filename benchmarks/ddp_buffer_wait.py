"""Where a rank waits for a late batch under DDP: in DDP's buffer broadcast, before its module's forward.

Two gloo ranks on the CPU run a minimal DDP loop (a small net with BatchNorm); rank 1's batch comes
``--delay`` seconds late (a sleep, as a slow read). Rank 0 times its forward (the DDP call and the loss)
and, with two forward pre-hooks, the part between DDP's entry and its module's own forward, where DDP
broadcasts rank 0's buffers when ``broadcast_buffers`` is on (DDP's default). Printed for
``broadcast_buffers`` on and off, without and with the delay: the median over the steps after the first
three. Issue 41: that wait was counted as forward compute; ``task/step_timer.py`` laps it as a wait now.
Usage: ``python benchmarks/ddp_buffer_wait.py [--delay 0.2] [--steps 15]`` (1.5 min on the shared 2-core machine).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def rank_main(rank: int, port: int, delay: float, broadcast_buffers: bool, steps: int, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.simplefilter("ignore", FutureWarning)  # broadcast_buffers is being renamed
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4)
    )
    ddp = nn.parallel.DistributedDataParallel(net, broadcast_buffers=broadcast_buffers)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    at: dict[str, float] = {}
    ddp.register_forward_pre_hook(lambda module, args: at.__setitem__("entry", time.perf_counter()))
    net.register_forward_pre_hook(lambda module, args: at.__setitem__("module", time.perf_counter()))
    forward, before_module = [], []
    for step in range(steps):
        dist.barrier()  # as the trainer's stop agreement: the ranks start each step together
        x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 4, (8,))
        if rank == 1:
            time.sleep(delay)  # this rank's batch comes late
        start = time.perf_counter()
        loss = nn.functional.cross_entropy(ddp(x), y)
        end = time.perf_counter()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step >= 3:
            forward.append(end - start)
            before_module.append(at["module"] - at["entry"])
    queue.put((rank, statistics.median(forward), statistics.median(before_module)))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=0.2, help="seconds rank 1's batch comes late")
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args()
    for broadcast_buffers in (True, False):
        for delay in (0.0, args.delay):
            queue = mp.get_context("spawn").SimpleQueue()
            mp.spawn(rank_main, args=(free_port(), delay, broadcast_buffers, args.steps, queue), nprocs=2)
            rows = sorted(queue.get() for _ in range(2))
            ranks = "; ".join(
                f"rank {r} forward {f * 1000:.1f} ms (before its module: {b * 1000:.1f} ms)" for r, f, b in rows
            )
            print(f"broadcast_buffers={broadcast_buffers!s:5} rank 1 late by {delay:.2f} s: {ranks}", flush=True)


if __name__ == "__main__":
    main()
