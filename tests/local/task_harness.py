"""Multi-process scenarios of hpctrain.task, each rank with the environment torchrun gives one.

:func:`run_ranks` forks each rank from the session's fork server (forked_ranks.py: torch is imported
once, not once per rank), sets torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...)
in it, and the rank joins a gloo group from them, runs the scenario and writes ``OUT_DIR/rank-N.json``.
``python tests/local/task_harness.py SCENARIO OUT_DIR [JSON_ARGS]`` runs the same as a rank of its own
with those variables set. :func:`start_ranks` starts any command as torchrun starts it (a new
interpreter per rank, with any environment added, e.g. a script job's HPCTRAIN_* variables).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from forked_ranks import start_ranks as fork_ranks

from tests.net_helpers import free_port

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]


def clean_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment (or ``environ``) without any launcher's variables (Slurm, submitit,
    torchrun, hpctrain)."""
    prefixes = ("SLURM_", "SUBMITIT_", "TORCHELASTIC_", "HPCTRAIN_")
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if not k.startswith(prefixes) and k not in names}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    return env


def torchrun_env(rank: int, world: int, port: str) -> dict[str, str]:
    """The variables torchrun sets for one rank of ``world`` on this machine."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
    }


def start_ranks(
    command: list[str], world: int, *, env: dict[str, str] | None = None, cwd: Path | None = None, log_dir: Path
) -> list[subprocess.Popen[bytes]]:
    """``command`` once per rank with torchrun's variables (and ``env``), each in its own session."""
    port = str(free_port())
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in range(world):
        rank_env = {**clean_env(), **torchrun_env(rank, world, port), **(env or {})}
        log = open(log_dir / f"rank-{rank}.log", "wb")  # noqa: SIM115 - closed with the process
        procs.append(
            subprocess.Popen(
                command, env=rank_env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
    return procs


def wait_ranks(procs: list[subprocess.Popen[bytes]], log_dir: Path, timeout: float = 240) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise AssertionError(f"ranks still running after {timeout} s\n{logs(log_dir)}") from None
    return codes


def logs(log_dir: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(log_dir.glob("*.log")))


def run_ranks(scenario: str, world: int, out: Path, **kwargs: Any) -> list[dict[str, Any]]:
    """Run ``scenario`` on ``world`` forked ranks; every rank's result (raises with a failed rank's traceback)."""
    out.mkdir(parents=True, exist_ok=True)
    # a hang guard, not a speed bound: 6 ranks loading a checkpoint on CI's 2 busy cores outran 240 s in rehearsal 31
    # (a machine ~4x slower than usual: the unit and local tiers took 5441 s against 1218 s)
    fork_ranks(_forked_rank, (world, str(free_port()), scenario, out, json.dumps(kwargs)), world, timeout_s=360)
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(world)]


def _forked_rank(rank: int, world: int, port: str, scenario: str, out: Path, args: str) -> None:
    """One rank as :func:`rank_main` runs it, in the environment torchrun would have given it."""
    import torch

    environ = {**clean_env(dict(os.environ)), **torchrun_env(rank, world, port)}
    os.environ.clear()
    os.environ.update(environ)
    torch.set_num_threads(1)  # what OMP_NUM_THREADS=1 gives a started rank; torch was imported before it
    _run_scenario(scenario, out, json.loads(args))


# -- scenarios (run inside each rank) ----------------------------------------------------------------------------
def fsdp_parts(seed: int = 0) -> tuple[Any, Any, Any]:
    """An FSDP2-sharded MLP, its AdamW and a cosine schedule (the same on every rank)."""
    import torch
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(12, 30), nn.ReLU(), nn.Linear(30, 7))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)
    return model, optimizer, scheduler


