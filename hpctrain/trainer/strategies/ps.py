"""``ps``: a DistBelief-style parameter server over ``torch.distributed.rpc`` (TensorPipe over TCP).

The first ``trainer.ps.servers`` ranks are servers ("server-0", ...), each
owning a shard of the parameters and its SGD state (:mod:`ps_server`); the
other ranks are workers ("worker-0", ...) that train on their shard of the
train set (sharded over the workers only), push gradients and take the fresh
parameters from the reply. Every rank runs the trainer's loop: a worker's
optimizer step is a no-op (its gradients are handed to the servers before
it), a server's step waits for the workers' round of pushes. So stop
agreement, validation and checkpoints work as for ddp, on the gloo process
group that the runtime already forms.

Checkpoints hold the whole model in the usual format (loadable by any
strategy): before saving, every rank takes each parameter from its server and
BatchNorm buffers from worker 0 (:meth:`ParameterServer.sync_model`), and the
servers' optimizer shards are gathered into one SGD state on rank 0 (server 0),
which writes. A resume re-shards: every server takes its parameters'
momentum from the full state. Workers keep their own BatchNorm statistics
between validations; validation and checkpoints use worker 0's, and every rank
adopts them there.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import rpc

from hpctrain.errors import DistributedSetupError, TrainingConfigError
from hpctrain.runtime.master import second_port
from hpctrain.trainer.optim import build_optimizer, build_scheduler
from hpctrain.trainer.strategies import ps_server
from hpctrain.trainer.strategies.base import EpochHost, Strategy
from hpctrain.trainer.strategies.collectives import distributed

if TYPE_CHECKING:
    from hpctrain.jobspec.models import JobSpec
    from hpctrain.runtime.context import TaskEnv
    from hpctrain.trainer.strategies.base import EpochWorkers

log = logging.getLogger(__name__)


class ParameterServer(Strategy):
    name = "ps"

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.servers = spec.trainer.ps.servers
        self.mode = spec.trainer.ps.mode
        self.timeout_s = float(spec.distributed.timeout_s)
        self.env: TaskEnv | None = None
        self.owner: list[int] = []  # server of each parameter, in module.parameters() order
        self.params: list[nn.Parameter] = []
        self.versions: list[int] = []  # per server: the version of the parameters this worker holds
        self.shard: ps_server.ShardServer | None = None
        self.template: torch.optim.Optimizer | None = None  # the trainer's full-model optimizer (checkpoint layout)
        self.summary: dict[str, Any] | None = None
        self.module: nn.Module | None = None
        self.trainer_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self._grads: list[torch.Tensor] = []
        self._rpc_up = False

    @classmethod
    def from_spec(cls, spec: JobSpec) -> ParameterServer:
        return cls(spec)

    # -- roles -------------------------------------------------------------------------------------------------
    @property
    def workers(self) -> int:
        return self.world_size - self.servers

    @property
    def world_size(self) -> int:
        return self.env.world_size if self.env is not None else self.servers + 1

    @property
    def rank(self) -> int:
        return self.env.global_rank if self.env is not None else 0

    @property
    def is_server(self) -> bool:
        return self.rank < self.servers

    @property
    def worker_index(self) -> int:
        return self.rank - self.servers

    def check(self, env: TaskEnv, device: torch.device) -> None:
        if env.world_size <= self.servers:
            raise TrainingConfigError(
                f"trainer.ps.servers: {self.servers} server(s) leave no worker among this job's "
                f"{env.world_size} task(s)",
                hint=f"run at least {self.servers + 1} tasks, or set trainer.ps.servers lower",
            )
        if device.type != "cpu":
            raise TrainingConfigError(
                f"trainer.strategy: ps runs on CPU tasks, but this task trains on {device}",
                hint="set resources.gpus_per_node: 0, or use trainer.strategy: ddp on GPUs",
            )
        super().check(env, device)
        self.env = env
        self.loads_data = not self.is_server

    def train_shard(self, env: TaskEnv) -> tuple[int, int] | None:
        """Workers shard the train set among themselves; a server's (unread) shard is worker 0's."""
        workers = env.world_size - self.servers
        return (max(0, env.global_rank - self.servers), max(1, workers))

    # -- set-up ------------------------------------------------------------------------------------------------
    def wrap(self, module: nn.Module, device: torch.device) -> nn.Module:
        self.module = module
        self.params = list(module.parameters())
        if self.servers > len(self.params):
            raise TrainingConfigError(
                f"trainer.ps.servers: {self.servers} servers, but {self.spec.trainer.arch} has only "
                f"{len(self.params)} parameter tensors (servers own whole tensors)",
                hint=f"set trainer.ps.servers to at most {len(self.params)}",
            )
        self.owner = ps_server.shard_parameters([p.numel() for p in self.params], self.servers)
        self.versions = [0] * self.servers
        return module

    def attach(
        self,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        steps_per_epoch: int,
    ) -> None:
        """Build this server's shard optimizer and schedule, then join the RPC group."""
        self.template, self.trainer_scheduler = optimizer, scheduler
        if self.is_server:
            self.shard = self._build_shard(steps_per_epoch)
        ps_server.serve(self.shard)
        self._start_rpc()

    def _build_shard(self, steps_per_epoch: int) -> ps_server.ShardServer:
        cfg = self.spec.trainer
        mine = [p for p, owner in zip(self.params, self.owner, strict=True) if owner == self.rank]
        # sync applies one averaged step per global batch (ddp's rate); async one per worker's batch.
        batch = cfg.batch_size * (self.workers if self.mode == "sync" else 1)
        optimizer = build_optimizer(self.module, cfg, batch, only={id(p) for p in mine})
        scheduler = build_scheduler(optimizer, cfg, steps_per_epoch)
        log.info(
            "parameter server %d of %d: %d tensors, %d values (%s mode, %d workers)",
            self.rank,
            self.servers,
            len(mine),
            sum(p.numel() for p in mine),
            self.mode,
            self.workers,
        )
        return ps_server.ShardServer(
            mine,
            optimizer,
            scheduler,
            workers=self.workers,
            mode=self.mode,
            max_staleness=self.spec.trainer.ps.max_staleness,
        )

    def _start_rpc(self) -> None:
        env = self.env
        if env is None:
            raise RuntimeError("ParameterServer.check(env, device) must run before attach()")
        name = f"server-{self.rank}" if self.is_server else f"worker-{self.worker_index}"
        chosen = self.spec.distributed.master_port is not None
        port = second_port(env.master_port, chosen=chosen)  # the RPC group's: never a nearby job's master port
        options = rpc.TensorPipeRpcBackendOptions(
            init_method=f"tcp://{env.master_addr}:{port}",
            rpc_timeout=self.timeout_s,
            _transports=["uv"],  # TCP, also between tasks of one node
            _channels=["basic"],
        )
        try:
            rpc.init_rpc(name, rank=env.global_rank, world_size=env.world_size, rpc_backend_options=options)
        except RuntimeError as exc:
            raise DistributedSetupError(
                f"{name} could not join the parameter-server RPC group at {env.master_addr}:{port}: {exc}",
                hint=f"port {port} ({'distributed.master_port + 1' if chosen else 'derived from the master port'}) "
                "must be free on rank 0's node and reachable from every node; distributed.master_port chooses both",
            ) from exc
        self._rpc_up = True

    def epoch_workers(self, host: EpochHost) -> EpochWorkers | None:
        self.summary = host.summary  # rank 0 (server 0) reports its rejected pushes there
        return None

    # -- the step --------------------------------------------------------------------------------------------
    def after_backward(self, module: nn.Module) -> None:
        """Keep the gradients for the servers and clear them, so the local optimizer step changes nothing."""
        self._grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        for param in self.params:
            param.grad = None

    def after_step(self, sums: torch.Tensor) -> None:
        """Push this step's gradients to every server; the replies are the fresh parameters."""
        by_server: list[list[int]] = [[] for _ in range(self.servers)]
        for index, owner in enumerate(self.owner):
            by_server[owner].append(index)
        report = sums.detach().to("cpu", torch.float64) if self.worker_index == 0 else None
        futures = [
            rpc.rpc_async(
                f"server-{server}",
                ps_server.push,
                args=(self.worker_index, self.versions[server], [self._grads[i] for i in indices], report),
            )
            for server, indices in enumerate(by_server)
        ]
        with torch.no_grad():
            for server, (indices, future) in enumerate(zip(by_server, futures, strict=True)):
                version, values = future.wait()
                self.versions[server] = version
                for index, value in zip(indices, values, strict=True):
                    self.params[index].copy_(value)
        self._grads = []

    def serve_step(self) -> torch.Tensor:
        if self.shard is None:
            raise RuntimeError("serve_step on a task that is not a parameter server")
        sums = self.shard.wait_round(self.timeout_s)
        if self.template is not None:  # the trainer logs its optimizer's rate: show the one the servers apply
            for group in self.template.param_groups:
                group["lr"] = self.shard.optimizer.param_groups[0]["lr"]
        if self.summary is not None and self.mode == "async":
            self.summary["ps_rejected_pushes"] = self.shard.rejected
        return sums

    # -- whole model on every rank ---------------------------------------------------------------------------
    @torch.no_grad()
    def sync_model(self, module: nn.Module) -> None:
        """Every parameter from its server, every buffer from worker 0. Collective."""
        if not distributed():
            return
        for server in range(self.servers):
            _broadcast([p for p, o in zip(self.params, self.owner, strict=True) if o == server], src=server)
        _broadcast(list(module.buffers()), src=self.servers)

    def state_parts(self) -> dict[str, Any]:
        return {"optimizer": _ShardedOptimizer(self), "scheduler": _ServerSchedule(self)}

    def close(self, *, failed: bool) -> None:
        if self._rpc_up:
            self._rpc_up = False
            try:
                rpc.shutdown(graceful=not failed)
            except Exception as exc:  # a failed peer must not hide the error that ended the run
                log.warning("rpc shutdown: %s", exc)
        ps_server.serve(None)


