"""What hpctrain.task's checkpoints cost a user's loop: save stall and load time, against a plain rank-0 torch.save.

4 gloo ranks on this machine's CPU (processes started as torchrun starts them),
each holding a DDP ResNet-50 with SGD momentum (~205 MB of state, the same on
every rank). In interleaved rounds (shared machines are noisy), per save:

* baseline: rank 0 ``torch.save``s the model and optimizer state dicts to one
  file and fsyncs it; the other ranks wait in a barrier (the loop's next
  collective would make them wait just the same);
* ``Checkpointer.save`` (sync): a DCP folder, the replicated state written
  once, spread over the nodes' first ranks (here one node: rank 0), meta last;
* ``Checkpointer(async_save=True).save``: the same, blocking only while the
  state is copied to memory (the write finishes in the background; waited for
  outside the measurement).

and per load (every rank, into fresh objects): the baseline ``torch.load``
(``weights_only``) + ``load_state_dict`` on every rank, against
``Checkpointer.load``. A save's or load's time is the slowest rank's (the loop
goes on when every rank has). Prints medians, ranges and the ratios API /
baseline as JSON. Usage: ``python benchmarks/task_checkpoint.py [--dir DIR] [--repeats N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WORLD = 4
KINDS = ("baseline_save", "api_save", "api_async_stall", "baseline_load", "api_load")


def build(seed: int = 0) -> tuple[Any, Any, Any]:
    import torch
    import torchvision

    from hpctrain import task

    torch.manual_seed(seed)
    model = torchvision.models.resnet50()
    ddp = task.ddp(model)  # what the docs tell a loop to use (DDP that resumes bit for bit)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    ddp(torch.randn(2, 3, 64, 64)).sum().backward()
    optimizer.step()  # creates the momentum buffers
    optimizer.zero_grad()
    return model, ddp, optimizer


def timed(action: Any) -> float:
    import torch.distributed as dist

    dist.barrier()
    started = time.perf_counter()
    action()
    elapsed = time.perf_counter() - started
    dist.barrier()
    return elapsed


def rank_main(out: Path, root: Path, repeats: int) -> None:
    import torch
    import torch.distributed as dist

    from hpctrain import task

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, ddp, optimizer = build()
    sync = task.Checkpointer(root / "api", keep_last=1, model=ddp, optimizer=optimizer)
    lazy = task.Checkpointer(root / "async", keep_last=1, async_save=True, model=ddp, optimizer=optimizer)
    plain = root / "plain.pt"
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}

    def baseline_save() -> None:
        if rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, plain)
            fd = os.open(plain, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)

    for step in range(1, repeats + 1):
        times["baseline_save"].append(timed(baseline_save))
        times["api_save"].append(timed(lambda step=step: sync.save(step)))
        times["api_async_stall"].append(timed(lambda step=step: lazy.save(step)))
        lazy.wait()
        fresh_model, fresh_ddp, fresh_optimizer = build(seed=1)

        def baseline_load(model: Any = fresh_model, optimizer: Any = fresh_optimizer) -> None:
            state = torch.load(plain, map_location="cpu", weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])

        times["baseline_load"].append(timed(baseline_load))
        reader = task.Checkpointer(root / "api", model=fresh_ddp, optimizer=fresh_optimizer)
        times["api_load"].append(timed(reader.load))
    (out / f"rank-{rank}.json").write_text(json.dumps(times))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)  # a folder named on the command line need not exist yet
    with tempfile.TemporaryDirectory(prefix="hpctrain-task-ckpt-", dir=args.dir) as tmp:
        root = Path(tmp)
        port = str(free_port())
        procs = []
        for rank in range(WORLD):
            env = {
                **os.environ,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(WORLD),
                "LOCAL_WORLD_SIZE": str(WORLD),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "OMP_NUM_THREADS": "1",
            }
            command = [sys.executable, __file__, "--rank-of", str(root), str(args.repeats)]
            procs.append(subprocess.Popen(command, env=env, cwd=root))
        if any(proc.wait() for proc in procs):
            print("a rank failed", file=sys.stderr)
            return 1
        ranks = [json.loads((root / f"rank-{rank}.json").read_text()) for rank in range(WORLD)]
    slowest = {kind: [max(r[kind][i] for r in ranks) for i in range(args.repeats)] for kind in KINDS}
    result: dict[str, Any] = {
        kind: {"median_s": round(statistics.median(v), 3), "min_s": round(min(v), 3), "max_s": round(max(v), 3)}
        for kind, v in slowest.items()
    }
    base_save, base_load = statistics.median(slowest["baseline_save"]), statistics.median(slowest["baseline_load"])
    result["ratios"] = {
        "api_save / baseline_save": round(statistics.median(slowest["api_save"]) / base_save, 3),
        "api_async_stall / baseline_save": round(statistics.median(slowest["api_async_stall"]) / base_save, 3),
        "api_load / baseline_load": round(statistics.median(slowest["api_load"]) / base_load, 3),
    }
    result["setup"] = f"{WORLD} gloo ranks on CPU, DDP ResNet-50 + SGD momentum, {args.repeats} interleaved rounds"
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--rank-of":
        rank_main(Path(sys.argv[2]), Path(sys.argv[2]), int(sys.argv[3]))
        sys.exit(0)
    sys.exit(main())
