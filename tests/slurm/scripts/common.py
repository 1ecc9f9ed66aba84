"""Shared by the test scripts: a tiny deterministic DDP loop over gloo, written as a user would.

It keeps its own checkpoint (``snapshot.pt`` in its working directory, rank 0
writes it atomically, every rank loads it), stops at a step boundary on the
signal hpctrain names in ``HPCTRAIN_STOP_SIGNAL`` (the ranks agree with one
all-reduce, so all stop at the same step), and leaves for the tests what each
start did: ``steps.log`` (every step trained, by rank 0) and
``env-RESTART-RANK.json`` (its arguments, folder and environment). Plain
PyTorch; nothing of hpctrain is imported (a script may hand ``train`` the task
API's ``log``).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

CHECKPOINT = "snapshot.pt"
STOP = {"asked": False}
ENV_KEYS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "HPCTRAIN_RUN_DIR",
    "HPCTRAIN_CHECKPOINT_DIR",
    "HPCTRAIN_RESTART_COUNT",
    "HPCTRAIN_JOB_ID",
    "HPCTRAIN_STOP_SIGNAL",
    "TORCHELASTIC_RUN_ID",
    "OMP_NUM_THREADS",
)


def on_stop_signal() -> None:
    """Ask to stop on hpctrain's stop signal (the handler only sets a flag)."""
    name = os.environ.get("HPCTRAIN_STOP_SIGNAL", "TERM")
    signal.signal(getattr(signal, f"SIG{name}"), lambda signum, frame: STOP.update(asked=True))


def report_env(rank: int | str, extra: dict | None = None) -> None:
    """What this process got: its arguments, working directory and environment."""
    restart = os.environ.get("HPCTRAIN_RESTART_COUNT", "x")
    record = {"program": sys.argv[0], "argv": sys.argv[1:], "cwd": os.getcwd(), "pid": os.getpid()}
    record.update({key: os.environ.get(key) for key in ENV_KEYS}, **(extra or {}))
    write_json(Path(f"env-{restart}-{rank}.json"), record)


def write_json(path: Path, value: dict) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(json.dumps(value))
    os.replace(temp, path)


def train(
    rank: int,
    steps: int,
    step_s: float,
    fail: tuple[int, int] | None = None,
    loader_workers: int = 0,
    log: Callable[..., None] | None = None,
) -> str:
    """``steps`` steps of a linear model under DDP, resuming from the checkpoint; "completed" or "stopped".

    ``fail``: (rank, step) at which that rank exits with status 3 (once per run: a marker remembers it).
    ``loader_workers``: a DataLoader with that many workers is read once per step (processes to clean up).
    ``log``: called as ``log(step + 1, loss=...)`` after each step (``hpctrain.task.log``: rank 0 writes).
    """
    batches = None
    if loader_workers:
        data = torch.utils.data.DataLoader(list(range(10_000)), batch_size=1, num_workers=loader_workers)
        batches = iter(data)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    if Path(CHECKPOINT).exists():
        state = torch.load(CHECKPOINT, weights_only=True)
        model.load_state_dict(state["model"])
        start = int(state["step"])
    if rank == 0:
        with open("steps.log", "a") as steps_log:
            steps_log.write(f"start {os.environ.get('HPCTRAIN_RESTART_COUNT')} {start}\n")
    for step in range(start, steps):
        flag = torch.tensor([1 if STOP["asked"] else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            save(rank, model, step)
            dist.barrier()
            print(f"rank {rank}: stopping at step {step}", flush=True)
            return "stopped"
        if fail is not None and fail == (rank, step) and not Path("failed-once").exists():
            Path("failed-once").touch()  # before the step's all-reduce: no rank can log this step
            print(f"rank {rank}: failing on purpose at step {step}", file=sys.stderr, flush=True)
            os._exit(3)
        if batches is not None:
            next(batches)
        generator = torch.Generator().manual_seed(step * 1000 + rank)
        inputs = torch.randn(4, 8, generator=generator)
        loss = ((ddp(inputs) - inputs.sum(1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if log is not None:
            log(step + 1, loss=float(loss.detach()))
        if rank == 0:
            with open("steps.log", "a") as steps_log:
                steps_log.write(f"step {step}\n")
        if (step + 1) % 2 == 0:
            save(rank, model, step + 1)
        time.sleep(step_s)
    if rank == 0:
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
        write_json(Path("result.json"), {"weights_sha256": digest, "world_size": dist.get_world_size()})
    return "completed"


def escape() -> None:
    """Leave a ``sleep 1000`` in a session of its own, re-parented to init (proctrack/linuxproc loses it)."""
    subprocess.run(["setsid", "-f", "sleep", "1000"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)


def save(rank: int, model: torch.nn.Module, step: int) -> None:
    if rank == 0:
        torch.save({"model": model.state_dict(), "step": step}, f".{CHECKPOINT}.tmp")
        os.replace(f".{CHECKPOINT}.tmp", CHECKPOINT)
