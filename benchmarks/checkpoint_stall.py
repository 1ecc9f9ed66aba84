"""How long does an async checkpoint block training, compared with a synchronous torch.save?

Builds a ResNet-50 with SGD momentum state (~205 MB), then measures:

* sync: ``torch.save`` of the state to a file plus fsync (what a naive trainer blocks for);
* async stall: time ``CheckpointManager.save`` blocks the caller with ``async_save=True``
  (staging buffers reserved once outside the loop, as the Trainer does), the write itself
  finishing in the background.

The two are measured in interleaved rounds (shared machines are noisy). Prints the numbers
and exits 1 when the median stall is more than ``--max-ratio`` (default 0.2) of the median
sync save. Usage: ``python benchmarks/checkpoint_stall.py [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torchvision

from hpctrain.trainer.checkpoint import CheckpointManager


def build_state(device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torchvision.models.resnet50().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    images = torch.randn(2, 3, 64, 64, device=device)
    model(images).sum().backward()
    optimizer.step()  # creates the momentum buffers
    return model, optimizer


def state_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> dict:
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "global_step": step}


def sync_save_s(state: dict, directory: Path, index: int) -> float:
    path = directory / f"sync-{index}.pt"
    started = time.perf_counter()
    torch.save(state, path)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    elapsed = time.perf_counter() - started
    path.unlink()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-ratio", type=float, default=0.2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    model, optimizer = build_state(device)
    state = state_of(model, optimizer, 0)
    nbytes = sum(t.numel() * t.element_size() for t in _tensors(state))
    with tempfile.TemporaryDirectory(prefix="hpctrain-ckpt-bench-", dir=args.dir) as tmp:
        directory = Path(tmp)
        cold = CheckpointManager(directory / "cold", keep_last=1, keep_best=False, async_save=True)
        cold.save(state, step=0, epoch=0)
        cold_stall = cold.last_stall_s
        cold.close()

        manager = CheckpointManager(directory / "checkpoints", keep_last=2, keep_best=False, async_save=True)
        started = time.perf_counter()
        manager.reserve(state)
        reserve_s = time.perf_counter() - started
        # Interleaved rounds, so both measurements see the same page-cache and disk conditions.
        sync, stalls, writes = [], [], []
        for step in range(1, args.repeats + 1):
            sync.append(sync_save_s(state, directory, step))
            state = state_of(model, optimizer, step)
            manager.save(state, step=step, epoch=0)
            stalls.append(manager.last_stall_s)
            started = time.perf_counter()
            manager.wait()  # not part of the stall: training runs meanwhile
            writes.append(manager.last_stall_s + time.perf_counter() - started)
        manager.close()

    sync_s = statistics.median(sync)
    stall_s = statistics.median(stalls)
    ratio = stall_s / sync_s
    print(f"device                 {device}")
    print(f"state size             {nbytes / 1e6:.1f} MB")
    print(f"sync save seconds      {sync_s:.3f}  (torch.save + fsync; median of {len(sync)}, max {max(sync):.3f})")
    print(f"async stall seconds    {stall_s:.3f}  (median of {len(stalls)}, max {max(stalls):.3f})")
    print(f"async write seconds    {statistics.median(writes):.3f}  (in the background)")
    print(f"staging reserve        {reserve_s:.3f}  (once, before the training loop)")
    print(f"cold first stall       {cold_stall:.3f}  (no reserve; ratio {cold_stall / sync_s:.3f})")
    print(f"ratio                  {ratio:.3f}  (median stall / median sync; limit {args.max_ratio})")
    return 0 if ratio <= args.max_ratio else 1


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


if __name__ == "__main__":
    sys.exit(main())