def full_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """Every weight and optimizer tensor, gathered whole (collective), as lists."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True)
    weights, optim = get_state_dict(model, optimizer, options=options)
    flat = {f"model.{k}": v.tolist() for k, v in weights.items()}
    for name, values in optim["state"].items():
        for key, value in values.items():
            flat[f"optim.{name}.{key}"] = value.tolist()
    return flat


def save_sharded(out: Path, args: dict[str, Any]) -> dict[str, Any]:
    """Train the FSDP2 parts 3 steps and save them, with a per-rank counter."""
    import torch

    from hpctrain import task

    model, optimizer, scheduler = fsdp_parts()
    info = task.context()
    counter = Counter(info.rank * 10)
    ckpt = task.Checkpointer(args["directory"], model=model, optimizer=optimizer, scheduler=scheduler)
    ckpt.register("counter", counter, per_rank=True)
    generator = torch.Generator().manual_seed(1 + info.rank)
    for _ in range(3):
        model(torch.randn(5, 12, generator=generator)).square().mean().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    path = ckpt.save(3)
    return {"path": str(path), "state": full_state(model, optimizer), "lr": scheduler.get_last_lr()}


def load_sharded(out: Path, args: dict[str, Any]) -> dict[str, Any]:
    from hpctrain import task

    model, optimizer, scheduler = fsdp_parts(seed=99)  # other initial weights: the load must replace them
    info = task.context()
    counter = Counter(-1)
    ckpt = task.Checkpointer(args["directory"], model=model, optimizer=optimizer, scheduler=scheduler)
    ckpt.register("counter", counter, per_rank=True)
    step = ckpt.load()
    return {
        "step": step,
        "state": full_state(model, optimizer),
        "lr": scheduler.get_last_lr(),
        "counter": counter.value,
        "rank": info.rank,
    }


def async_saves(out: Path, args: dict[str, Any]) -> dict[str, Any]:
    """DDP trained between three async saves (each blocking only while it copies); the last one's state."""
    import torch
    from torch import nn

    from hpctrain import task

    torch.manual_seed(0)
    model = task.ddp(nn.Sequential(nn.Linear(12, 30), nn.ReLU(), nn.Linear(30, 7)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ckpt = task.Checkpointer(args["directory"], async_save=True, keep_last=2, model=model, optimizer=optimizer)
    generator = torch.Generator().manual_seed(1 + task.context().rank)
    for step in range(1, 7):
        model(torch.randn(5, 12, generator=generator)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 2 == 0:
            expected = full_state(model, optimizer)  # what this save must hold, whatever happens after it
            ckpt.save(step)
    ckpt.wait()
    fresh = nn.Sequential(nn.Linear(12, 30), nn.ReLU(), nn.Linear(30, 7))
    fresh_model = task.ddp(fresh)
    fresh_optimizer = torch.optim.AdamW(fresh_model.parameters(), lr=1e-2)
    step = task.Checkpointer(args["directory"], model=fresh_model, optimizer=fresh_optimizer).load()
    return {
        "step": step,
        "equal": full_state(fresh_model, fresh_optimizer) == expected,
        "folders": sorted(p.name for p in Path(args["directory"]).iterdir()),
    }


def async_copy_fails(out: Path, args: dict[str, Any]) -> dict[str, Any]:
    """Rank 1's copy to memory fails in the second of three async saves (out of memory, say); what each rank's
    calls say, and which folders there are."""
    import torch
    from torch import nn

    from hpctrain import task
    from hpctrain.errors import CheckpointError

    torch.manual_seed(0)
    model = task.ddp(nn.Linear(6, 3))
    ckpt = task.Checkpointer(args["directory"], async_save=True, keep_last=3, model=model)
    stage, rank = ckpt._staging.stage, task.context().rank

    def stage_fails_once(*a: Any, **k: Any) -> Any:
        ckpt._staging.stage = stage
        raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 23461216 bytes.")

    result: dict[str, Any] = {"errors": []}
    for step in (2, 4, 6):
        if step == 4 and rank == 1:
            ckpt._staging.stage = stage_fails_once
        try:
            ckpt.save(step)  # step 6's save waits for step 4's write first: that is where step 4 fails
        except CheckpointError as exc:
            result["errors"].append(str(exc))
            ckpt.save(step)  # the failure is behind it: the same save again works
    ckpt.wait()
    result["folders"] = sorted(p.name for p in Path(args["directory"]).iterdir())
    return result


def bad_saves(out: Path, args: dict[str, Any]) -> dict[str, Any]:
    """Two mistakes in turn: the ranks save different steps; then every rank but rank 1 saves (with two ranks:
    `if rank == 0:`; with three, rank 0 must still hear rank 2, which came after the rank that did not)."""
    import torch.distributed as dist
    from torch import nn

    from hpctrain import task
    from hpctrain.errors import CheckpointError

    if dist.get_rank() == 1:
        time.sleep(args.get("late_s", 0))  # builds its checkpointer later than rank 0, by more than timeout_s
    ckpt = task.Checkpointer(args["directory"], timeout_s=args["timeout_s"], model=nn.Linear(3, 2))
    result: dict[str, Any] = {}
    try:
        ckpt.save(5 + dist.get_rank())
    except CheckpointError as exc:
        result["different_steps"] = str(exc)
    started = time.monotonic()
    if dist.get_rank() != 1:
        try:
            ckpt.save(1)
        except CheckpointError as exc:
            result["alone"] = str(exc)
    else:
        time.sleep(args["timeout_s"] + 5)  # busy elsewhere, never saving
    result["seconds"] = time.monotonic() - started
    folder = Path(args["directory"])
    result["folders"] = sorted(p.name for p in folder.iterdir()) if folder.exists() else []
    return result


class Counter:
    """A per-rank Stateful: its value differs on every rank."""

    def __init__(self, value: int) -> None:
        self.value = value

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.value = state["value"]


def timed_loop(out: Path, args: dict[str, Any]) -> dict[str, Any]:
    """Your own DDP loop lapping a task.StepTimer, rank ``slow_rank``'s backward slowed by ``slow_s`` (a
    backward hook on its last layer); this rank's heartbeat as its monitor would write it."""
    import time as clock

    import torch
    from torch import nn

    from hpctrain import task
    from hpctrain.runtime import heartbeat

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
    if task.context().rank == args["slow_rank"]:
        module[-1].register_full_backward_hook(lambda layer, grad_in, grad_out: clock.sleep(args["slow_s"]))
    model = task.ddp(module)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    timer = task.StepTimer(model)
    for _ in range(args["steps"]):
        timer.lap("data")
        loss = model(torch.randn(32, 64)).square().mean()
        timer.lap("forward")
        loss.backward()
        timer.backward_done()
        optimizer.step()
        optimizer.zero_grad()
        timer.lap("optimizer")
        timer.step_done()
    return {"heartbeat": heartbeat.recorder().snapshot()}


SCENARIOS: dict[str, Callable[[Path, dict[str, Any]], dict[str, Any]]] = {
    "timed_loop": timed_loop,
    "save_sharded": save_sharded,
    "load_sharded": load_sharded,
    "bad_saves": bad_saves,
    "async_copy_fails": async_copy_fails,
    "async_saves": async_saves,
}


def rank_main() -> None:
    _run_scenario(sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3]))


def _run_scenario(scenario: str, out: Path, args: dict[str, Any]) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        result = SCENARIOS[scenario](out, args)
        (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    rank_main()