class _ShardedOptimizer:
    """Checkpoint part: the servers' optimizer shards as one SGD state of the whole model (rank 0's)."""

    def __init__(self, ps: ParameterServer) -> None:
        self.ps = ps

    def _index(self) -> dict[int, int]:
        """Parameter id -> index in the full optimizer's state (its groups' order)."""
        groups = self.ps.template.param_groups if self.ps.template is not None else []
        return {id(p): i for i, p in enumerate(p for g in groups for p in g["params"])}

    def state_dict(self) -> dict[str, Any] | None:
        """Collective: gathered to rank 0 (server 0); None elsewhere."""
        ps, mine, lr = self.ps, {}, None
        if ps.shard is not None:
            index = self._index()
            for param in ps.shard.params:
                buffer = ps.shard.optimizer.state.get(param, {}).get("momentum_buffer")
                if buffer is not None:
                    mine[index[id(param)]] = buffer.detach().clone()
            lr = ps.shard.optimizer.param_groups[0]["lr"]
        gathered: list[Any] | None = [None] * dist.get_world_size() if ps.rank == 0 else None
        dist.gather_object((mine, lr), gathered, dst=0)
        if gathered is None:
            return None
        full = ps.template.state_dict()
        for group in full["param_groups"]:
            group["lr"] = gathered[0][1]
        buffers = {i: b for shard, _ in gathered for i, b in shard.items()}
        full["state"] = {i: {"momentum_buffer": buffers[i]} for i in sorted(buffers)}
        return full

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Each server takes the momentum of its own parameters; the rate comes from the full state."""
        ps = self.ps
        if ps.shard is None:
            return
        index, saved = self._index(), state.get("state", {})
        for param in ps.shard.params:
            entry = saved.get(index[id(param)])
            if entry is not None and entry.get("momentum_buffer") is not None:
                ps.shard.optimizer.state[param]["momentum_buffer"] = entry["momentum_buffer"].clone()
        for group in ps.shard.optimizer.param_groups:
            group["lr"] = state["param_groups"][0]["lr"]


class _ServerSchedule:
    """Checkpoint part: server 0's schedule (every server steps it alike); workers follow it for their logs."""

    def __init__(self, ps: ParameterServer) -> None:
        self.ps = ps

    def state_dict(self) -> dict[str, Any] | None:
        shard = self.ps.shard
        return shard.scheduler.state_dict() if shard is not None else None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.ps.shard is not None:
            self.ps.shard.scheduler.load_state_dict(state)
        if self.ps.trainer_scheduler is not None:
            self.ps.trainer_scheduler.load_state_dict(state)


@torch.no_grad()
def _broadcast(tensors: list[torch.Tensor], *, src: int) -> None:
    """Broadcast ``tensors`` from rank ``src`` in one flat buffer per dtype."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    for group in by_dtype.values():
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        dist.broadcast(flat, src=src)
        offset = 0
        for tensor in group:
            tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()
